// RoPE: inverse frequencies (default and Llama-3 scaling) against values
// computed by hand, the rotation kernel against RopeRef on every SIMD
// target, and closed-form properties.
#include "ops/rope.h"

#include <cmath>
#include <numbers>

#include "ops_test_util.h"

namespace kvq::ops {
namespace {

using opstest::kEps;
using opstest::RandomVector;

class RopeTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(RopeTest);

// The f32 pipeline (pow rounded, reciprocal, and for llama3 a handful of f32
// ops) stays within a few ulp of the exact value.
constexpr double kInvFreqRelTol = 8 * kEps;

TEST(RopeInvFreqTest, DefaultMatchesHandValues) {
  // Qwen2-style: theta 1e6, head_dim 64; inv_freq[i] = 1e6^(-2i/64),
  // values from Python's float (double) arithmetic.
  const auto inv = RopeInvFreq(64, 1e6f, RopeScaling{});
  ASSERT_TRUE(inv.ok());
  ASSERT_EQ(inv->size(), 32u);
  EXPECT_EQ((*inv)[0], 1.0f);
  EXPECT_NEAR((*inv)[1], 0.6493816315762113, 0.6493816315762113 * kInvFreqRelTol);
  EXPECT_NEAR((*inv)[16], 0.001, 0.001 * kInvFreqRelTol);
  EXPECT_NEAR((*inv)[31], 1.539926526059492e-06, 1.539926526059492e-06 * kInvFreqRelTol);
}

TEST(RopeInvFreqTest, Llama3MatchesHandValues) {
  // Llama 3.1 8B config: theta 500000, head_dim 128, factor 8, low 1,
  // high 4, original context 8192. Expected values by hand (Python double):
  // wavelength 2 pi / f below 2048 keeps f, above 8192 gives f / 8, between
  // interpolates with s = (8192 / wavelength - 1) / 3.
  RopeScaling s;
  s.kind = RopeScaling::Kind::kLlama3;
  s.factor = 8.0f;
  s.low_freq_factor = 1.0f;
  s.high_freq_factor = 4.0f;
  s.original_max_position_embeddings = 8192;
  const auto inv = RopeInvFreq(128, 500000.0f, s);
  ASSERT_TRUE(inv.ok());
  ASSERT_EQ(inv->size(), 64u);
  const struct {
    int i;
    double value;
  } expected[] = {
      {0, 1.0},                     // high frequency: unchanged
      {1, 0.8146172338565447},      //
      {25, 0.005940730375674967},   // last unchanged
      {29, 0.002166570763503359},   // first smoothed (medium band)
      {31, 0.0008567514129196321},  //
      {34, 0.0001785078127679964},  // last smoothed
      {40, 3.428102195952591e-05},  // low frequency: divided by 8
      {63, 3.068925988914511e-07},  //
  };
  for (const auto& e : expected) {
    EXPECT_NEAR((*inv)[e.i], e.value, e.value * kInvFreqRelTol) << "i " << e.i;
  }
  const std::vector<double> ref = RopeInvFreqRef(128, 500000.0, s);
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR((*inv)[i], ref[i], ref[i] * kInvFreqRelTol) << "i " << i;
  }
}

TEST(RopeInvFreqTest, LinearAndErrors) {
  RopeScaling lin;
  lin.kind = RopeScaling::Kind::kLinear;
  lin.factor = 4.0f;
  const auto inv = RopeInvFreq(8, 10000.0f, lin);
  ASSERT_TRUE(inv.ok());
  EXPECT_EQ((*inv)[0], 0.25f);
  EXPECT_NEAR((*inv)[2], 0.01 / 4, 0.01 / 4 * kInvFreqRelTol);
  EXPECT_FALSE(RopeInvFreq(7, 10000.0f, RopeScaling{}).ok());
  EXPECT_FALSE(RopeInvFreq(64, 0.0f, RopeScaling{}).ok());
  EXPECT_FALSE(RopeInvFreq(2048, 10000.0f, RopeScaling{}).ok());
  RopeScaling bad = lin;
  bad.kind = RopeScaling::Kind::kLlama3;
  bad.high_freq_factor = bad.low_freq_factor;
  EXPECT_FALSE(RopeInvFreq(64, 10000.0f, bad).ok());
}

std::vector<int32_t> Positions(std::mt19937& rng, int64_t n) {
  std::uniform_int_distribution<int32_t> dist(0, 130000);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& v : p) v = dist(rng);
  p[0] = 0;
  return p;
}

TEST_P(RopeTest, MatchesRefBothLayouts) {
  std::mt19937 rng(41);
  for (RopeLayout layout : {RopeLayout::kHalves, RopeLayout::kPairs}) {
    for (int64_t head_dim : {2, 6, 34, 64, 128, 256}) {
      const auto inv = RopeInvFreq(head_dim, 1e6f, RopeScaling{});
      ASSERT_TRUE(inv.ok());
      const int64_t n_tokens = 5, n_heads = 3;
      const std::vector<int32_t> pos = Positions(rng, n_tokens);
      const std::vector<float> x = RandomVector(rng, n_tokens * n_heads * head_dim, 4.0f);
      std::vector<float> y = x, ref = x;
      Rope(layout, inv->data(), pos.data(), n_tokens, n_heads, head_dim, y.data());
      RopeRef(layout, inv->data(), pos.data(), n_tokens, n_heads, head_dim, ref.data());
      // Both use the same f32 angle. Fast rounds cos and sin to f32 (eps
      // each), then two products and a sum (or one FMA): each output is
      // within ~4 eps (|xa| + |xb|) of the double rotation; 6 for margin.
      const int64_t half = head_dim / 2;
      for (int64_t v = 0; v < n_tokens * n_heads; ++v) {
        for (int64_t i = 0; i < half; ++i) {
          const int64_t a = v * head_dim + (layout == RopeLayout::kHalves ? i : 2 * i);
          const int64_t b = v * head_dim + (layout == RopeLayout::kHalves ? i + half : 2 * i + 1);
          const double tol = 6.0 * kEps * (std::fabs(x[a]) + std::fabs(x[b]));
          ASSERT_NEAR(y[a], ref[a], tol) << "head_dim " << head_dim << " pair " << i;
          ASSERT_NEAR(y[b], ref[b], tol) << "head_dim " << head_dim << " pair " << i;
        }
      }
    }
  }
}

TEST_P(RopeTest, ClosedFormProperties) {
  std::mt19937 rng(42);
  const int64_t head_dim = 64, half = 32, n_heads = 2, n_tokens = 4;
  const auto inv = RopeInvFreq(head_dim, 10000.0f, RopeScaling{});
  ASSERT_TRUE(inv.ok());
  const int32_t pos[n_tokens] = {0, 1, 77, 32767};
  const std::vector<float> x = RandomVector(rng, n_tokens * n_heads * head_dim, 1.0f);

  for (RopeLayout layout : {RopeLayout::kHalves, RopeLayout::kPairs}) {
    std::vector<float> y = x;
    Rope(layout, inv->data(), pos, n_tokens, n_heads, head_dim, y.data());
    // Position 0 is the identity, exactly (cos 0 = 1, sin 0 = 0).
    for (int64_t i = 0; i < n_heads * head_dim; ++i) EXPECT_EQ(y[i], x[i]);
    // A rotation preserves each pair's norm.
    for (int64_t v = 0; v < n_tokens * n_heads; ++v) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = v * head_dim + (layout == RopeLayout::kHalves ? i : 2 * i);
        const int64_t b = v * head_dim + (layout == RopeLayout::kHalves ? i + half : 2 * i + 1);
        const double before = std::hypot(x[a], x[b]);
        const double after = std::hypot(y[a], y[b]);
        EXPECT_NEAR(after, before, 8 * kEps * before);
      }
    }
  }

  // The unit vector (1, 0) in pair i at position p becomes (cos, sin) of the
  // f32 angle p * inv_freq[i].
  std::vector<float> unit(head_dim, 0.0f);
  for (int64_t i = 0; i < half; ++i) unit[i] = 1.0f;  // kHalves: first of each pair
  const int32_t p77 = 77;
  Rope(RopeLayout::kHalves, inv->data(), &p77, 1, 1, head_dim, unit.data());
  for (int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(77.0f * (*inv)[i]);
    EXPECT_NEAR(unit[i], std::cos(angle), 2 * kEps);
    EXPECT_NEAR(unit[i + half], std::sin(angle), 2 * kEps);
  }

  // kHalves and kPairs are the same rotation after permuting channels:
  // halves channel i <-> pairs channel 2i, halves i + d/2 <-> pairs 2i + 1.
  std::vector<float> halves = x, pairs(x.size());
  for (int64_t v = 0; v < n_tokens * n_heads; ++v) {
    for (int64_t i = 0; i < half; ++i) {
      pairs[v * head_dim + 2 * i] = x[v * head_dim + i];
      pairs[v * head_dim + 2 * i + 1] = x[v * head_dim + i + half];
    }
  }
  Rope(RopeLayout::kHalves, inv->data(), pos, n_tokens, n_heads, head_dim, halves.data());
  Rope(RopeLayout::kPairs, inv->data(), pos, n_tokens, n_heads, head_dim, pairs.data());
  for (int64_t v = 0; v < n_tokens * n_heads; ++v) {
    for (int64_t i = 0; i < half; ++i) {
      // Same cos/sin and the same FMA shapes: equal up to the compiler's
      // choice of contraction in scalar tails (2 eps of the pair's size).
      const double tol =
          2 * kEps * (std::fabs(x[v * head_dim + i]) + std::fabs(x[v * head_dim + i + half]));
      EXPECT_NEAR(pairs[v * head_dim + 2 * i], halves[v * head_dim + i], tol);
      EXPECT_NEAR(pairs[v * head_dim + 2 * i + 1], halves[v * head_dim + i + half], tol);
    }
  }
}

// RopeTable (coarse rows per `step` positions times fine rows) against
// Rope: bit-identical at multiples of step (the fine row is cos 1, sin 0
// there), and elsewhere within the rounding of the angle, which the factoring
// changes: Rope rotates by a = f32(p inv), the table by f32(c step inv) +
// f32(f inv); both are within half an ulp of the exact angle p inv (C and F
// are smaller than p inv, so their ulps are too), so |a - a_table| <=
// 1.5 ulp(a). A pair (x1, x2) rotated by angles that differ by d moves by
// |d| * |(x1, x2)|; the table's cos/sin products and the rotation add a few
// eps (8 eps of |x1| + |x2| covers them with margin).
TEST_P(RopeTest, TableMatchesRopeWithinAngleRounding) {
  std::mt19937 rng(43);
  for (RopeLayout layout : {RopeLayout::kHalves, RopeLayout::kPairs}) {
    for (int64_t head_dim : {2, 34, 64, 128}) {
      for (int64_t step : {1, 16, 48}) {
        const auto inv = RopeInvFreq(head_dim, 1e6f, RopeScaling{});
        ASSERT_TRUE(inv.ok());
        const int64_t max_positions = 40000, half = head_dim / 2;
        auto table = RopeTable::Make(layout, *inv, max_positions, step);
        ASSERT_TRUE(table.ok()) << table.status().message();
        EXPECT_EQ(RopeTable::Bytes(head_dim, max_positions, step),
                  static_cast<size_t>(((max_positions + step - 1) / step + step) * head_dim * 4));
        // A run of rows across a coarse boundary, near 0 and near the end.
        for (int64_t first : {int64_t{0}, int64_t{700} * step - 7, max_positions - 37}) {
          const int64_t n = 37;
          const std::vector<float> x = RandomVector(rng, n * head_dim, 4.0f);
          std::vector<float> y = x, rope = x;
          std::vector<int32_t> pos(n);
          for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(first + t);
          table->Apply(first, n, y.data());
          Rope(layout, inv->data(), pos.data(), n, 1, head_dim, rope.data());
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t i = 0; i < half; ++i) {
              const int64_t a = t * head_dim + (layout == RopeLayout::kHalves ? i : 2 * i);
              const int64_t b =
                  t * head_dim + (layout == RopeLayout::kHalves ? i + half : 2 * i + 1);
              if (pos[t] % step == 0) {
                ASSERT_EQ(y[a], rope[a]) << "position " << pos[t];
                ASSERT_EQ(y[b], rope[b]) << "position " << pos[t];
                continue;
              }
              const float angle = static_cast<float>(pos[t]) * (*inv)[i];
              const double ulp = std::nextafter(angle, INFINITY) - angle;
              const double size = std::hypot(x[a], x[b]);
              const double tol = 1.5 * ulp * size + 8 * kEps * (std::fabs(x[a]) + std::fabs(x[b]));
              ASSERT_NEAR(y[a], rope[a], tol) << "position " << pos[t] << " pair " << i;
              ASSERT_NEAR(y[b], rope[b], tol) << "position " << pos[t] << " pair " << i;
            }
          }
        }
      }
    }
  }
  EXPECT_FALSE(RopeTable::Make(RopeLayout::kHalves, {}, 10, 1).ok());
  EXPECT_FALSE(RopeTable::Make(RopeLayout::kHalves, {1.0f}, 0, 1).ok());
  EXPECT_FALSE(RopeTable::Make(RopeLayout::kHalves, {1.0f}, 10, 0).ok());
}

}  // namespace
}  // namespace kvq::ops
