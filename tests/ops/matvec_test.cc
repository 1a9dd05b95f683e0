// Matvec, DequantizeRows and Embed against their scalar twins, on every
// compiled SIMD target (the fixture sets Highway's target mask per test).
#include "ops/matvec.h"

#include <cmath>
#include <limits>

#include "ops_test_util.h"

namespace kvq::ops {
namespace {

using opstest::kEps;
using opstest::kTinyAbs;
using opstest::MakeWeight;
using opstest::TestWeight;

class MatvecTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(MatvecTest);

// Bound for one output. Both sides sum the same exact f32 products
// w_i * x_i (every weight type decodes to f32 exactly); the fast path rounds
// each product and each partial sum in f32 in some order, so by the standard
// recursive-summation bound |y - y_exact| <= gamma_(n+1) * sum|w_i x_i|,
// gamma_k = k eps / (1 - k eps). Q8_0 adds two roundings (block sum times
// d, then the add), the reference one (double -> f32): n + 4 covers all.
// Underflow adds at most one subnormal half-unit per operation: the
// absolute term.
double Bound(const TestWeight& w, const std::vector<float>& x, int64_t r) {
  double abs_sum = 0.0;
  for (int64_t c = 0; c < w.cols; ++c) {
    abs_sum += std::fabs(static_cast<double>(w.decoded[r * w.cols + c]) * x[c]);
  }
  const double k = static_cast<double>(w.cols + 4);
  return k * kEps / (1.0 - k * kEps) * abs_sum + 2.0 * k * kTinyAbs;
}

void ExpectMatvecNearRef(const TestWeight& w, const std::vector<float>& x, int threads) {
  std::vector<float> y(static_cast<size_t>(w.rows), std::nanf(""));
  std::vector<float> ref(static_cast<size_t>(w.rows));
  ThreadPool pool(threads);
  Matvec(w.view(), x.data(), y.data(), pool);
  MatvecRef(w.view(), x.data(), ref.data());
  for (int64_t r = 0; r < w.rows; ++r) {
    ASSERT_NEAR(y[r], ref[r], Bound(w, x, r)) << WeightTypeName(w.type) << " [" << w.rows << ", "
                                              << w.cols << "] row " << r << " threads " << threads;
  }
}

TEST_P(MatvecTest, RandomShapesAllTypes) {
  std::mt19937 rng(1234);
  const int64_t rows_list[] = {1, 3, 17, 896};
  // Dense types also get lengths that are not a multiple of any vector width.
  const int64_t dense_cols[] = {1, 7, 33, 64, 100, 896, 4864};
  const int64_t q8_cols[] = {32, 96, 896, 4864};
  for (WeightType type : opstest::kAllWeightTypes) {
    for (int64_t rows : rows_list) {
      for (int64_t cols : type == WeightType::kQ8_0
                              ? std::vector<int64_t>(q8_cols, q8_cols + 4)
                              : std::vector<int64_t>(dense_cols, dense_cols + 7)) {
        if (rows * cols > 896 * 896 && rows > 17) continue;  // keep the scalar target quick
        const TestWeight w =
            MakeWeight(type, rows, cols, opstest::RandomVector(rng, rows * cols, 1.0f));
        const std::vector<float> x = opstest::RandomVector(rng, cols, 2.0f);
        for (int threads : {1, 2}) ExpectMatvecNearRef(w, x, threads);
      }
    }
  }
}

TEST_P(MatvecTest, LargestQwenShapeQ8AndF16) {
  std::mt19937 rng(7);
  for (WeightType type : {WeightType::kF16, WeightType::kQ8_0}) {
    const TestWeight w =
        MakeWeight(type, 896, 4864, opstest::RandomVector(rng, int64_t{896} * 4864, 0.05f));
    ExpectMatvecNearRef(w, opstest::RandomVector(rng, 4864, 3.0f), 2);
  }
}

// Small integers: every product and partial sum is exact, so any order gives
// the same answer and fast must equal reference exactly.
TEST_P(MatvecTest, IntegerValuesAreExact) {
  std::mt19937 rng(99);
  for (WeightType type : opstest::kAllWeightTypes) {
    for (int64_t rows : {1, 5, 64}) {
      for (int64_t cols : {32, 160, 4864, 33, 101}) {
        if (type == WeightType::kQ8_0 && cols % 32 != 0) continue;
        const std::vector<float> ints = opstest::RandomIntegers(rng, rows * cols, 8);
        const TestWeight w = type == WeightType::kQ8_0 ? opstest::MakeIntegerQ8_0(rows, cols, ints)
                                                       : MakeWeight(type, rows, cols, ints);
        ASSERT_EQ(w.decoded, ints);
        const std::vector<float> x = opstest::RandomIntegers(rng, cols, 8);
        std::vector<float> y(static_cast<size_t>(rows)), ref(static_cast<size_t>(rows));
        for (int threads : {1, 2}) {
          ThreadPool pool(threads);
          Matvec(w.view(), x.data(), y.data(), pool);
          MatvecRef(w.view(), x.data(), ref.data());
          EXPECT_EQ(y, ref) << WeightTypeName(type) << " " << rows << "x" << cols;
        }
      }
    }
  }
}

TEST_P(MatvecTest, EdgeValues) {
  std::mt19937 rng(5);
  const int64_t rows = 9, cols = 160;
  for (WeightType type : opstest::kAllWeightTypes) {
    // Zeros give exact zeros.
    {
      const TestWeight w = MakeWeight(type, rows, cols, std::vector<float>(rows * cols, 0.0f));
      std::vector<float> y(rows, 1.0f);
      ThreadPool one_thread(1);
      Matvec(w.view(), opstest::RandomVector(rng, cols, 1.0f).data(), y.data(), one_thread);
      for (float v : y) EXPECT_EQ(v, 0.0f) << WeightTypeName(type);
    }
    // Large magnitudes: near each type's top of range, sums still finite.
    {
      // Q8_0's f16 scale caps |w| at 65504 * 127.
      const float wscale = type == WeightType::kF16    ? 6.0e4f
                           : type == WeightType::kQ8_0 ? 8.0e6f
                                                       : 1.0e15f;
      const TestWeight w =
          MakeWeight(type, rows, cols, opstest::RandomVector(rng, rows * cols, wscale));
      ExpectMatvecNearRef(w, opstest::RandomVector(rng, cols, 1.0e15f), 2);
    }
    // Subnormal activations and (for f16/f32) subnormal weights.
    {
      // f16 subnormals start below 6.1e-5; a Q8_0 block of 1e-5 gets a
      // subnormal f16 scale.
      const float wscale = type == WeightType::kF16    ? 5.0e-6f
                           : type == WeightType::kQ8_0 ? 1.0e-5f
                                                       : 1.0e-39f;
      const TestWeight w =
          MakeWeight(type, rows, cols, opstest::RandomVector(rng, rows * cols, wscale));
      ExpectMatvecNearRef(w, opstest::RandomVector(rng, cols, 1.0e-38f), 1);
      ExpectMatvecNearRef(w, opstest::RandomVector(rng, cols, 1.0f), 1);
    }
  }
}

TEST_P(MatvecTest, DequantizeRowsAndEmbedMatchReferenceExactly) {
  std::mt19937 rng(11);
  for (WeightType type : opstest::kAllWeightTypes) {
    const int64_t rows = 37, cols = type == WeightType::kQ8_0 ? 96 : 101;
    const TestWeight w =
        MakeWeight(type, rows, cols, opstest::RandomVector(rng, rows * cols, 3.0f));
    std::vector<float> out(static_cast<size_t>(rows * cols));
    DequantizeRows(w.view(), 0, rows, out.data());
    EXPECT_EQ(out, w.decoded) << WeightTypeName(type);
    DequantizeRows(w.view(), 5, 3, out.data());
    EXPECT_TRUE(std::equal(out.begin(), out.begin() + 3 * cols, w.decoded.begin() + 5 * cols));

    const int32_t ids[] = {0, 36, 5, 5, 17};
    std::vector<float> emb(5 * cols), emb_ref(5 * cols);
    Embed(w.view(), ids, 5, emb.data());
    EmbedRef(w.view(), ids, 5, emb_ref.data());
    EXPECT_EQ(emb, emb_ref) << WeightTypeName(type);
  }
}

TEST(WeightViewTest, Validation) {
  float data[64] = {};
  EXPECT_TRUE(ValidateWeightView({WeightType::kQ8_0, 2, 32, data}).ok());
  EXPECT_FALSE(ValidateWeightView({WeightType::kQ8_0, 2, 33, data}).ok());
  EXPECT_FALSE(ValidateWeightView({WeightType::kF32, 0, 32, data}).ok());
  EXPECT_FALSE(ValidateWeightView({WeightType::kF16, 2, 32, nullptr}).ok());
  EXPECT_EQ(RowBytes(WeightType::kQ8_0, 64), 68);
  EXPECT_EQ(RowBytes(WeightType::kBF16, 7), 14);
}

TEST(QuantizeQ8_0Test, RoundTripWithinHalfStep) {
  std::mt19937 rng(3);
  const std::vector<float> x = opstest::RandomVector(rng, 256, 4.0f);
  const TestWeight w = MakeWeight(WeightType::kQ8_0, 1, 256, x);
  for (int64_t b = 0; b < 8; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[b * 32 + j]));
    // Step d = amax / 127 (rounded to f16, relative 2^-11): error <= d/2 plus
    // the scale rounding times 127.
    const double d = amax / 127.0;
    for (int j = 0; j < 32; ++j) {
      EXPECT_NEAR(w.decoded[b * 32 + j], x[b * 32 + j], d * (0.5 + 127.0 / 2048.0));
    }
  }
}

}  // namespace
}  // namespace kvq::ops
