// The write-up's claims decided from fake-quant rows: ratios, verdicts and
// texts come from the rows' numbers.
#include "study/study_claims.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvq {
namespace {

// Rows of StudyFakeQuantRows({2}) with chosen overall metrics.
std::vector<FakeQuantRow> Rows(const std::vector<double>& score, const std::vector<double>& out) {
  std::vector<FakeQuantRow> rows = StudyFakeQuantRows({2}, 32);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].overall.score_rel_error = score[i];
    rows[i].overall.prob_kl = score[i] * score[i];
    rows[i].overall.output_rel_error = out[i];
  }
  return rows;
}

const FakeQuantClaim* Find(const std::vector<FakeQuantClaim>& claims, const std::string& id,
                           const std::string& family) {
  for (const FakeQuantClaim& c : claims) {
    if (c.id == id && c.family == family) return &c;
  }
  return nullptr;
}

TEST(StudyClaimsTest, RatiosAndVerdictsComeFromTheRows) {
  // Rows: 0-3 as written (tok/tok, ch/ch, ch/tok, tok/ch), 4-7 corrected, 8 KVQuant.
  const std::vector<FakeQuantRow> rows = Rows({0.786, 0.623, 0.623, 0.786, 0.9, 0.6, 0.6, 0.9, 0.5},
                                              {0.5, 0.45, 0.4, 0.55, 0.7, 0.5, 0.6, 0.8, 0.55});
  const std::vector<FakeQuantClaim> claims = EvaluateFakeQuantClaims(rows);
  const FakeQuantClaim* k = Find(claims, "per_channel_k_score", "writeup");
  ASSERT_NE(k, nullptr);
  EXPECT_NEAR(k->ratio, 0.786 / 0.623, 1e-12);
  EXPECT_TRUE(k->holds);
  ASSERT_TRUE(k->reported_ratio.has_value());
  EXPECT_NEAR(*k->reported_ratio, 0.786 / 0.623, 1e-12);  // these rows are the write-up's figures
  EXPECT_NE(k->text.find("per-channel K cuts the score error 1.26x (0.786 -> 0.623) at 2 bits"),
            std::string::npos)
      << k->text;
  const FakeQuantClaim* kc = Find(claims, "per_channel_k_score", "corrected");
  ASSERT_NE(kc, nullptr);
  EXPECT_NEAR(kc->ratio, 1.5, 1e-12);
  EXPECT_FALSE(kc->reported_ratio.has_value());
  // V per-token (row 2 / 6) vs per-channel (row 1 / 5) on the output error:
  // as written 0.45 -> 0.4 holds; corrected 0.5 -> 0.6 fails, said as "raises".
  const FakeQuantClaim* v = Find(claims, "per_token_v_output", "writeup");
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(v->holds);
  const FakeQuantClaim* vc = Find(claims, "per_token_v_output", "corrected");
  ASSERT_NE(vc, nullptr);
  EXPECT_FALSE(vc->holds);
  EXPECT_NEAR(vc->ratio, 0.5 / 0.6, 1e-12);
  EXPECT_NE(vc->text.find("raises the attention output error 1.20x"), std::string::npos)
      << vc->text;
  // Equality: rows 1 and 2 share K, so their score errors are equal.
  const FakeQuantClaim* eq = Find(claims, "v_invisible_to_scores", "writeup");
  ASSERT_NE(eq, nullptr);
  EXPECT_TRUE(eq->holds);
  // KVQuant's pre-RoPE K (row 8) vs corrected KIVI K (row 6): 0.6 / 0.5.
  const FakeQuantClaim* pre = Find(claims, "pre_rope_k_score", "kvquant");
  ASSERT_NE(pre, nullptr);
  EXPECT_NEAR(pre->ratio, 1.2, 1e-12);
  EXPECT_EQ(pre->baseline_row, rows[6].name);
  // The literal formula (row 0) vs the corrected per-token row (row 4): 0.9 / 0.786.
  const FakeQuantClaim* lit = Find(claims, "literal_formula_finer", "writeup");
  ASSERT_NE(lit, nullptr);
  EXPECT_NEAR(lit->ratio, 0.9 / 0.786, 1e-12);
}

TEST(StudyClaimsTest, UnequalScoresBreakTheEqualityClaim) {
  std::vector<FakeQuantRow> rows = Rows({0.8, 0.6, 0.61, 0.8, 0.9, 0.6, 0.6, 0.9, 0.5},
                                        {0.5, 0.45, 0.4, 0.55, 0.7, 0.5, 0.6, 0.8, 0.55});
  const std::vector<FakeQuantClaim> claims = EvaluateFakeQuantClaims(rows);
  const FakeQuantClaim* eq = Find(claims, "v_invisible_to_scores", "writeup");
  ASSERT_NE(eq, nullptr);
  EXPECT_FALSE(eq->holds);
}

TEST(StudyClaimsTest, AbsentRowsLeaveTheirClaimsOut) {
  std::vector<FakeQuantRow> rows = StudyFakeQuantRows({2}, 32);
  rows.resize(4);  // only the write-up's rows
  const std::vector<FakeQuantClaim> claims = EvaluateFakeQuantClaims(rows);
  EXPECT_NE(Find(claims, "per_channel_k_score", "writeup"), nullptr);
  EXPECT_EQ(Find(claims, "per_channel_k_score", "corrected"), nullptr);
  EXPECT_EQ(Find(claims, "pre_rope_k_score", "kvquant"), nullptr);
  EXPECT_EQ(Find(claims, "literal_formula_finer", "writeup"), nullptr);
}

}  // namespace
}  // namespace kvq
