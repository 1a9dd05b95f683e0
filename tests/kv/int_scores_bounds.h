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

}  // namespace kvq::int_scores_bounds
