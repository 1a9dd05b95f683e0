// TurboQuant / QJL codecs (kv/turbo_quant.cc, kv/codec_turbo.cc): names and
// exact row bytes, the Lloyd-Max codebooks against Max's published table and
// the Lloyd conditions, SIMD kernels against the double reference on every
// Highway target (random shapes, odd lengths, zeros, huge, tiny and
// non-finite rows), the MSE bound, unbiasedness of the QJL estimators, and
// the schemes through the cache factory and the planner's layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
#include "kv/codec.h"
#include "kv/codec_formats.h"
#include "kv/codec_registry.h"
#include "kv/kv_factory.h"
#include "kv/kv_policy.h"
#include "kv/kv_test_util.h"
#include "kv/turbo_quant.h"

namespace kvq {
namespace {

const char* const kNames[] = {"tq1",     "tq2",       "tq2.5",   "tq3",      "tq3.5",
                              "tq4",     "tq3-nc",    "tq4-nc",  "tq2-qjl",  "tq2.5-qjl",
                              "tq3-qjl", "tq3.5-qjl", "tq5-qjl", "qjl",      "qjl-x2-seed3",
                              "tqv2",    "tqv3",      "tqv4",    "tq3-seed9"};

TEST(TurboCodec, NamesRoundTripWithExactRowBytes) {
  // Bytes from the layouts in codec_turbo.cc, written out by hand:
  // ceil(code bits / 8) + sketch bytes + 2 per f16 field, padded to 4.
  struct Case {
    const char* name;
    size_t d64, d128;
  };
  const Case cases[] = {
      {"tq3", 28, 52},     {"tq4-nc", 36, 68},    {"tq2.5", 24, 44},   {"tq1", 12, 20},
      {"tq3-qjl", 28, 52}, {"tq2.5-qjl", 24, 44}, {"qjl", 12, 20},     {"qjl-x2", 20, 36},
      {"tqv4", 36, 68},    {"tqv3", 28, 52},      {"tq5-qjl", 44, 84}, {"tq3.5", 32, 60},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(MustParse(c.name, 64)->RowBytes(), c.d64) << c.name;
    EXPECT_EQ(MustParse(c.name, 128)->RowBytes(), c.d128) << c.name;
  }
  for (const char* name : kNames) {
    auto codec = MustParse(name, 64);
    ASSERT_NE(codec, nullptr);
    EXPECT_EQ(codec->Name(), name);
  }
  EXPECT_EQ(MustParse("tq3-seed0", 64)->Name(), "tq3");
  for (const char* bad : {"tq6", "tq1-qjl", "tq4.5", "tq3-nc-qjl", "tqv5", "qjl-x3", "tq3-nc-nc",
                          "qjl-nc", "tq3-seed", "tq3-fast", "tqv2.5"}) {
    auto codec = ParseKvCodec(bad, 64);
    ASSERT_FALSE(codec.ok()) << bad;
    EXPECT_NE(codec.status().message().find(bad), std::string::npos) << codec.status().message();
  }
  for (int64_t dim : {8, 48, 96, 512}) {
    auto codec = ParseKvCodec("tq3", dim);
    ASSERT_FALSE(codec.ok()) << dim;
    EXPECT_NE(codec.status().message().find("power of two"), std::string::npos);
  }
}

TEST(TurboCodec, LloydMaxLevelsMatchMaxsTableAndTheLloydConditions) {
  // J. Max, "Quantizing for minimum distortion" (1960), Gaussian, positive
  // half (4 significant digits, so 6e-4 absolute), and its MSEs.
  const std::vector<std::vector<double>> table = {
      {0.7979},
      {0.4528, 1.510},
      {0.2451, 0.7560, 1.344, 2.152},
      {0.1284, 0.3881, 0.6568, 0.9424, 1.256, 1.618, 2.069, 2.733}};
  const double mse[] = {0.3634, 0.1175, 0.03454, 0.009497};
  for (int bits = 1; bits <= 4; ++bits) {
    const std::vector<double> levels = codec::GaussianLloydMax(bits);
    const size_t half = levels.size() / 2;
    ASSERT_EQ(levels.size(), size_t{1} << bits);
    for (size_t j = 0; j < half; ++j) {
      EXPECT_NEAR(levels[half + j], table[bits - 1][j], 6e-4) << bits << " " << j;
      EXPECT_NEAR(levels[half - 1 - j], -table[bits - 1][j], 6e-4) << bits << " " << j;
    }
    EXPECT_NEAR(codec::GaussianLloydMaxMse(levels), mse[bits - 1], 6e-4 * mse[bits - 1] + 2e-6);
    // Each level is the mean of N(0, 1) over its cell, by Simpson's rule on
    // [-12, 12] (the tails beyond carry < 1e-32): independent of the closed
    // forms the solver uses. 20000 panels: error ~1e-14.
    for (size_t j = 0; j < levels.size(); ++j) {
      const double a = j == 0 ? -12.0 : 0.5 * (levels[j - 1] + levels[j]);
      const double b = j + 1 == levels.size() ? 12.0 : 0.5 * (levels[j] + levels[j + 1]);
      const int panels = 20000;
      double m0 = 0, m1 = 0;
      for (int k = 0; k <= panels; ++k) {
        const double x = a + (b - a) * k / panels;
        const double w = (k == 0 || k == panels) ? 1 : (k % 2 ? 4 : 2);
        const double density = std::exp(-0.5 * x * x);
        m0 += w * density;
        m1 += w * x * density;
      }
      EXPECT_NEAR(levels[j], m1 / m0, 1e-9) << bits << " " << j;
    }
  }
}

// The row kinds of the edge-case sweep.
std::vector<float> Rows(int kind, int64_t n, int64_t dim, std::mt19937& rng) {
  std::vector<float> x = Normal(static_cast<size_t>(n * dim), rng);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < dim; ++i) {
      float& v = x[t * dim + i];
      if (kind == 1 && t % 3 == 0) v = 0.0f;            // zero rows among normal ones
      if (kind == 2) v *= 3e6f;                         // norm far beyond f16: clipped
      if (kind == 3) v *= 1e-5f;                        // norm near f16's subnormals
      if (kind == 4 && i == (t * 7) % dim) v = 300.0f;  // one outlier channel
    }
  }
  return x;
}

class TurboSimdTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(TurboSimdTest);

// Fast scores/values against the double reference, with bounds derived
// from f32 rounding (Higham's gamma_k = k u / (1 - k u)). Per (head h, row t)
// with Q = ||q_h||, Y = ||y_t||, f, m, F = ||S||_F from TurboDecodeParts:
//   R q in f32 (log2 d butterfly stages, then a scale): ||dq|| <= (L + 2) u Q;
//   S (R q) in f32: ||dsq|| <= F (||dq|| + gamma_d Q), ||sq|| <= F Q;
//   the expanded row in f32: relative u per entry;
//   one f32 dot of d + m terms: gamma_{d+m} (Q Y + f sqrt(m) ||sq||);
//   the reference rounds decoded values to f32: u Q ||x^||.
// A wrong code, sign, level or rotation moves a score by O(Q Y); these
// bounds are ~1e-5 of that.
double ScoreBound(const codec::TurboRowParts& r, int64_t dim, double q_norm, double x_norm) {
  auto gamma = [](double k) { return k * kEps / (1 - k * kEps); };
  const double levels = r.rotated ? std::log2(static_cast<double>(dim)) + 2 : 0;
  const double dq = levels * kEps * q_norm;
  const double m = static_cast<double>(r.sketch_rows);
  const double fm = r.sketch_factor * std::sqrt(m);
  const double dsq = r.sketch_frobenius * (dq + gamma(dim) * q_norm);
  const double sq = r.sketch_frobenius * q_norm;
  return dq * r.y_norm + kEps * q_norm * r.y_norm + fm * (dsq + kEps * sq) +
         gamma(static_cast<double>(dim) + m) * (q_norm * r.y_norm + fm * sq) +
         kEps * q_norm * x_norm;
}

// Values: per head, ||fast - ref||_2 <= (n + m + 2 L + 10) u (P + ||acc0||)
// + 2 u ||ref||, P = sum_t |p_t| (Y_t + f_t sqrt(m) F) bounding every
// partial sum in the rotated and sketch domains (tqv adds its rows
// straight into acc, so each of the n additions rounds against acc0 too).
void CheckValues(const KvCodec& fast, const KvCodec& ref, const std::vector<uint8_t>& rows,
                 int64_t n, int64_t group, const std::vector<codec::TurboRowParts>& parts, int kind,
                 std::mt19937& rng) {
  const int64_t dim = fast.head_dim(), stride = n + 3;
  const std::string name = fast.Name();
  std::vector<float> p(group * stride);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (float& v : p) v = unit(rng);
  const auto acc0 = Normal(static_cast<size_t>(group * dim), rng);
  std::vector<float> acc_fast = acc0, acc_ref = acc0;
  fast.AccumulateV(rows.data(), n, p.data(), group, stride, acc_fast.data());
  ref.AccumulateV(rows.data(), n, p.data(), group, stride, acc_ref.data());
  for (int64_t h = 0; h < group; ++h) {
    double big_p = 0, err = 0, a0 = 0, r2 = 0;
    int64_t m = 0;
    for (int64_t t = 0; t < n; ++t) {
      const auto& r = parts[t];
      m = r.sketch_rows;
      big_p += p[h * stride + t] *
               (r.y_norm + r.sketch_factor * std::sqrt(double(r.sketch_rows)) * r.sketch_frobenius);
    }
    for (int64_t i = 0; i < dim; ++i) {
      const double e = double{acc_fast[h * dim + i]} - acc_ref[h * dim + i];
      err += e * e;
      a0 += double{acc0[h * dim + i]} * acc0[h * dim + i];
      r2 += double{acc_ref[h * dim + i]} * acc_ref[h * dim + i];
    }
    const double bound =
        (n + m + 2 * std::log2(double(dim)) + 10) * kEps * (big_p + std::sqrt(a0)) +
        2 * kEps * std::sqrt(r2);
    ASSERT_LE(std::sqrt(err), bound) << name << " dim " << dim << " kind " << kind;
  }
}

void CheckKernels(const std::string& name, int64_t dim, int kind, std::mt19937& rng) {
  auto fast = MustParse(name, dim), ref = MustParse(name, dim, CodecPath::kReference);
  ASSERT_TRUE(fast && ref);
  for (int64_t n : {1, 5, 37}) {
    const std::vector<float> x = Rows(kind, n, dim, rng);
    std::vector<uint8_t> rows(n * fast->RowBytes()), rows_ref(rows.size());
    fast->Encode(x.data(), n, rows.data());
    ref->Encode(x.data(), n, rows_ref.data());
    ASSERT_EQ(rows, rows_ref) << "encoding differs between paths";
    std::vector<float> a(x.size()), b(x.size());
    fast->Decode(rows.data(), n, a.data());
    ref->Decode(rows.data(), n, b.data());
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "decode differs";
    std::vector<codec::TurboRowParts> parts;
    std::vector<double> x_norm(n);
    for (int64_t t = 0; t < n; ++t) {
      auto p = codec::TurboDecodeParts(*fast, rows.data() + t * fast->RowBytes());
      ASSERT_TRUE(p.ok());
      parts.push_back(*p);
      for (int64_t i = 0; i < dim; ++i) x_norm[t] += double{a[t * dim + i]} * a[t * dim + i];
      x_norm[t] = std::sqrt(x_norm[t]);
      ASSERT_TRUE(std::isfinite(x_norm[t])) << name << " kind " << kind;
    }
    for (int64_t group : {1, 3, 9}) {
      const auto q = Normal(static_cast<size_t>(group * dim), rng);
      const int64_t stride = n + 3;
      std::vector<float> s_fast(group * stride, -7.0f), s_ref(s_fast.size(), -7.0f);
      std::vector<float> s_prep(s_fast.size(), -7.0f);
      fast->Scores(rows.data(), n, q.data(), group, 0.125f, s_fast.data(), stride);
      ref->Scores(rows.data(), n, q.data(), group, 0.125f, s_ref.data(), stride);
      std::vector<uint8_t> prepared(fast->PreparedQueryBytes(group));
      fast->PrepareQuery(q.data(), group, prepared.data());
      fast->ScoresPrepared(rows.data(), n, q.data(), prepared.data(), group, 0.125f, s_prep.data(),
                           stride);
      ASSERT_EQ(s_prep, s_fast) << "ScoresPrepared differs from Scores";
      for (int64_t h = 0; h < group; ++h) {
        double qn = 0;
        for (int64_t i = 0; i < dim; ++i) qn += double{q[h * dim + i]} * q[h * dim + i];
        qn = std::sqrt(qn);
        for (int64_t t = 0; t < n; ++t) {
          const double bound = 0.125 * ScoreBound(parts[t], dim, qn, x_norm[t]) +
                               kEps * std::fabs(s_ref[h * stride + t]) + 1e-30;
          ASSERT_NEAR(s_fast[h * stride + t], s_ref[h * stride + t], bound)
              << name << " dim " << dim << " kind " << kind << " n " << n << " h " << h;
        }
        ASSERT_EQ(s_fast[h * stride + n], -7.0f) << name << ": wrote past n";
      }
      CheckValues(*fast, *ref, rows, n, group, parts, kind, rng);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST_P(TurboSimdTest, FusedKernelsMatchTheDoubleReference) {
  std::mt19937 rng(1);
  for (const char* name : kNames) {
    for (int64_t dim : {16, 64, 128, 256}) {
      for (int kind = 0; kind < 5; ++kind) {
        CheckKernels(name, dim, kind, rng);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The fused kernels' table-lookup decoding (every code width, both runs of a
// 2.5/3.5-bit row, the sketch signs, uniform rows) against the scalar
// expansion, exactly, on every target: a wrong shift, mask, level or sign
// changes some value.
TEST_P(TurboSimdTest, TableLookupDecodingEqualsTheScalarExpansion) {
  std::mt19937 rng(7);
  for (const char* name : kNames) {
    for (int64_t dim : {16, 32, 64, 128, 256}) {
      auto codec = MustParse(name, dim);
      ASSERT_TRUE(codec);
      for (int kind = 0; kind < 6; ++kind) {  // kind 5: normal rows and one NaN row
        const int64_t n = 37;
        std::vector<float> x = Rows(kind, n, dim, rng);
        if (kind == 5) x[3 * dim + 1] = std::numeric_limits<float>::quiet_NaN();
        std::vector<uint8_t> rows(n * codec->RowBytes());
        codec->Encode(x.data(), n, rows.data());
        auto scalar = codec::TurboExpandRows(*codec, rows.data(), n, /*simd=*/false);
        auto simd = codec::TurboExpandRows(*codec, rows.data(), n, /*simd=*/true);
        ASSERT_TRUE(scalar.ok() && simd.ok());
        ASSERT_EQ(scalar->size(), simd->size());
        for (size_t i = 0; i < scalar->size(); ++i) {
          const float a = (*scalar)[i], b = (*simd)[i];
          ASSERT_TRUE(std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b)))
              << name << " dim " << dim << " kind " << kind << " value " << i << ": " << a << " vs "
              << b;
        }
      }
    }
  }
}

TEST(TurboCodec, ZerosHugeTinyAndNonFiniteRows) {
  std::mt19937 rng(2);
  const int64_t dim = 64;
  for (const char* name : kNames) {
    auto codec = MustParse(name, dim);
    ASSERT_NE(codec, nullptr);
    // Zero rows decode to exact zeros.
    std::vector<float> zeros(2 * dim, 0.0f), back(2 * dim, 1.0f);
    std::vector<uint8_t> rows(2 * codec->RowBytes());
    codec->Encode(zeros.data(), 2, rows.data());
    codec->Decode(rows.data(), 2, back.data());
    for (float v : back) ASSERT_EQ(v, 0.0f) << name;
    // Huge rows stay finite (norm or scale clipped to the f16 range).
    std::vector<float> huge = Normal(2 * dim, rng, 3e6f);
    codec->Encode(huge.data(), 2, rows.data());
    codec->Decode(rows.data(), 2, back.data());
    for (float v : back) ASSERT_TRUE(std::isfinite(v)) << name;
    // A NaN or inf in one row: that row is NaN (the K/V codecs cannot return
    // an error; NaN is what every other codec carries), the next row is not
    // touched.
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY}) {
      std::vector<float> x = Normal(2 * dim, rng);
      x[5] = bad;
      codec->Encode(x.data(), 2, rows.data());
      codec->Decode(rows.data(), 2, back.data());
      bool any_nan = false;
      for (int64_t i = 0; i < dim; ++i) any_nan = any_nan || std::isnan(back[i]);
      EXPECT_TRUE(any_nan) << name;
      for (int64_t i = dim; i < 2 * dim; ++i) ASSERT_TRUE(std::isfinite(back[i])) << name;
    }
  }
}

// Normalized reconstruction error E||x - x^||^2 / ||x||^2 of TurboQuant_mse
// on Gaussian rows (directions uniform on the sphere). After the rotation
// each coordinate of the unit vector is ~N(0, 1/d) (a scaled Beta; the gap
// is O(1/d)), so the error is d * (Lloyd-Max MSE of N(0,1)) / d per
// coordinate: GaussianLloydMaxMse(b) in total. Over 1000 rows x 128
// coordinates the sample mean's relative spread is ~1%, the Beta vs
// Gaussian gap a few % at d = 128: 10% tolerance. The paper's bound
// (Theorem 1) sqrt(3) pi / 2 * 4^-b must hold with room to spare.
TEST(TurboCodec, MseMatchesLloydMaxAndThePapersBound) {
  std::mt19937 rng(3);
  const int64_t dim = 128, n = 1000;
  const auto x = Normal(static_cast<size_t>(n * dim), rng);
  for (int bits10 : {10, 20, 25, 30, 35, 40}) {
    const std::string name = "tq" + std::to_string(bits10 / 10) + (bits10 % 10 ? ".5" : "");
    auto codec = MustParse(name, dim);
    std::vector<uint8_t> rows(n * codec->RowBytes());
    codec->Encode(x.data(), n, rows.data());
    std::vector<float> back(x.size());
    codec->Decode(rows.data(), n, back.data());
    double err = 0;
    for (int64_t t = 0; t < n; ++t) {
      double e = 0, norm = 0;
      for (int64_t i = 0; i < dim; ++i) {
        e += std::pow(double{back[t * dim + i]} - x[t * dim + i], 2);
        norm += double{x[t * dim + i]} * x[t * dim + i];
      }
      err += e / norm / n;
    }
    const int lo = bits10 / 10, hi = (bits10 + 9) / 10;
    const double expected = 0.5 * (codec::GaussianLloydMaxMse(codec::GaussianLloydMax(lo)) +
                                   codec::GaussianLloydMaxMse(codec::GaussianLloydMax(hi)));
    EXPECT_NEAR(err, expected, 0.1 * expected) << name;
    if (bits10 % 10 == 0) {
      EXPECT_LT(err, std::sqrt(3.0) * M_PI / 2 * std::pow(4.0, -lo)) << name;
    }
  }
}

// tqvB decodes u * scale + min with u the nearest level: within half a step
// of the input, plus what f16 rounding of the scale (the top level may end
// 2^-11 * (2^B - 1) steps below max) and of min (2^-11 |min|) move, plus f32
// rounding of the decode (~1e-6 relative).
TEST(TurboCodec, UniformValuesWithinHalfAStep) {
  std::mt19937 rng(6);
  const int64_t dim = 64, n = 40;
  const auto x = Normal(static_cast<size_t>(n * dim), rng);
  for (int bits : {2, 3, 4}) {
    auto codec = MustParse("tqv" + std::to_string(bits), dim);
    std::vector<uint8_t> rows(n * codec->RowBytes());
    codec->Encode(x.data(), n, rows.data());
    std::vector<float> back(x.size());
    codec->Decode(rows.data(), n, back.data());
    const double top = (1 << bits) - 1;
    for (int64_t t = 0; t < n; ++t) {
      float lo = x[t * dim], hi = x[t * dim];
      for (int64_t i = 0; i < dim; ++i) {
        lo = std::min(lo, x[t * dim + i]);
        hi = std::max(hi, x[t * dim + i]);
      }
      const double step = (double{hi} - lo) / top;
      for (int64_t i = 0; i < dim; ++i) {
        const double bound = step * (0.5 + top * 0x1p-10) + 0x1p-11 * std::fabs(lo) +
                             1e-6 * (std::fabs(hi) + std::fabs(lo));
        ASSERT_NEAR(back[t * dim + i], x[t * dim + i], bound) << bits << " t " << t << " i " << i;
      }
    }
  }
}

// -nc: the decoded row has the input's length (up to the f16 norm: 2^-11
// relative, and f32 rounding of the levels and the unrotation, < 1e-6).
TEST(TurboCodec, NormCorrectionKeepsTheLength) {
  std::mt19937 rng(4);
  const int64_t dim = 64, n = 50;
  const auto x = Normal(static_cast<size_t>(n * dim), rng);
  for (const char* name : {"tq3-nc", "tq4-nc", "tq3"}) {
    auto codec = MustParse(name, dim);
    std::vector<uint8_t> rows(n * codec->RowBytes());
    codec->Encode(x.data(), n, rows.data());
    std::vector<float> back(x.size());
    codec->Decode(rows.data(), n, back.data());
    double worst = 0;
    for (int64_t t = 0; t < n; ++t) {
      double a = 0, b = 0;
      for (int64_t i = 0; i < dim; ++i) {
        a += double{back[t * dim + i]} * back[t * dim + i];
        b += double{x[t * dim + i]} * x[t * dim + i];
      }
      worst = std::max(worst, std::fabs(std::sqrt(a / b) - 1));
    }
    if (std::string(name) == "tq3") {
      EXPECT_GT(worst, 1e-2) << "without -nc the length shrinks (the test can fail)";
    } else {
      EXPECT_LT(worst, 0x1p-11 + 1e-6) << name;
    }
  }
}

// Mean and spread of q . x^ over `seeds` independent rotations/sketches.
struct Estimate {
  double mean = 0, mean_square = 0, max_factor = 0;
};
Estimate OverSeeds(const std::string& base, const std::vector<float>& x,
                   const std::vector<float>& q, int seeds) {
  const int64_t dim = static_cast<int64_t>(x.size());
  Estimate e;
  for (int s = 1; s <= seeds; ++s) {
    auto codec = MustParse(base + "-seed" + std::to_string(s), dim);
    std::vector<uint8_t> row(codec->RowBytes());
    codec->Encode(x.data(), 1, row.data());
    float score = 0;
    codec->Scores(row.data(), 1, q.data(), 1, 1.0f, &score, 1);
    e.mean += score / seeds;
    e.mean_square += double{score} * score / seeds;
    auto parts = codec::TurboDecodeParts(*codec, row.data());
    e.max_factor = std::max(e.max_factor, parts->sketch_factor * parts->sketch_rows);
  }
  return e;
}

// Unbiasedness (TurboQuant Theorem 2, QJL Lemma 3): E_S[q . x^] = q . x.
// Given the rotation, the sketch term is f sum_j <S_j, R q> sign(<S_j, r>)
// over m independent Gaussian rows, each summand of variance <= f^2 ||q||^2,
// so sigma <= f sqrt(m) ||q|| = (f m) ||q|| / sqrt(m). The mean of N seeds
// lies within 5 sigma / sqrt(N) (false alarm ~6e-7), plus the f16 rounding
// of the stored norm and gamma (2^-10 relative of |q . x|).
TEST(TurboCodec, QjlEstimatorsAreUnbiasedAndMseAloneIsNot) {
  std::mt19937 rng(5);
  const int64_t dim = 64;
  const int seeds = 600;
  const auto x = Normal(dim, rng);
  auto q = Normal(dim, rng, 0.5f);
  for (int64_t i = 0; i < dim; ++i) q[i] += x[i];  // correlated: q . x ~ 64
  double truth = 0, qn = 0;
  for (int64_t i = 0; i < dim; ++i) {
    truth += double{q[i]} * x[i];
    qn += double{q[i]} * q[i];
  }
  qn = std::sqrt(qn);
  for (const char* name : {"tq2-qjl", "qjl", "qjl-x2", "tq3-qjl"}) {
    const Estimate e = OverSeeds(name, x, q, seeds);
    const double m = std::string(name) == "qjl-x2" ? 2 * dim : dim;
    const double sigma = e.max_factor * qn / std::sqrt(m);
    EXPECT_NEAR(e.mean, truth, 5 * sigma / std::sqrt(seeds) + 0x1p-10 * std::fabs(truth))
        << name << " sigma " << sigma;
    // QJL (Lemma 3.5): Var <= pi / (2m) ||q||^2 ||k||^2 for the sketch alone;
    // with ||k|| <= max f m / sqrt(pi / 2). The sample variance of 600 draws
    // is within ~15% of the true one (chi-square, 3 sigma): a sketch whose
    // rows were not independent Gaussians would exceed it.
    if (std::string(name).rfind("qjl", 0) == 0) {
      const double variance = e.mean_square - e.mean * e.mean;
      const double k_norm = e.max_factor / std::sqrt(M_PI / 2);
      EXPECT_LT(variance, 1.15 * M_PI / (2 * m) * qn * qn * k_norm * k_norm) << name;
    }
  }
  // 1-bit MSE codes alone shrink q . x by ~2/pi (TurboQuant Sec. 3.2): far
  // outside the same tolerance, so the test above can tell.
  const Estimate mse = OverSeeds("tq1", x, q, 100);
  EXPECT_LT(mse.mean, 0.8 * truth);
}

TEST(TurboCodec, SchemesBuildCachesWithExactLayoutBytes) {
  const KvShape shape{2, 6, 2, 64};
  struct Case {
    const char* scheme;
    size_t k_row, v_row;
  };
  const Case cases[] = {{"turboquant_k8v4", 64, 36},
                        {"turboquant_4bit_nc", 36, 36},
                        {"turboquant_k3v4_nc", 28, 36},
                        {"turboquant_3bit_nc", 28, 28},
                        {"turboquant2.5", 24, 24},
                        {"turboquant3.5", 32, 32},
                        {"qjl_k1v4", 12, 40}};
  for (const Case& c : cases) {
    KvCacheOptions options;
    options.k_type = options.v_type = c.scheme;
    options.max_tokens = 64;
    auto layout = ComputeKvLayout(shape, options);
    ASSERT_TRUE(layout.ok()) << c.scheme << ": " << layout.status().message();
    EXPECT_EQ(layout->k_row_bytes, c.k_row) << c.scheme;
    EXPECT_EQ(layout->v_row_bytes, c.v_row) << c.scheme;
    // 16-token blocks: tiles are 16 rows padded to 64 bytes, 2 layers x 2 heads.
    auto tile = [](size_t row) { return (16 * row + 63) / 64 * 64; };
    EXPECT_EQ(layout->block_bytes, 2 * 2 * (tile(c.k_row) + tile(c.v_row))) << c.scheme;
    auto cache = MakeKvCache(shape, options);
    ASSERT_TRUE(cache.ok()) << c.scheme << ": " << cache.status().message();
  }
  // Side data per (layer, KV head): qjl's K sketch 64 x 64 f32 (int4 V:
  // none); tq4-nc's rotation signs (64 f32) and 16 levels (tqv4: none).
  for (const auto& [scheme, side] : {std::pair<const char*, size_t>{"qjl_k1v4", 64 * 64 * 4},
                                     {"turboquant_4bit_nc", 64 * 4 + 16 * 4}}) {
    KvCacheOptions options;
    options.k_type = options.v_type = scheme;
    options.max_tokens = 64;
    auto layout = ComputeKvLayout(shape, options);
    ASSERT_TRUE(layout.ok());
    EXPECT_EQ(layout->codec_side_bytes, 2 * 2 * side) << scheme;
  }
}

}  // namespace
}  // namespace kvq
