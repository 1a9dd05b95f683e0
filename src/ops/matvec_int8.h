// Integer-dot matrix-vector products for block-quantized weights, ggml's
// decode arithmetic: the activation row x is quantized once per product to
// 8 bits in the block format ggml pairs with the weight type (its
// vec_dot_type), then each weight block meets its activation block in an
// exact integer dot product, scaled in f32.
//
//   weights                          activations
//   Q4_0 Q5_0 Q8_0 IQ4_NL            Q8_0: 32 values, f16 d, int8 q
//   Q4_1 Q5_1                        Q8_1: as Q8_0 plus f16 s = d * sum(q)
//   Q2_K Q3_K Q4_K Q5_K Q6_K         Q8_K: 256 values, f32 d, int8 q, int16
//                                          sums of each 16 q (bsums)
//
// Results differ from the exact f32 path (matvec.h) by the 8-bit rounding
// of x, as llama.cpp's do; matmul.h's DecodeArith chooses between them.
#pragma once

#include <cmath>
#include <cstdint>

#include "base/thread_pool.h"
#include "ops/weights.h"

namespace kvq::ops {

// ggml's block_q8_1 and block_q8_K, byte for byte.
struct BlockQ8_1 {
  uint16_t d;  // f16 bits of amax / 127
  uint16_t s;  // f16 bits of d * sum(qs), with d in f32
  int8_t qs[kQBlock];
};
struct BlockQ8_K {
  float d;  // 1 / (-127 / max), max the signed value of largest magnitude
  int8_t qs[kQKBlock];
  int16_t bsums[kQKBlock / 16];  // sums of each 16 consecutive qs
};
static_assert(sizeof(BlockQ8_1) == 36, "must match ggml's block_q8_1");
static_assert(sizeof(BlockQ8_K) == 292, "must match ggml's block_q8_K");

// A rounded quant to int8. Finite blocks never leave [-127, 127]; inf and
// NaN (a non-finite x, or 1 / d overflowing for a subnormal block) give 0,
// what ggml's x86 float-to-int conversion leaves there, without the
// undefined cast.
inline int8_t RoundToQ8(float rounded) {
  return std::fabs(rounded) < 128.0f ? static_cast<int8_t>(rounded) : int8_t{0};
}

// One block of 32 values as ggml's q8_0 and q8_1 store them: q = round(x / d)
// half away from zero, d = max |x| / 127. Returns d (f32, before its f16
// rounding).
inline float QuantizeBlockQ8(const float* x, int8_t* q) {
  float amax = 0.0f;
  for (int64_t j = 0; j < kQBlock; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int64_t j = 0; j < kQBlock; ++j) q[j] = RoundToQ8(std::round(x[j] * id));
  return d;
}

// Bit-exact with ggml's quantize_row_q8_1_ref / quantize_row_q8_K_ref for
// finite x (QuantizeRowQ8_0 in weights.h is the Q8_0 one). Q8_1 rounds
// x / d half away from zero (roundf), Q8_K to nearest even (ggml's
// nearest_int), clamped to 127. n is a multiple of the block size.
void QuantizeRowQ8_1(const float* x, int64_t n, BlockQ8_1* out);
void QuantizeRowQ8_K(const float* x, int64_t n, BlockQ8_K* out);

enum class ActQuant : uint8_t { kNone, kQ8_0, kQ8_1, kQ8_K };

// The activation format of `type`'s integer dot; kNone for F32/F16/BF16,
// which have no integer path.
ActQuant Int8ActQuant(WeightType type);
inline bool HasInt8Dot(WeightType type) { return Int8ActQuant(type) != ActQuant::kNone; }

// Bytes of one quantized activation row of `cols` values for `type`.
int64_t Int8ActRowBytes(WeightType type, int64_t cols);

// acts[n rows of Int8ActRowBytes] = x[n, cols] quantized for `type`.
void QuantizeActs(WeightType type, const float* x, int64_t n, int64_t cols, uint8_t* acts);

// y[n, w.rows] = W · acts (n quantized rows of w.cols values, from
// QuantizeActs(w.type, ...)). HasInt8Dot(w.type) must hold. Rows are split
// over the pool's threads. AVX2 and up use SIMD integer dot
// products (AVX-512 VNNI where present); other targets run the scalar twin.
void MatvecInt8(const WeightView& w, const uint8_t* acts, int64_t n, float* y, ThreadPool& pool);

// Scalar twin of MatvecInt8 for one activation row: the same exact integer
// sums per block (int32) and the same f32 scale products (weight scale times
// activation scale, one f32 rounding each), summed in double. If abs_terms
// is not null, abs_terms[r] = sum over blocks of |scale product| * (sum of
// |integer products|) + |min terms|: the magnitude the tests' f32 rounding
// bound scales with.
void MatvecInt8Ref(const WeightView& w, const uint8_t* acts, float* y, double* abs_terms);

}  // namespace kvq::ops
