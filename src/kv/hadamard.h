// Per-head orthonormal Walsh-Hadamard rotation (QuaRot-style) applied to K,
// q and V rows before encoding; spreads outlier channels across the row.
// (Minimal version so the paged cache builds; the codecs branch owns this file.)
#pragma once

#include <cstdint>

namespace kvq {

// x: [n, dim], dim a power of two. Rotate multiplies each row by H / sqrt(dim);
// H is symmetric and (H / sqrt(dim))^2 = I, so Unrotate is the same transform.
void HadamardRotate(float* x, int64_t n, int64_t dim);
void HadamardUnrotate(float* x, int64_t n, int64_t dim);

}  // namespace kvq
