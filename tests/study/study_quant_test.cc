#include "study/study_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

namespace kvq {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float lo = -3.0f, float hi = 5.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

size_t DistinctValues(const std::vector<float>& x) {
  return std::set<float>(x.begin(), x.end()).size();
}

// b bits -> exactly 2^b levels: 4096 uniform values hit every level (the
// chance that one of <= 256 equal-width bins stays empty is ~256 (1-1/256)^4096
// ~ 3e-5), and never more than 2^b.
TEST(StudyQuantTest, AsymmetricHasExactlyTwoToTheBLevels) {
  for (int bits = 1; bits <= 8; ++bits) {
    const std::vector<float> x = Random(4096, 100 + bits);
    std::vector<float> out(x.size());
    FakeQuantGroup(x.data(), static_cast<int64_t>(x.size()), 1, bits, QuantFormula::kAsymmetric,
                   out.data());
    EXPECT_EQ(DistinctValues(out), size_t{1} << bits) << bits << " bits";
  }
}

// Round to nearest on a grid of step (max - min) / (2^b - 1): |x - x^| <= step / 2.
// The level lo + q * step is computed in double and rounded to f32 once, which
// adds at most half an f32 ulp of the largest magnitude (2^-24 * 5 here).
TEST(StudyQuantTest, AsymmetricErrorWithinHalfStep) {
  for (int bits : {2, 3, 4, 8}) {
    for (int64_t stride : {1, 3}) {
      const int64_t n = 77;
      const std::vector<float> x = Random(n * stride, 7 * bits + stride);
      std::vector<float> out(x.size(), 0.0f);
      FakeQuantGroup(x.data(), n, stride, bits, QuantFormula::kAsymmetric, out.data());
      float lo = INFINITY, hi = -INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        lo = std::min(lo, x[i * stride]);
        hi = std::max(hi, x[i * stride]);
      }
      const double step = (static_cast<double>(hi) - lo) / ((1 << bits) - 1);
      const double bound = step / 2 + 5.0 * std::ldexp(1.0, -24);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_LE(std::fabs(out[i * stride] - x[i * stride]), bound) << bits << " bits, i " << i;
        if (stride > 1) {
          EXPECT_EQ(out[i * stride + 1], 0.0f);  // elements between are untouched
        }
      }
      // The minimum is level 0 itself, reproduced exactly.
      float out_lo = INFINITY;
      for (int64_t i = 0; i < n; ++i) out_lo = std::min(out_lo, out[i * stride]);
      EXPECT_EQ(out_lo, lo);
    }
  }
}

TEST(StudyQuantTest, ConstantInputIsExact) {
  for (QuantFormula f : {QuantFormula::kAsymmetric, QuantFormula::kLiteralWriteup}) {
    std::vector<float> x(33, -2.71828f), out(33);
    FakeQuantGroup(x.data(), 33, 1, 2, f, out.data());
    if (f == QuantFormula::kAsymmetric) {
      EXPECT_EQ(out, x);
    } else {
      // Symmetric: the constant is the absmax, level qmax * absmax / qmax.
      for (float v : out) EXPECT_NEAR(v, -2.71828f, 1e-6f);
    }
  }
}

// The write-up's formula: scale = absmax / (2^b - 1), clamp to [-2^b, 2^b - 1].
// Since |x| <= absmax, round(x / scale) never goes below -(2^b - 1), so it
// uses 2^(b+1) - 1 levels: 7 for its "2-bit", more than a 2-bit grid's 4.
TEST(StudyQuantTest, LiteralFormulaUsesMoreThanTwoToTheBLevels) {
  for (int bits : {2, 4}) {
    const std::vector<float> x = Random(4096, 5 + bits, -1.0f, 1.0f);
    std::vector<float> out(x.size());
    FakeQuantGroup(x.data(), 4096, 1, bits, QuantFormula::kLiteralWriteup, out.data());
    EXPECT_EQ(DistinctValues(out), (size_t{2} << bits) - 1) << bits;
    EXPECT_GT(DistinctValues(out), size_t{1} << bits);
  }
}

// Per-channel groups run along tokens: a K whose every channel is constant
// over tokens is reproduced exactly per-channel but not per-token.
TEST(StudyQuantTest, PerChannelGroupsRunAlongTokens) {
  const int64_t T = 45, H = 2, D = 8;  // 45 = one group of 32 and a partial one of 13
  std::vector<float> x(T * H * D), out(x.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t c = 0; c < D; ++c) x[(t * H + h) * D + c] = 0.37f * c - 1.1f * h + 0.01f * c * c;
    }
  }
  QuantSpec spec{QuantAxis::kChannel, 2, QuantFormula::kAsymmetric, 32};
  FakeQuantize(x.data(), T, H, D, spec, out.data());
  EXPECT_EQ(out, x);
  spec.axis = QuantAxis::kToken;
  FakeQuantize(x.data(), T, H, D, spec, out.data());
  EXPECT_NE(out, x);
}

// The partial last block uses its own statistics: a jump after token 32
// would blow the error up if the block straddled it.
TEST(StudyQuantTest, PerChannelBlocksHaveTheirOwnRange) {
  const int64_t T = 40, H = 1, D = 1;
  std::vector<float> x(T), out(T);
  for (int64_t t = 0; t < T; ++t) x[t] = t < 32 ? 0.01f * t : 1000.0f + 0.01f * t;
  FakeQuantize(x.data(), T, H, D, {QuantAxis::kChannel, 2, QuantFormula::kAsymmetric, 32},
               out.data());
  // Block 0 spans [0, 0.31], step 0.31 / 3; block 1 [1000.32, 1000.39].
  for (int64_t t = 0; t < T; ++t) EXPECT_LE(std::fabs(out[t] - x[t]), 0.31 / 6 + 1e-4) << t;
}

// RunFakeQuant's sums against a direct computation for one small capture.
TEST(StudyQuantTest, MetricsMatchDirectComputation) {
  StudyCapture cap;
  cap.shape = KvShape{1, 2, 1, 8};
  cap.tokens = 9;
  const int64_t T = 9, D = 8;
  cap.layers.resize(1);
  cap.layers[0].q = Random(T * 2 * D, 1);
  cap.layers[0].k = Random(T * D, 2);
  cap.layers[0].k_pre_rope = cap.layers[0].k;
  cap.layers[0].v = Random(T * D, 3);
  FakeQuantRow row;
  row.k_axis = QuantAxis::kChannel;
  row.v_axis = QuantAxis::kToken;
  row.bits = 2;
  row.token_group = 4;
  std::vector<FakeQuantRow> rows = {row};
  ASSERT_TRUE(RunFakeQuant(cap, FakeQuantOptions{}, &rows).ok());

  std::vector<float> kq(T * D), vq(T * D);
  FakeQuantize(cap.layers[0].k.data(), T, 1, D,
               {QuantAxis::kChannel, 2, QuantFormula::kAsymmetric, 4}, kq.data());
  FakeQuantize(cap.layers[0].v.data(), T, 1, D,
               {QuantAxis::kToken, 2, QuantFormula::kAsymmetric, 4}, vq.data());
  double s_err = 0, s_ref = 0, kl = 0, o_err = 0, o_ref = 0;
  const double scale = 1.0 / std::sqrt(8.0);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> s(i + 1), sh(i + 1);
      for (int64_t j = 0; j <= i; ++j) {
        for (int64_t c = 0; c < D; ++c) {
          const double q = cap.layers[0].q[(i * 2 + h) * D + c];
          s[j] += scale * q * cap.layers[0].k[j * D + c];
          sh[j] += scale * q * kq[j * D + c];
        }
        s_err += (sh[j] - s[j]) * (sh[j] - s[j]);
        s_ref += s[j] * s[j];
      }
      double z = 0, zh = 0;
      for (int64_t j = 0; j <= i; ++j) {
        z += std::exp(s[j]);
        zh += std::exp(sh[j]);
      }
      std::vector<double> o(D), oh(D);
      for (int64_t j = 0; j <= i; ++j) {
        const double p = std::exp(s[j]) / z, ph = std::exp(sh[j]) / zh;
        kl += p * std::log(p / ph);
        for (int64_t c = 0; c < D; ++c) {
          o[c] += p * cap.layers[0].v[j * D + c];
          oh[c] += ph * vq[j * D + c];
        }
      }
      for (int64_t c = 0; c < D; ++c) {
        o_err += (oh[c] - o[c]) * (oh[c] - o[c]);
        o_ref += o[c] * o[c];
      }
    }
  }
  // f32 scores and outputs vs this double version: ~1e-6 relative; 1e-4 is loose
  // enough for the KL of 18 rows summed from f32 probabilities.
  const FakeQuantMetrics& m = rows[0].overall;
  EXPECT_NEAR(m.score_rel_error, std::sqrt(s_err / s_ref), 1e-4);
  EXPECT_NEAR(m.prob_kl, kl / (2 * T), 1e-4);
  EXPECT_NEAR(m.output_rel_error, std::sqrt(o_err / o_ref), 1e-4);
  ASSERT_EQ(rows[0].per_layer.size(), 1u);
  EXPECT_DOUBLE_EQ(rows[0].per_layer[0].score_rel_error, m.score_rel_error);
}

// The write-up's per-channel scale is the absmax over the WHOLE sequence
// (token_group 0): the jump of PerChannelBlocksHaveTheirOwnRange then lands
// in one range, and the small values before it all round to one level.
TEST(StudyQuantTest, WholeSequencePerChannelUsesOneRange) {
  const int64_t T = 40;
  std::vector<float> x(T), out(T);
  for (int64_t t = 0; t < T; ++t) x[t] = t < 32 ? 0.01f * t : 1000.0f + 0.01f * t;
  FakeQuantize(x.data(), T, 1, 1, {QuantAxis::kChannel, 2, QuantFormula::kAsymmetric, 0},
               out.data());
  // One range [0, 1000.39], step 333.46: tokens 0..31 all go to level 0.
  for (int64_t t = 0; t < 32; ++t) EXPECT_EQ(out[t], 0.0f) << t;
  // And it equals one group spanning every token.
  std::vector<float> one(T);
  FakeQuantize(x.data(), T, 1, 1, {QuantAxis::kChannel, 2, QuantFormula::kAsymmetric, T},
               one.data());
  EXPECT_EQ(out, one);
}

// Per-token groups of `channel_group` channels (KIVI's V groups) have their
// own ranges: a row whose two halves differ in scale keeps the small half
// precise only when the halves are separate groups.
TEST(StudyQuantTest, PerTokenChannelGroupsHaveTheirOwnRange) {
  const int64_t D = 64;
  std::vector<float> x(D), whole(D), halves(D);
  for (int64_t c = 0; c < D; ++c) x[c] = c < 32 ? 0.001f * c : 100.0f + c;
  FakeQuantize(x.data(), 1, 1, D, {QuantAxis::kToken, 2, QuantFormula::kAsymmetric, 32, 0},
               whole.data());
  FakeQuantize(x.data(), 1, 1, D, {QuantAxis::kToken, 2, QuantFormula::kAsymmetric, 32, 32},
               halves.data());
  double err_whole = 0, err_halves = 0;
  for (int64_t c = 0; c < 32; ++c) {
    err_whole = std::max(err_whole, static_cast<double>(std::fabs(whole[c] - x[c])));
    err_halves = std::max(err_halves, static_cast<double>(std::fabs(halves[c] - x[c])));
  }
  EXPECT_LE(err_halves, 0.031 / 6 + 1e-6);  // step 0.031 / 3 within the small half
  EXPECT_GT(err_whole, 0.01);               // the small half collapses to one level
}

// The study's rows: the write-up's four as written (literal formula,
// per-channel over the whole sequence, per-token over the head vector), the
// same four corrected with KIVI's groups, then KVQuant's; per bit width.
TEST(StudyQuantTest, StudyRowsAreTheWriteupsAsWrittenAndCorrected) {
  const std::vector<FakeQuantRow> rows = StudyFakeQuantRows({2, 4}, 32);
  ASSERT_EQ(rows.size(), 18u);
  for (int b = 0; b < 2; ++b) {
    for (int g = 0; g < 4; ++g) {
      const FakeQuantRow& w = rows[b * 9 + g];
      const FakeQuantRow& c = rows[b * 9 + 4 + g];
      EXPECT_EQ(w.name, std::string(kWriteupPrefix) + kWriteupGroupings[g]);
      EXPECT_EQ(w.family, FakeQuantFamily::kWriteup);
      EXPECT_EQ(w.formula, QuantFormula::kLiteralWriteup);
      EXPECT_EQ(w.token_group, 0);    // the whole sequence
      EXPECT_EQ(w.channel_group, 0);  // the whole head vector
      EXPECT_FALSE(w.k_pre_rope);
      EXPECT_EQ(c.name, std::string(kCorrectedPrefix) + kWriteupGroupings[g]);
      EXPECT_EQ(c.formula, QuantFormula::kAsymmetric);
      EXPECT_EQ(c.token_group, 32);
      EXPECT_EQ(c.channel_group, 32);
      EXPECT_EQ(w.k_axis, c.k_axis);
      EXPECT_EQ(w.v_axis, c.v_axis);
      EXPECT_EQ(w.bits, b == 0 ? 2 : 4);
    }
    EXPECT_TRUE(rows[b * 9 + 8].k_pre_rope);
    EXPECT_EQ(rows[b * 9 + 8].family, FakeQuantFamily::kKvQuant);
  }
  // The groupings in the write-up's order: per-token K in rows 0 and 3.
  EXPECT_EQ(rows[0].k_axis, QuantAxis::kToken);
  EXPECT_EQ(rows[1].v_axis, QuantAxis::kChannel);
  EXPECT_EQ(rows[2].v_axis, QuantAxis::kToken);
  EXPECT_EQ(rows[3].v_axis, QuantAxis::kChannel);
}

// A write-up row of RunFakeQuant is the literal formula over the whole
// sequence: its score error equals one computed from FakeQuantize with
// token_group 0, and differs from 32-token groups (the old, wrong row).
TEST(StudyQuantTest, WriteupPerChannelRowQuantizesOverTheWholeSequence) {
  StudyCapture cap;
  cap.shape = KvShape{1, 1, 1, 8};
  cap.tokens = 70;
  cap.layers.resize(1);
  cap.layers[0].q = Random(70 * 8, 41);
  cap.layers[0].k = Random(70 * 8, 42);
  for (int64_t t = 40; t < 70; ++t) cap.layers[0].k[t * 8 + 3] *= 20;  // a late outlier
  cap.layers[0].k_pre_rope = cap.layers[0].k;
  cap.layers[0].v = Random(70 * 8, 43);
  std::vector<FakeQuantRow> rows = StudyFakeQuantRows({2}, 32);
  rows.resize(2);  // as written: K,V per-token; K,V per-channel
  FakeQuantRow grouped = rows[1];
  grouped.token_group = 32;
  rows.push_back(grouped);
  ASSERT_TRUE(RunFakeQuant(cap, FakeQuantOptions{}, &rows).ok());
  std::vector<float> kq(70 * 8);
  FakeQuantize(cap.layers[0].k.data(), 70, 1, 8,
               {QuantAxis::kChannel, 2, QuantFormula::kLiteralWriteup, 0}, kq.data());
  std::vector<float> s(70 * 70), sh(70 * 70);
  const float scale = 1.0f / std::sqrt(8.0f);
  CausalScores(cap.layers[0].q.data(), cap.layers[0].k.data(), 70, 8, scale, s.data());
  CausalScores(cap.layers[0].q.data(), kq.data(), 70, 8, scale, sh.data());
  double err = 0, ref = 0;
  for (int64_t i = 0; i < 70; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      err += (sh[i * 70 + j] - s[i * 70 + j]) * (sh[i * 70 + j] - s[i * 70 + j]);
      ref += s[i * 70 + j] * s[i * 70 + j];
    }
  }
  EXPECT_NEAR(rows[1].overall.score_rel_error, std::sqrt(err / ref), 1e-6);
  EXPECT_NE(rows[1].overall.score_rel_error, rows[2].overall.score_rel_error);
}

// Scores and probabilities depend on K only: rows that share the K choice
// share those metrics, and V's choice shows only in the output error.
TEST(StudyQuantTest, VChoiceIsInvisibleToScoresButNotToOutputs) {
  StudyCapture cap;
  cap.shape = KvShape{2, 4, 2, 16};
  cap.tokens = 40;
  cap.layers.resize(2);
  for (int l = 0; l < 2; ++l) {
    cap.layers[l].q = Random(40 * 4 * 16, 10 + l);
    cap.layers[l].k = Random(40 * 2 * 16, 20 + l);
    cap.layers[l].k_pre_rope = cap.layers[l].k;
    cap.layers[l].v = Random(40 * 2 * 16, 30 + l);
  }
  std::vector<FakeQuantRow> rows = StudyFakeQuantRows({2});
  rows.resize(4);  // the write-up's four, as written
  rows.erase(
      std::remove_if(rows.begin(), rows.end(), [](const FakeQuantRow& r) { return r.k_pre_rope; }),
      rows.end());
  ASSERT_TRUE(RunFakeQuant(cap, FakeQuantOptions{}, &rows).ok());
  const FakeQuantRow& kv_channel = rows[1];  // K,V per-channel
  const FakeQuantRow& kivi = rows[2];        // K per-channel, V per-token
  EXPECT_EQ(kv_channel.overall.score_rel_error, kivi.overall.score_rel_error);
  EXPECT_EQ(kv_channel.overall.prob_kl, kivi.overall.prob_kl);
  EXPECT_NE(kv_channel.overall.output_rel_error, kivi.overall.output_rel_error);
  for (const FakeQuantRow& r : rows) {
    EXPECT_GT(r.overall.score_rel_error, 0);
    EXPECT_GE(r.overall.prob_kl, 0);
    EXPECT_EQ(r.per_layer.size(), 2u);
  }
}

// Heads run in parallel but their sums are added in head order: the same
// numbers, bit for bit, for any thread count.
TEST(StudyQuantTest, ThreadsDoNotChangeTheResult) {
  StudyCapture cap;
  cap.shape = KvShape{2, 6, 2, 16};
  cap.tokens = 50;
  cap.layers.resize(2);
  for (int l = 0; l < 2; ++l) {
    cap.layers[l].q = Random(50 * 6 * 16, 50 + l);
    cap.layers[l].k = Random(50 * 2 * 16, 60 + l);
    cap.layers[l].k_pre_rope = cap.layers[l].k;
    cap.layers[l].v = Random(50 * 2 * 16, 70 + l);
  }
  std::vector<FakeQuantRow> one = StudyFakeQuantRows({2, 4});
  one.erase(
      std::remove_if(one.begin(), one.end(), [](const FakeQuantRow& r) { return r.k_pre_rope; }),
      one.end());
  std::vector<FakeQuantRow> two = one;
  FakeQuantOptions options;
  ASSERT_TRUE(RunFakeQuant(cap, options, &one).ok());
  options.threads = 3;
  ASSERT_TRUE(RunFakeQuant(cap, options, &two).ok());
  for (size_t r = 0; r < one.size(); ++r) {
    EXPECT_EQ(one[r].overall.score_rel_error, two[r].overall.score_rel_error) << r;
    EXPECT_EQ(one[r].overall.prob_kl, two[r].overall.prob_kl) << r;
    EXPECT_EQ(one[r].overall.output_rel_error, two[r].overall.output_rel_error) << r;
    EXPECT_EQ(one[r].per_layer[1].output_rel_error, two[r].per_layer[1].output_rel_error) << r;
  }
}

TEST(StudyQuantTest, PreRopeRowNeedsRope) {
  StudyCapture cap;
  cap.shape = KvShape{1, 1, 1, 8};
  cap.tokens = 2;
  cap.layers.resize(1);
  cap.layers[0].q = cap.layers[0].k = cap.layers[0].k_pre_rope = cap.layers[0].v =
      std::vector<float>(16, 1.0f);
  std::vector<FakeQuantRow> rows = StudyFakeQuantRows({4});
  EXPECT_FALSE(RunFakeQuant(cap, FakeQuantOptions{}, &rows).ok());
}

}  // namespace
}  // namespace kvq
