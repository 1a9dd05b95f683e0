// Matrix-vector products for decode, and row decoding, over every
// WeightType. Fast versions are Highway SIMD with runtime dispatch; each has
// a scalar *Ref twin that is the truth the tests compare against.
#pragma once

#include <cstdint>

#include "base/thread_pool.h"
#include "ops/weights.h"

namespace kvq::ops {

// y[w.rows] = W[w.rows, w.cols] · x[w.cols], f32 accumulation.
// Rows are split into contiguous ranges over the pool's threads (a pool of
// 1 runs on the calling thread). x and y must not overlap.
//
// Every block type keeps x in f32 and decodes W on the fly, bit-exactly
// (each weight is a * q + b with a * q exact in f32, one rounding, as
// ggml's dequantize_row_*; quant_decode-inl.h), then one FMA per weight and
// token. ggml instead quantizes x to 8 bits (q8_0 / q8_1 / q8_K) and uses
// integer dot products. Choice and measurements (this 2-vCPU Sapphire
// Rapids VM shared with other jobs; ops_bench MatvecL2 vs
// `kvq-llamacpp-harness vecdot`: one thread, thread CPU time, a 576 x 1536
// matrix resident in L2 so compute, not DRAM, sets the pace; Gweights/s,
// kvq f32-activation kernels vs ggml's native AVX-512 VNNI vec_dot; runs
// vary by 20-40% with the load on the sibling hyperthread, so compare
// rows of one run):
//   f16 14-15 vs 23, q8_0 11-12 vs 21-23, q4_0 10 vs 19, q4_1 8-9 vs 15-19,
//   q5_0 8.8 vs 13-16, q5_1 8 vs 16, iq4_nl 4 vs 16-17, q2_K 9-10 vs 29-31,
//   q3_K 3.8 vs 15, q4_K 7 vs 18, q5_K 6 vs 12-19, q6_K 6 vs 18-26.
// From DRAM (ops_bench Matvec at 896 x 4864, weights rotated past the
// caches, ratio to the interleaved read probe) f16 and q8_0 reach the probe
// (0.85-1.3), q4_0/q4_1 0.8-0.9, q5_0/q5_1 0.5-0.6, q4_K/q6_K 0.45-0.55,
// q2_K/q3_K/q5_K/iq4_nl 0.2-0.4 (before the last q5/q6_K speed-ups): the
// block types are compute-bound.
// Kept as the exact path: results depend only on W and x (the stored
// weights' f32 model), where llama.cpp's add an 8-bit rounding of x.
// The integer path (matvec_int8.h: x quantized once per product to q8_0 /
// q8_1 / q8_K, AVX-512 VNNI vpdpbusd) is the decode default on the types
// where it is faster (matmul.h, Int8DotIsFaster). One locked run on
// 2026-12-02 (this machine now an AMD EPYC with AVX-512 VNNI, faster than
// the VM above, load 8-12; ops_bench MatvecL2 / MatvecInt8L2, the latter
// including the quantization of x, beside `kvq-llamacpp-harness vecdot`;
// Gweights/s, f32 path / integer path / ggml):
//   q8_0 31.1 / 20.0 / 38.4, q4_0 20.8 / 19.5 / 34.3, q4_1 25.2 / 22.6 /
//   30.7, q5_0 20.7 / 18.9 / 29.5, q5_1 19.1 / 18.1 / 27.4, iq4_nl 3.3 /
//   22.1 / 30.7, q2_K 18.0 / 18.2 / 54.1, q3_K 7.8 / 10.9 / 33.3, q4_K
//   20.0 / 20.5 / 47.1, q5_K 15.8 / 12.1 / 33.0, q6_K 16.6 / 23.3 / 48.2.
// The integer kernels reached 0.4-0.7x ggml's: per block and row they did
// scalar work ggml vectorizes (the K-quants' 6-bit scale and min
// unpacking and min correction, each block's f16 scale), and 256-bit, not
// 512-bit, vectors. From DRAM (Matvec / MatvecInt8 at 896 x 4864 and
// 4864 x 896, one thread, vs_probe) the two paths are within 10% of each
// other except q6_K (0.58 f32 -> 0.66 integer) and q8_0 at 896 x 4864
// (0.93 -> 0.80). Since 2026-12-07 the K-quants unpack scales and mins
// with SIMD and take the scales in vpmaddwd (docs/benchmarks.md, "K-quant
// integer dot"): 1.8-2.6x faster, bit-identical, and 0.57-0.93x ggml's
// vec_dot in the same run (q4_K 22.4 vs 26.8, q6_K 19.9-21.0 vs 26.7,
// q5_K 18.1 vs 19.6, q3_K 11.5 vs 20.3 Gweights/s; a 2.3 GHz Xeon VM).
void Matvec(const WeightView& w, const float* x, float* y, ThreadPool& pool);

// Batched products without BLAS: y[n, w.rows] = x[n, w.cols] · Wᵀ. Tiles of
// 4 rows x up to 4 tokens; each 4-row slice of W is decoded from memory once
// per 64 tokens and reused from L1 for all of them. Same error bound and
// threading as Matvec (whose n = 1 case it is). Matmul routes non-f32
// weights here; see matmul.h for the measurements behind that.
void MatvecBatch(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool);

// Same contract as Matvec, scalar, double accumulation, weights decoded by
// DequantizeRowRef.
void MatvecRef(const WeightView& w, const float* x, float* y);

// out[count, w.cols] = rows [first, first + count) of w decoded to f32.
// Bit-identical to DequantizeRowRef for every type (the same single f32
// rounding where a type has one, e.g. Q4_1's d * q + m).
void DequantizeRows(const WeightView& w, int64_t first, int64_t count, float* out);

// Token embedding lookup: out[n, table.cols] = rows ids[n] of table.
// ids must lie in [0, table.rows); the model layer validates token ids.
void Embed(const WeightView& table, const int32_t* ids, int64_t n, float* out);
void EmbedRef(const WeightView& table, const int32_t* ids, int64_t n, float* out);

}  // namespace kvq::ops
