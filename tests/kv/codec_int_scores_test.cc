// Integer-codec Scores (integer dot products over an int8 query), on every
// compiled Highway target: query quantization SIMD == reference bit for bit,
// group dots SIMD == reference exactly, Scores SIMD == reference within the
// f32 rounding of the scaling (derived below), and Scores vs the f32-query
// dot of the decoded rows within the query-quantization bound (derived below).
//
// codec_int.cc opts in to Highway's AVX3_DL (VNNI) target; so does this
// file, so the target loop covers it too (before any Highway include).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#include "kv/codec_int_scores.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
#include "int_scores_bounds.h"
#include "kv/codec.h"

namespace kvq {
namespace {

using codec::IntFormat;

using int_scores_bounds::EpilogueBound;
using int_scores_bounds::kEps;
using int_scores_bounds::QuantizationBound;

std::vector<IntFormat> FormatsFor(int64_t dim) {
  std::vector<IntFormat> formats;
  for (int bits : {8, 4, 2}) {
    for (int64_t group : {32, 64, 128}) {
      if (dim % group != 0) continue;
      for (bool symmetric : {true, false}) formats.push_back({bits, group, symmetric});
    }
  }
  return formats;
}

enum class QueryKind { kNormal, kConstantGroups, kZeroGroup, kLarge, kOneSpike };

// q: [heads, dim].
std::vector<float> MakeQuery(QueryKind kind, int64_t heads, int64_t dim, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(heads * dim));
  for (size_t i = 0; i < q.size(); ++i) {
    switch (kind) {
      case QueryKind::kNormal:
        q[i] = normal(rng);
        break;
      case QueryKind::kConstantGroups:  // every element of a 32-group equal
        q[i] = i % 32 == 0 ? normal(rng) : q[i - 1];
        break;
      case QueryKind::kZeroGroup:  // the first 32 values of each head are 0
        q[i] = (i % dim) < 32 ? 0.0f : normal(rng);
        break;
      case QueryKind::kLarge:
        q[i] = normal(rng) * 1e4f;
        break;
      case QueryKind::kOneSpike:  // one value 1000x the rest in each head
        q[i] = (i % dim) == 5 ? 1000.0f : normal(rng) * 1e-3f;
        break;
    }
  }
  return q;
}

// x: [n, dim], values of the given magnitude plus a constant row and an
// outlier row, so groups with step 0 and with one huge value occur.
std::vector<float> MakeRows(int64_t n, int64_t dim, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(static_cast<size_t>(n * dim));
  for (float& v : x) v = normal(rng);
  if (n > 1) {
    for (int64_t i = 0; i < dim; ++i) x[dim + i] = 0.75f * sigma;
  }
  if (n > 2) x[2 * dim + 3] = 1000.0f * sigma;
  return x;
}

class IntScoresTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(IntScoresTest);

TEST_P(IntScoresTest, QueryQuantizationSimdEqualsReferenceAndIsWithinHalfAStep) {
  std::mt19937 rng(11);
  for (int64_t dim : {32, 64, 96, 128, 256}) {
    for (int64_t group : {32, 64, 128}) {
      if (dim % group != 0) continue;
      for (QueryKind kind : {QueryKind::kNormal, QueryKind::kConstantGroups, QueryKind::kZeroGroup,
                             QueryKind::kLarge, QueryKind::kOneSpike}) {
        const std::vector<float> q = MakeQuery(kind, 1, dim, rng);
        const int64_t groups = dim / group;
        std::vector<int8_t> q8(dim), ref_q8(dim);
        std::vector<float> qs(groups), ref_qs(groups);
        std::vector<int32_t> sum(groups), ref_sum(groups);
        codec::QuantizeQuery(q.data(), dim, group, q8.data(), qs.data(), sum.data());
        codec::QuantizeQueryRef(q.data(), dim, group, ref_q8.data(), ref_qs.data(), ref_sum.data());
        for (int64_t g = 0; g < groups; ++g) {
          ASSERT_EQ(qs[g], ref_qs[g]) << dim << " g " << g;
          ASSERT_EQ(sum[g], ref_sum[g]) << dim << " g " << g;
          int32_t check = 0;
          float absmax = 0.0f;
          for (int64_t i = g * group; i < (g + 1) * group; ++i) {
            absmax = std::fmax(absmax, std::fabs(q[i]));
          }
          for (int64_t i = g * group; i < (g + 1) * group; ++i) {
            ASSERT_EQ(q8[i], ref_q8[i]) << dim << " i " << i;
            ASSERT_LE(std::abs(q8[i]), codec::kQueryMax);
            check += q8[i];
            // q8 = round(fl(q * fl(1/qs))): |q8 - q*fl(1/qs)/(1+d2)| <= 1/2 and
            // fl(1/qs) = (1 + d1)/qs, so |qs * q8 - q| <= qs/2 + 3 eps |q|.
            const double err = std::fabs(static_cast<double>(qs[g]) * q8[i] - q[i]);
            ASSERT_LE(err, qs[g] / 2.0 + 3 * kEps * std::fabs(q[i])) << "i " << i;
            // The group's extreme is +-127 (within 3 eps of 127 before rounding).
            if (std::fabs(q[i]) == absmax && absmax > 0) {
              ASSERT_EQ(std::abs(q8[i]), 127);
            }
          }
          ASSERT_EQ(check, sum[g]);
          if (absmax == 0.0f) {
            ASSERT_EQ(qs[g], 0.0f);
          }
        }
      }
    }
  }
}

// Random code bytes (every code value, including the extremes) and random
// finite f16 parameters, n rows of the format.
std::vector<uint8_t> RandomRows(const IntFormat& f, int64_t dim, int64_t n, std::mt19937& rng,
                                bool extreme) {
  const size_t row_bytes = f.RowBytes(dim), code_bytes = f.CodeBytes(dim);
  std::vector<uint8_t> rows(row_bytes * static_cast<size_t>(n));
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t t = 0; t < n; ++t) {
    uint8_t* row = rows.data() + t * row_bytes;
    for (size_t b = 0; b < code_bytes; ++b)
      row[b] = extreme ? 0xFF : static_cast<uint8_t>(byte(rng));
    for (size_t b = code_bytes; b < row_bytes; b += 2) {
      const uint16_t half = F32ToF16(normal(rng));
      std::memcpy(row + b, &half, 2);
    }
  }
  return rows;
}

TEST_P(IntScoresTest, GroupDotsAreExactIntegers) {
  std::mt19937 rng(12);
  std::uniform_int_distribution<int> code(-codec::kQueryMax, codec::kQueryMax);
  for (int64_t dim : {32, 64, 96, 128, 256}) {
    for (const IntFormat& f : FormatsFor(dim)) {
      if (f.symmetric) continue;  // the integer stage ignores the symmetry
      for (int64_t n : {1, 3, 16, 17, 33}) {
        for (int64_t heads : {1, 2, 3, 4, 5, 6, 7, 8, 11}) {
          // The worst case for overflow: every code at its maximum and every
          // q8 at -127 (one head), besides random ones.
          const bool extreme = heads == 11;
          const std::vector<uint8_t> rows = RandomRows(f, dim, n, rng, extreme);
          std::vector<int8_t> q8(static_cast<size_t>(heads * dim));  // [heads, dim]
          for (int8_t& v : q8) v = static_cast<int8_t>(code(rng));
          if (extreme) {
            for (int64_t i = 0; i < dim; ++i) q8[i] = -codec::kQueryMax;
          }
          const int64_t groups = f.Groups(dim);
          std::vector<int32_t> dots(static_cast<size_t>(heads * n * groups), -1);
          codec::IntGroupDots(f, dim, rows.data(), n, q8.data(), heads, dots.data());
          for (int64_t h = 0; h < heads; ++h) {
            for (int64_t t = 0; t < n; ++t) {
              for (int64_t g = 0; g < groups; ++g) {
                const int32_t want = codec::IntGroupDotRef(f, rows.data() + t * f.RowBytes(dim),
                                                           q8.data() + h * dim, g);
                ASSERT_EQ(dots[(h * n + t) * groups + g], want)
                    << f.Name() << " dim " << dim << " n " << n << " heads " << heads << " h " << h
                    << " t " << t << " g " << g;
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(IntScoresTest, ScoresMatchReferenceAndF32QueryWithinDerivedBounds) {
  std::mt19937 rng(13);
  const float scale = 0.125f;
  for (int64_t dim : {32, 64, 96, 128, 256}) {
    for (const IntFormat& f : FormatsFor(dim)) {
      const std::string name = f.Name();
      auto fast = ParseKvCodec(name, dim, CodecPath::kSimd);
      auto ref = ParseKvCodec(name, dim, CodecPath::kReference);
      ASSERT_TRUE(fast.ok() && ref.ok()) << name;
      for (int64_t n : {1, 5, 16, 17, 40}) {
        for (int64_t heads : {1, 2, 3, 4, 5, 6, 7, 8, 14}) {
          const auto qkind = static_cast<QueryKind>((n + heads + dim) % 5);
          const float sigma = heads % 3 == 0 ? 3e4f : (heads % 3 == 1 ? 1.0f : 1e-6f);
          const std::vector<float> x = MakeRows(n, dim, sigma, rng);
          std::vector<uint8_t> rows(static_cast<size_t>(n) * (*fast)->RowBytes());
          (*fast)->Encode(x.data(), n, rows.data());
          std::vector<float> decoded(x.size());  // [n, dim]
          (*fast)->Decode(rows.data(), n, decoded.data());
          const std::vector<float> q = MakeQuery(qkind, heads, dim, rng);
          const int64_t stride = n + 5;  // not n: the kernels must honour it
          std::vector<float> got(static_cast<size_t>(heads * stride), -7.0f);
          std::vector<float> want(got.size(), -7.0f);
          (*fast)->Scores(rows.data(), n, q.data(), heads, scale, got.data(), stride);
          (*ref)->Scores(rows.data(), n, q.data(), heads, scale, want.data(), stride);
          const std::string what = name + " dim " + std::to_string(dim) + " n " +
                                   std::to_string(n) + " heads " + std::to_string(heads);
          for (int64_t h = 0; h < heads; ++h) {
            const float* qh = q.data() + h * dim;
            for (int64_t t = 0; t < stride; ++t) {
              const size_t at = static_cast<size_t>(h * stride + t);
              if (t >= n) {
                ASSERT_EQ(got[at], -7.0f) << what << ": wrote past n";
                continue;
              }
              const uint8_t* row = rows.data() + t * (*fast)->RowBytes();
              const double epilogue = EpilogueBound(f, dim, row, qh, scale);
              ASSERT_NEAR(got[at], want[at], epilogue) << what << " h " << h << " t " << t;
              double f32q = 0.0;
              for (int64_t i = 0; i < dim; ++i) {
                f32q += static_cast<double>(qh[i]) * decoded[t * dim + i];
              }
              f32q *= scale;
              ASSERT_NEAR(got[at], f32q,
                          QuantizationBound(f, dim, decoded.data() + t * dim, qh, scale) + epilogue)
                  << what << " h " << h << " t " << t << " (vs f32 query)";
            }
          }
        }
      }
    }
  }
}

// The bound is not vacuous and the query really is quantized: for N(0, 1)
// q and x, a group of 32 has absmax ~ 2.2, step ~ 2.2 / 127 = 0.017, so each
// q error is ~ uniform with variance step^2 / 12 = 2.5e-5; a 64-term score
// then errs by sqrt(64 * 2.5e-5) = 0.04 rms against a score spread of
// sqrt(64) = 8: relative ~ 5e-3. The test asks for 1e-4 < rel < 2e-2.
TEST_P(IntScoresTest, QueryQuantizationErrorIsSmallButPresent) {
  std::mt19937 rng(14);
  const int64_t dim = 64, n = 256, heads = 7;
  auto codec = ParseKvCodec("int8-g32-sym", dim);
  ASSERT_TRUE(codec.ok());
  const std::vector<float> x = MakeRows(n, dim, 1.0f, rng);
  std::vector<uint8_t> rows(static_cast<size_t>(n) * (*codec)->RowBytes());
  (*codec)->Encode(x.data(), n, rows.data());
  std::vector<float> decoded(x.size());
  (*codec)->Decode(rows.data(), n, decoded.data());
  const std::vector<float> q = MakeQuery(QueryKind::kNormal, heads, dim, rng);
  std::vector<float> scores(static_cast<size_t>(heads * n));
  (*codec)->Scores(rows.data(), n, q.data(), heads, 1.0f, scores.data(), n);
  double err2 = 0.0, sig2 = 0.0;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      double f32q = 0.0;
      for (int64_t i = 0; i < dim; ++i)
        f32q += static_cast<double>(q[h * dim + i]) * decoded[t * dim + i];
      err2 += std::pow(scores[h * n + t] - f32q, 2);
      sig2 += f32q * f32q;
    }
  }
  const double rel = std::sqrt(err2 / sig2);
  EXPECT_GT(rel, 1e-4);
  EXPECT_LT(rel, 2e-2);
}

}  // namespace
}  // namespace kvq
