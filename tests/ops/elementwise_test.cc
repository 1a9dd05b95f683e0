// RmsNorm, AddBias, SwiGlu and Softmax against their scalar twins on every
// compiled SIMD target.
#include "ops/elementwise.h"

#include <cmath>
#include <limits>

#include "ops_test_util.h"

namespace kvq::ops {
namespace {

using opstest::kEps;
using opstest::RandomVector;

// Smallest normal f32: results below it carry absolute, not relative, error.
constexpr double kMinNormal = 1.1754943508222875e-38;

class ElementwiseTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(ElementwiseTest);

const int64_t kLengths[] = {1, 3, 15, 16, 17, 64, 127, 896, 4864};

TEST_P(ElementwiseTest, RmsNormMatchesRef) {
  std::mt19937 rng(31);
  for (int64_t dim : kLengths) {
    for (float scale : {1e-3f, 1.0f, 1e15f}) {
      const int64_t n = 3;
      const std::vector<float> x = RandomVector(rng, n * dim, scale);
      const std::vector<float> w = RandomVector(rng, dim, 2.0f);
      std::vector<float> y(n * dim), ref(n * dim);
      RmsNorm(x.data(), w.data(), n, dim, 1e-6f, y.data());
      RmsNormRef(x.data(), w.data(), n, dim, 1e-6f, ref.data());
      // Sum of squares: positive terms, relative error <= gamma_dim; mean,
      // +eps, sqrt (halves it), divide, two multiplies: ~5 more roundings.
      for (int64_t i = 0; i < n * dim; ++i) {
        ASSERT_NEAR(y[i], ref[i], (dim / 2.0 + 6.0) * kEps * std::fabs(ref[i]) + kMinNormal)
            << "dim " << dim << " scale " << scale << " i " << i;
      }
      // In place gives the same bits as out of place.
      std::vector<float> inplace = x;
      RmsNorm(inplace.data(), w.data(), n, dim, 1e-6f, inplace.data());
      EXPECT_EQ(inplace, y);
    }
  }
  // All-zero rows: eps keeps the scale finite, output exactly zero.
  std::vector<float> zeros(64, 0.0f), w(64, 1.0f), y(64, 1.0f);
  RmsNorm(zeros.data(), w.data(), 1, 64, 1e-6f, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST_P(ElementwiseTest, AddBiasIsExact) {
  std::mt19937 rng(32);
  for (int64_t dim : kLengths) {
    const std::vector<float> b = RandomVector(rng, dim, 1.0f);
    std::vector<float> y = RandomVector(rng, 5 * dim, 3.0f), ref = y;
    AddBias(b.data(), 5, dim, y.data());
    AddBiasRef(b.data(), 5, dim, ref.data());
    EXPECT_EQ(y, ref) << dim;
  }
}

TEST_P(ElementwiseTest, SwiGluMatchesRef) {
  std::mt19937 rng(33);
  for (int64_t count : kLengths) {
    for (float scale : {0.01f, 4.0f, 120.0f, 1e30f}) {
      const std::vector<float> g = RandomVector(rng, count, scale);
      const std::vector<float> u = RandomVector(rng, count, 3.0f);
      std::vector<float> out(count), ref(count);
      SwiGlu(g.data(), u.data(), count, out.data());
      SwiGluRef(g.data(), u.data(), count, ref.data());
      for (int64_t i = 0; i < count; ++i) {
        // exp is 1 ulp (<= 2 eps relative), then 1 + e, reciprocal, up to
        // two products for sigmoid and two for g * sig * u: <= 8 eps, x2
        // margin. exp(-|g|) below -104 flushes to 0 (and subnormal results
        // lose bits), which only matters where silu(g) is below the
        // smallest normal times |g u|: the absolute term.
        const double tol = 16.0 * kEps * std::fabs(ref[i]) +
                           kMinNormal * (1.0 + std::fabs(static_cast<double>(g[i]) * u[i]));
        ASSERT_NEAR(out[i], ref[i], tol) << "g " << g[i] << " u " << u[i];
      }
      std::vector<float> inplace = g;
      SwiGlu(inplace.data(), u.data(), count, inplace.data());
      EXPECT_EQ(inplace, out);
    }
  }
  // Exact special values.
  const float g[] = {0.0f, -0.0f, 1e38f, -1e38f};
  const float u[] = {1.0f, 1.0f, 1.0f, 1.0f};
  float out[4];
  SwiGlu(g, u, 4, out);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 1e38f);
  EXPECT_EQ(out[3], 0.0f);
}

void ExpectSoftmaxNearRef(const std::vector<float>& x) {
  std::vector<float> y = x, ref = x;
  Softmax(y.data(), static_cast<int64_t>(y.size()));
  SoftmaxRef(ref.data(), static_cast<int64_t>(ref.size()));
  float max = -std::numeric_limits<float>::infinity();
  for (float v : x) max = std::fmax(max, v);
  double total = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    // x - max rounds with relative error eps, i.e. absolute eps|x - max| in
    // the exponent (a relative error of that size in exp); exp itself 1 ulp
    // (2 eps); the sum of positive terms gamma_n; the division eps.
    const double spread = std::isinf(x[i]) ? 0.0 : std::fabs(static_cast<double>(x[i]) - max);
    const double tol = (spread + 4.0 + static_cast<double>(x.size())) * kEps * ref[i] + kMinNormal;
    ASSERT_NEAR(y[i], ref[i], tol) << "i " << i << " of " << x.size();
    total += y[i];
  }
  EXPECT_NEAR(total, 1.0, (x.size() + 4.0) * 2 * kEps);
}

TEST_P(ElementwiseTest, SoftmaxMatchesRef) {
  std::mt19937 rng(34);
  for (int64_t count : kLengths) {
    for (float scale : {0.1f, 10.0f, 60.0f}) ExpectSoftmaxNearRef(RandomVector(rng, count, scale));
    // Large, nearly equal logits: subtracting the max keeps them finite.
    std::vector<float> big = RandomVector(rng, count, 1.0f);
    for (float& v : big) v += 1e4f;
    ExpectSoftmaxNearRef(big);
  }
  // Masked (-inf) entries become exact zeros, the rest renormalize.
  std::vector<float> masked = RandomVector(rng, 37, 2.0f);
  for (int i = 20; i < 37; ++i) masked[i] = -std::numeric_limits<float>::infinity();
  ExpectSoftmaxNearRef(masked);
  std::vector<float> y = masked;
  Softmax(y.data(), 37);
  for (int i = 20; i < 37; ++i) EXPECT_EQ(y[i], 0.0f);
  // Constant input is uniform.
  std::vector<float> flat(100, 3.0f);
  Softmax(flat.data(), 100);
  for (float v : flat) EXPECT_FLOAT_EQ(v, 0.01f);
}

}  // namespace
}  // namespace kvq::ops
