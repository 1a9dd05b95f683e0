// Hadamard rotation: fast == explicit-matrix reference on every compiled
// SIMD target, orthogonality, dot products preserved, fixed signs, bad dims.
#include "kv/hadamard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
#include "kv/kv_test_util.h"

namespace kvq {
namespace {

double RowNorm(const float* x, int64_t dim) {
  double sum = 0.0;
  for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(x[i]) * x[i];
  return std::sqrt(sum);
}

// Error of the fast transform, per element, as a multiple of the row's norm.
// Each of the log2(dim) butterfly stages rounds every output once (relative
// eps); the error vector of a stage has norm <= eps * ||stage output||, and
// later stages and the final 1/sqrt(dim) scale it exactly like the signal,
// so after normalization each stage contributes <= eps * ||x||; the sign and
// norm multiplies add 2 more roundings. The reference (double) rounds once.
// An element's error is at most the error vector's norm.
double Bound(int64_t dim, double norm) {
  return (std::log2(static_cast<double>(dim)) + 3) * kEps * norm * 1.01 + 1e-44;
}

class HadamardTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(HadamardTest);

TEST_P(HadamardTest, FastMatchesExplicitMatrix) {
  std::mt19937 rng(11);
  for (int64_t dim : {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024}) {
    for (int64_t n : {0, 1, 3}) {
      const std::vector<float> x = Normal(static_cast<size_t>(n * dim), rng);
      for (bool inverse : {false, true}) {
        std::vector<float> fast = x, ref = x;
        ASSERT_TRUE((inverse ? HadamardUnrotate : HadamardRotate)(fast.data(), n, dim).ok());
        ASSERT_TRUE((inverse ? HadamardUnrotateRef : HadamardRotateRef)(ref.data(), n, dim).ok());
        for (int64_t t = 0; t < n; ++t) {
          const double bound = Bound(dim, RowNorm(x.data() + t * dim, dim));
          for (int64_t i = 0; i < dim; ++i) {
            ASSERT_NEAR(fast[t * dim + i], ref[t * dim + i], bound)
                << "dim " << dim << " inverse " << inverse << " t " << t << " i " << i;
          }
        }
      }
    }
  }
}

TEST_P(HadamardTest, UnrotateUndoesRotateAndDotProductsSurvive) {
  std::mt19937 rng(12);
  for (int64_t dim : {16, 64, 128, 256}) {
    const int64_t n = 5;
    std::vector<float> x = Normal(static_cast<size_t>(n * dim), rng);
    // One huge outlier channel, as keys have: rotation spreads it.
    x[3] = 500.0f;
    std::vector<float> rotated = x;
    ASSERT_TRUE(HadamardRotate(rotated.data(), n, dim).ok());
    // Spread: every rotated channel of row 0 is (±500 + a ±1-weighted sum of
    // dim - 1 N(0, 1) values) / sqrt(dim), i.e. ±500/sqrt(dim) plus noise of
    // standard deviation < 1: the outlier's share stays 1/sqrt(dim) (6 sigma).
    for (int64_t i = 0; i < dim; ++i) {
      EXPECT_LT(std::fabs(rotated[i]), 500.0 / std::sqrt(static_cast<double>(dim)) + 6.0) << i;
    }
    std::vector<float> back = rotated;
    ASSERT_TRUE(HadamardUnrotate(back.data(), n, dim).ok());
    for (int64_t t = 0; t < n; ++t) {
      const double norm = RowNorm(x.data() + t * dim, dim);
      // Two transforms' errors (Bound each) plus the rotated norm equal to x's.
      for (int64_t i = 0; i < dim; ++i) {
        ASSERT_NEAR(back[t * dim + i], x[t * dim + i], 2 * Bound(dim, norm)) << dim;
      }
    }
    // q·k == (Rq)·(Rk): |error| <= ||q|| ||Rk - R̂k|| + ||k|| ||Rq - R̂q|| (+ the dot's own
    // rounding in double, negligible) <= 2 sqrt(dim) * Bound per element... use norms.
    for (int64_t t = 1; t < n; ++t) {
      double dot = 0.0, rdot = 0.0;
      for (int64_t i = 0; i < dim; ++i) {
        dot += static_cast<double>(x[i]) * x[t * dim + i];
        rdot += static_cast<double>(rotated[i]) * rotated[t * dim + i];
      }
      const double nq = RowNorm(x.data(), dim), nk = RowNorm(x.data() + t * dim, dim);
      const double bound =
          std::sqrt(static_cast<double>(dim)) * (nq * Bound(dim, nk) + nk * Bound(dim, nq)) * 1.01;
      EXPECT_NEAR(rdot, dot, bound) << dim;
    }
  }
}

// llama.cpp's blocked, sign-free rotation: fast == explicit matrix on every
// target (the same butterfly bound per block), and applying it twice gives
// the input back (H symmetric and orthogonal) within two transforms' error.
TEST_P(HadamardTest, LlamaCppBlocksMatchTheMatrixAndUndoThemselves) {
  std::mt19937 rng(21);
  for (const auto& [dim, block] : {std::pair<int64_t, int64_t>{64, 64},
                                   {128, 128},
                                   {128, 64},
                                   {192, 64},
                                   {96, 32},
                                   {256, 256},
                                   {8, 2}}) {
    for (int64_t n : {0, 1, 5}) {
      const std::vector<float> x = Normal(static_cast<size_t>(n * dim), rng);
      std::vector<float> fast = x, ref = x;
      ASSERT_TRUE(WalshHadamardBlocks(fast.data(), n, dim, block).ok());
      ASSERT_TRUE(WalshHadamardBlocksRef(ref.data(), n, dim, block).ok());
      std::vector<float> back = fast;
      ASSERT_TRUE(WalshHadamardBlocks(back.data(), n, dim, block).ok());
      for (int64_t b = 0; b < n * dim / block; ++b) {
        const double bound = Bound(block, RowNorm(x.data() + b * block, block));
        for (int64_t i = b * block; i < (b + 1) * block; ++i) {
          ASSERT_NEAR(fast[i], ref[i], bound) << dim << "/" << block << " at " << i;
          ASSERT_NEAR(back[i], x[i], 2 * bound) << dim << "/" << block << " at " << i;
        }
      }
    }
  }
  // e_0 of a block maps to 1/sqrt(block) on the whole block and nowhere else.
  std::vector<float> e(128, 0.0f);
  e[64] = 1.0f;
  ASSERT_TRUE(WalshHadamardBlocks(e.data(), 1, 128, 64).ok());
  for (int64_t i = 0; i < 128; ++i) EXPECT_EQ(e[i], i < 64 ? 0.0f : 0.125f) << i;
  std::vector<float> x(192, 1.0f);
  EXPECT_FALSE(WalshHadamardBlocks(x.data(), 1, 192, 128).ok());  // does not divide
  EXPECT_FALSE(WalshHadamardBlocks(x.data(), 1, 192, 48).ok());   // not a power of two
  EXPECT_FALSE(WalshHadamardBlocksRef(x.data(), -1, 192, 64).ok());
}

TEST(HadamardSignsTest, FixedMixedAndPrefixConsistent) {
  int negatives = 0;
  for (int64_t i = 0; i < 4096; ++i) negatives += HadamardSign(i) < 0;
  // A fair ±1 stream: 2048 ± 4 sigma (sigma = 32).
  EXPECT_GT(negatives, 2048 - 128);
  EXPECT_LT(negatives, 2048 + 128);
  // Rotating e_0 gives column 0 of R: H[i][0] = 1, so sign(0) / sqrt(dim) everywhere.
  std::vector<float> e(64, 0.0f);
  e[0] = 1.0f;
  ASSERT_TRUE(HadamardRotate(e.data(), 1, 64).ok());
  for (float v : e) EXPECT_EQ(v, HadamardSign(0) * 0.125f);
}

TEST(HadamardSignsTest, BadDimsAreErrors) {
  for (int64_t dim : {int64_t{0}, int64_t{-4}, int64_t{3}, int64_t{48}, int64_t{96}, int64_t{100},
                      int64_t{1} << 17}) {
    EXPECT_FALSE(CheckHadamardDim(dim).ok()) << dim;
    std::vector<float> x(8, 1.0f);
    const Status s = HadamardRotate(x.data(), 0, dim);
    ASSERT_FALSE(s.ok()) << dim;
    EXPECT_NE(s.message().find("power of two"), std::string::npos) << s.message();
    EXPECT_FALSE(HadamardUnrotateRef(x.data(), 0, dim).ok());
  }
  std::vector<float> x(64, 1.0f);
  EXPECT_FALSE(HadamardRotate(x.data(), -1, 64).ok());
}

}  // namespace
}  // namespace kvq
