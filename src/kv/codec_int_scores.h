// Integer-codec Scores with integer dot products: the scalar reference twins
// of the SIMD kernel in codec_int_scores-inl.h. Internal to the kv layer.
//
// An integer codec's Scores quantizes each query head per group of the
// codec's group size G, as llama.cpp quantizes q to q8_0 for its q4_0 keys:
//   qs = f32(absmax of the group / 127), inv = qs != 0 ? f32(1 / qs) : 0,
//   q8_i = clamp(round_half_even(f32(q_i * inv)), -127, 127),
// and computes, per row t and group g with codes u, scale s and min m
// (codec.h), the exact integer dot I = sum_i q8_i * u_i, then
//   sym:  score += qs * s * (I - 2^(B-1) * Q)     Q = sum_i q8_i (per head, group)
//   asym: score += qs * (s * I + m * Q)
// which is exactly sum_i (qs * q8_i) * x^_i: the dot of the decoded row with
// the quantized query. Its distance from the f32-query dot is at most
// sum_i (qs/2 + 3 eps |q_i|) * |x^_i| per group (derived in
// tests/kv/codec_int_scores_test.cc).
#pragma once

#include <cstdint>

#include "kv/codec_formats.h"

namespace kvq::codec {

// Largest |q8|: 127, not 128, so a negated code never overflows and the
// scale is symmetric (llama.cpp's q8_0 convention).
inline constexpr int kQueryMax = 127;

// One query head -> q8: [dim], qscale and qsum: [dim / group].
void QuantizeQueryRef(const float* q, int64_t dim, int64_t group, int8_t* q8, float* qscale,
                      int32_t* qsum);

// The SIMD twin of QuantizeQueryRef (same outputs, bit for bit).
void QuantizeQuery(const float* q, int64_t dim, int64_t group, int8_t* q8, float* qscale,
                   int32_t* qsum);

// sum over group g's elements of q8_i * u_i, u the row's unsigned codes.
int32_t IntGroupDotRef(const IntFormat& f, const uint8_t* row, const int8_t* q8, int64_t g);

// The reference Scores of an integer codec (the definition above, in double
// after the exact integer dots). q: [heads, dim]; scores[h * stride + t].
void IntScoresRef(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n, const float* q,
                  int64_t heads, float scale, float* scores, int64_t stride);

// The SIMD kernel's integer stage alone, for exactness tests: q8: [heads,
// dim] already quantized; dots[(h * n + t) * groups + g] = IntGroupDotRef.
void IntGroupDots(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n, const int8_t* q8,
                  int64_t heads, int32_t* dots);

}  // namespace kvq::codec
