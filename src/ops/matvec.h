// Matrix-vector products for decode, and row decoding, over every
// WeightType. Fast versions are Highway SIMD with runtime dispatch; each has
// a scalar *Ref twin that is the truth the tests compare against.
#pragma once

#include <cstdint>

#include "ops/weights.h"

namespace kvq::ops {

// y[w.rows] = W[w.rows, w.cols] · x[w.cols], f32 accumulation.
// Rows are split into contiguous ranges over `num_threads` OpenMP threads
// (1 = run on the calling thread). x and y must not overlap.
//
// Q8_0 keeps x in f32 and decodes W on the fly (d * q, exact in f32, then an
// FMA with x) instead of quantizing x to int8 as ggml's q8_0 x q8_0
// vec_dot does. Decode is bound by reading W (34 bytes per 32 weights), and
// the int8-to-f32 widening hides under that read, so an int8 x would buy
// little speed while adding a second quantization error (x rounded to 8
// bits) that would make results differ from the f32 model. Consequence for
// conformance: kvq Q8_0 logits are slightly closer to f32 than llama.cpp's.
void Matvec(const WeightView& w, const float* x, float* y, int num_threads);

// Batched products without BLAS: y[n, w.rows] = x[n, w.cols] · Wᵀ. Tiles of
// 4 rows x up to 4 tokens; each 4-row slice of W is decoded from memory once
// per 64 tokens and reused from L1 for all of them. Same error bound and
// threading as Matvec (whose n = 1 case it is). Matmul routes non-f32
// weights here; see matmul.h for the measurements behind that.
void MatvecBatch(const WeightView& w, const float* x, int64_t n, float* y, int num_threads);

// Same contract as Matvec, scalar, double accumulation, weights decoded by
// DequantizeRowRef.
void MatvecRef(const WeightView& w, const float* x, float* y);

// out[count, w.cols] = rows [first, first + count) of w decoded to f32.
// Exact (every supported type converts to f32 without rounding), so it is
// bit-identical to DequantizeRowRef.
void DequantizeRows(const WeightView& w, int64_t first, int64_t count, float* out);

// Token embedding lookup: out[n, table.cols] = rows ids[n] of table.
// ids must lie in [0, table.rows); the model layer validates token ids.
void Embed(const WeightView& table, const int32_t* ids, int64_t n, float* out);
void EmbedRef(const WeightView& table, const int32_t* ids, int64_t n, float* out);

}  // namespace kvq::ops
