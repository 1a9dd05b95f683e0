// One step of the online (streaming) softmax that fused attention runs block
// by block: the running max and sum of one query row are updated with a new
// block of scores, and the row's unnormalized output accumulator is rescaled
// when the max grows, so the final output is acc / sum. Highway SIMD with a
// scalar Ref twin.
#pragma once

#include <cstdint>

namespace kvq {

// p[count]: scores in, exp(score - new max) out (count >= 1, finite scores).
// *max, *sum: the running max (start at -inf) and sum (start at 0).
// acc[dim]: multiplied by exp(old max - new max) when the max grows.
void OnlineSoftmaxStep(float* p, int64_t count, float* max, float* sum, float* acc, int64_t dim);
void OnlineSoftmaxStepRef(float* p, int64_t count, float* max, float* sum, float* acc, int64_t dim);

}  // namespace kvq
