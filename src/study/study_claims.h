// kvq study: which claims of the write-up (and of SCHEMES.md's "why the
// structure matters") hold on this model, and by how much, computed from the
// fake-quant rows. Every figure in a claim's text comes from the rows; the
// only quoted numbers are the write-up's own (kWriteupReported), shown beside
// the measured ratio and labelled as reported.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "study/study_quant.h"

namespace kvq {

struct FakeQuantClaim {
  std::string id;      // e.g. "per_channel_k_score"; one id per claim, repeated per bits/family
  std::string claim;   // the claim in words, as the write-up or SCHEMES.md makes it
  std::string family;  // FakeQuantFamilyName of the rows compared ("writeup", "corrected")
  int bits = 0;
  std::string metric;        // "score_rel_error", "prob_kl" or "output_rel_error"
  std::string baseline_row;  // the row the claim says is worse
  std::string row;           // the row the claim says is better (or equal)
  double baseline_value = 0, value = 0;
  // baseline_value / value: above 1 the claimed improvement exists (for an
  // "equal" claim, 1 exactly).
  double ratio = 0;
  bool holds = false;
  std::optional<double> reported_ratio;  // the same ratio in the write-up's table
  std::string text;                      // one sentence with the measured numbers
};

// The claims the rows can decide (a claim whose rows are absent is left out).
// An improvement claim holds when the ratio exceeds 1; an equality claim when
// the two values are equal to 1e-9 relative (they are computed from the same
// scores, so any difference is a bug, not noise).
std::vector<FakeQuantClaim> EvaluateFakeQuantClaims(const std::vector<FakeQuantRow>& rows);

}  // namespace kvq
