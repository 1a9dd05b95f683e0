// Error bounds of the integer codecs' Scores (codec_int_scores.h), shared by
// the kv tests. Derivations next to each function.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/fp16.h"
#include "kv/codec_int_scores.h"

namespace kvq::int_scores_bounds {

// f32 unit roundoff, and the smallest positive subnormal.
inline constexpr double kEps = 1.0 / (1 << 24);
inline constexpr double kTinyAbs = 1.401298464324817e-45;

inline double Gamma(double k) { return k * kEps / (1.0 - k * kEps); }

// The parts of the integer-path score of (head, row), from the reference
// quantization: sum over groups of |qs s (I - c Q)| (sym) or |qs s I| +
// |qs m Q| (asym): the magnitudes the f32 epilogue rounds.
inline double EpilogueMagnitude(const codec::IntFormat& f, int64_t dim, const uint8_t* row,
                                const float* q) {
  const int64_t groups = f.Groups(dim);
  std::vector<int8_t> q8(dim);
  std::vector<float> qs(groups);
  std::vector<int32_t> qsum(groups);
  codec::QuantizeQueryRef(q, dim, f.group, q8.data(), qs.data(), qsum.data());
  const size_t code_bytes = f.CodeBytes(dim);
  double total = 0.0;
  for (int64_t g = 0; g < groups; ++g) {
    uint16_t sb, mb = 0;
    std::memcpy(&sb, row + code_bytes + 2 * g, 2);
    if (!f.symmetric) std::memcpy(&mb, row + code_bytes + 2 * (groups + g), 2);
    const double dot = codec::IntGroupDotRef(f, row, q8.data(), g);
    const double s = F16ToF32(sb), m = F16ToF32(mb);
    if (f.symmetric) {
      total += std::fabs(qs[g] * s * (dot - f.Levels() / 2 * static_cast<double>(qsum[g])));
    } else {
      total += std::fabs(qs[g] * s * dot) + std::fabs(qs[g] * m * qsum[g]);
    }
  }
  return total;
}

// SIMD vs reference: both compute the same exact integers. The SIMD path then
// rounds per group s * qs (and qs * Q) once and adds each term with one fused
// rounding (2 * groups terms), then multiplies by `scale`; the reference
// rounds once from double. So |fast - ref| <= gamma_(2G + 3) * |scale| * the
// epilogue magnitude. An underflowing s * qs (tiny rows) loses at most half a
// subnormal, later multiplied by |I| < 2^23: 2^23 * kTinyAbs per term.
inline double EpilogueBound(const codec::IntFormat& f, int64_t dim, const uint8_t* row,
                            const float* q, float scale) {
  const double groups = static_cast<double>(f.Groups(dim));
  return Gamma(2 * groups + 3) * std::fabs(scale) * EpilogueMagnitude(f, dim, row, q) +
         2 * groups * std::ldexp(kTinyAbs, 23) * std::fabs(scale) + 4 * kTinyAbs;
}

// Integer path vs the f32-query dot of the decoded row x^ (double). The
// integer path equals sum_i qs q8_i (s u_i + m) exactly before its f32
// epilogue, and (QueryQuantization test) |qs q8_i - q_i| <= qs/2 + 3 eps |q_i|;
// Decode rounds s u + m once (eps |x^|) while the integer path uses it exact,
// and |qs q8_i| <= |q_i| + qs. So |int - f32q| <= |scale| * sum_i [(qs/2 +
// 3 eps |q_i|) |x^_i| + eps (|q_i| + qs) |x^_i|] + the epilogue bound.
inline double QuantizationBound(const codec::IntFormat& f, int64_t dim, const float* x,
                                const float* q, float scale) {
  const int64_t groups = f.Groups(dim);
  std::vector<int8_t> q8(dim);
  std::vector<float> qs(groups);
  std::vector<int32_t> qsum(groups);
  codec::QuantizeQueryRef(q, dim, f.group, q8.data(), qs.data(), qsum.data());
  double total = 0.0;
  for (int64_t i = 0; i < dim; ++i) {
    const double step = qs[i / f.group], a = std::fabs(static_cast<double>(q[i]));
    total += (step / 2 + 3 * kEps * a + kEps * (a + step)) * std::fabs(x[i]);
  }
  return std::fabs(scale) * total;
}

// Per-channel tiles (codec_channel.cc): the integer path computes
// scale * (b + sum_g qs_g I_g) with q' = f32(q s) quantized per 32 channels
// and b = sum_c q_c o_c in f32. Against the f32-query dot of the decoded rows
// x^ = f32(u s + o), with u_c <= 2^B - 1 = U:
//   q8 quantization: |qs q8_c - q'_c| <= qs/2 + 3 eps |q'_c| (as above), times u_c;
//   q' rounding: |q'_c - q_c s_c| <= eps |q'_c| / (1 - eps), times u_c;
//   Decode's rounding: eps |q_c x^_c|;
//   epilogue: b is a dim-term f32 dot, then one fused add per group and the
//   multiply by scale: gamma_(dim + groups + 2) * (sum |q_c o_c| +
//   sum_c (|q'_c| + qs) U), |qs q8_c| <= |q'_c| + qs.
// (ChannelScoreBound below.) tile: the tile's parameter bytes ([dim f16
// scales][dim f16 mins if asym]).
//
// What both bounds need from one tile and query head: q' = f32(q s), the
// offsets o and the q8 steps qs per 32 channels, as the codec makes them.
struct ChannelQuery {
  std::vector<float> q_scaled, qs;  // [dim], [dim / 32]
  std::vector<double> o;            // [dim]
  double levels_max = 0;            // U = 2^B - 1
};
inline ChannelQuery MakeChannelQuery(int bits, bool symmetric, int64_t dim, const uint8_t* tile,
                                     const float* q) {
  constexpr int64_t kGroup = 32;
  ChannelQuery cq;
  cq.levels_max = static_cast<double>((1 << bits) - 1);
  cq.q_scaled.resize(dim);
  cq.o.resize(dim);
  for (int64_t c = 0; c < dim; ++c) {
    uint16_t sb, mb = 0;
    std::memcpy(&sb, tile + 2 * c, 2);
    if (!symmetric) std::memcpy(&mb, tile + 2 * (dim + c), 2);
    const float s = F16ToF32(sb);
    cq.q_scaled[c] = q[c] * s;
    cq.o[c] = symmetric ? -static_cast<double>(1 << (bits - 1)) * s : F16ToF32(mb);
  }
  std::vector<int8_t> q8(dim);
  std::vector<int32_t> qsum(dim / kGroup);
  cq.qs.resize(dim / kGroup);
  codec::QuantizeQueryRef(cq.q_scaled.data(), dim, kGroup, q8.data(), cq.qs.data(), qsum.data());
  return cq;
}

// The epilogue's rounding: gamma_(k) * |scale| * magnitude (+ underflow).
inline double ChannelEpilogue(const ChannelQuery& cq, const float* q, float scale, double k) {
  const int64_t dim = static_cast<int64_t>(cq.o.size());
  double magnitude = 0.0;
  for (int64_t c = 0; c < dim; ++c) {
    magnitude += std::fabs(q[c] * cq.o[c]) +
                 (std::fabs(static_cast<double>(cq.q_scaled[c])) + cq.qs[c / 32]) * cq.levels_max;
  }
  const double groups = static_cast<double>(dim / 32);
  return Gamma(k) * std::fabs(scale) * magnitude +
         (static_cast<double>(dim) + 2 * groups) * std::ldexp(kTinyAbs, 23) * std::fabs(scale) +
         4 * kTinyAbs;
}

inline double ChannelScoreBound(int bits, bool symmetric, int64_t dim, const uint8_t* tile,
                                const float* x, const float* q, float scale) {
  const ChannelQuery cq = MakeChannelQuery(bits, symmetric, dim, tile, q);
  double quant = 0.0;
  for (int64_t c = 0; c < dim; ++c) {
    const double step = cq.qs[c / 32], a = std::fabs(static_cast<double>(cq.q_scaled[c]));
    quant += (step / 2 + 3 * kEps * a + 2 * kEps * a) * cq.levels_max +
             kEps * std::fabs(static_cast<double>(q[c]) * x[c]);
  }
  return std::fabs(scale) * quant +
         ChannelEpilogue(cq, q, scale, static_cast<double>(dim + dim / 32 + 2));
}

// Per-channel SIMD vs reference twin: both compute the same q', q8, qscale
// and integer dots; they differ only in the f32 epilogue (the SIMD path sums
// b in f32 and adds qscale_g * I_g with one fused rounding per group; the
// reference works in double and rounds once), so |fast - ref| <=
// gamma_(dim + groups + 3) * |scale| * the epilogue magnitude above.
inline double ChannelEpilogueBound(int bits, bool symmetric, int64_t dim, const uint8_t* tile,
                                   const float* q, float scale) {
  const ChannelQuery cq = MakeChannelQuery(bits, symmetric, dim, tile, q);
  return ChannelEpilogue(cq, q, scale, static_cast<double>(dim + dim / 32 + 3));
}

}  // namespace kvq::int_scores_bounds
