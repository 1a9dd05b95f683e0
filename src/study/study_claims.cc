#include "study/study_claims.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvq {
namespace {

const FakeQuantRow* Find(const std::vector<FakeQuantRow>& rows, const std::string& name, int bits) {
  for (const FakeQuantRow& r : rows) {
    if (r.name == name && r.bits == bits) return &r;
  }
  return nullptr;
}

double Metric(const FakeQuantMetrics& m, const std::string& metric) {
  if (metric == "prob_kl") return m.prob_kl;
  if (metric == "output_rel_error") return m.output_rel_error;
  return m.score_rel_error;
}

const char* MetricWords(const std::string& metric) {
  if (metric == "prob_kl") return "attention KL";
  if (metric == "output_rel_error") return "attention output error";
  return "score error";
}

std::string Number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", x);
  return buf;
}

std::string Ratio(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2fx", x);
  return buf;
}

struct ClaimSpec {
  const char* id;
  const char* claim;
  const char* what;                 // "per-channel K" in "per-channel K cuts the score error 1.3x"
  int baseline_grouping, grouping;  // indices into kWriteupGroupings; -1 = the KVQuant row
  const char* baseline_prefix;      // prefix of the baseline row (kWriteupPrefix...)
  const char* metric;
  bool equality;
};

// The row name for a grouping under a family prefix (or the KVQuant row).
std::string RowName(const char* prefix, int grouping) {
  if (grouping < 0) return "K per-channel pre-RoPE, V per-token (KVQuant-style)";
  return std::string(prefix) + kWriteupGroupings[grouping];
}

FakeQuantClaim Evaluate(const ClaimSpec& spec, const char* family, const FakeQuantRow& base,
                        const FakeQuantRow& row) {
  FakeQuantClaim c;
  c.id = spec.id;
  c.claim = spec.claim;
  c.family = family;
  c.bits = row.bits;
  c.metric = spec.metric;
  c.baseline_row = base.name;
  c.row = row.name;
  c.baseline_value = Metric(base.overall, spec.metric);
  c.value = Metric(row.overall, spec.metric);
  c.ratio = c.value > 0 ? c.baseline_value / c.value : (c.baseline_value > 0 ? INFINITY : 1.0);
  const std::string bits = " at " + std::to_string(row.bits) + " bits";
  const std::string numbers = " (" + Number(c.baseline_value) + " -> " + Number(c.value) + ")";
  if (spec.equality) {
    const double scale = std::max(std::fabs(c.baseline_value), std::fabs(c.value));
    c.holds = std::fabs(c.baseline_value - c.value) <= 1e-9 * scale;
    c.text = std::string(spec.what) + (c.holds ? " leaves the " : " changes the ") +
             MetricWords(spec.metric) + numbers + bits;
  } else {
    c.holds = c.ratio > 1.0;
    c.text = std::string(spec.what) + (c.holds ? " cuts the " : " raises the ") +
             MetricWords(spec.metric) + " " + Ratio(c.holds ? c.ratio : 1.0 / c.ratio) + numbers +
             bits;
  }
  return c;
}

}  // namespace

std::vector<FakeQuantClaim> EvaluateFakeQuantClaims(const std::vector<FakeQuantRow>& rows) {
  // Groupings: 0 K,V per-token; 1 K,V per-channel; 2 K per-channel + V
  // per-token (KIVI); 3 K per-token + V per-channel.
  static const ClaimSpec kSpecs[] = {
      {"per_channel_k_score",
       "per-channel K quantization has a lower attention-score error than per-token (the "
       "write-up's table)",
       "per-channel K", 0, 2, nullptr, "score_rel_error", false},
      {"per_channel_k_kl", "per-channel K also lowers the attention-probability KL",
       "per-channel K", 0, 2, nullptr, "prob_kl", false},
      {"v_invisible_to_scores",
       "the V grouping does not change the score error (the write-up's rows pair up by K)",
       "the V grouping", 2, 1, nullptr, "score_rel_error", true},
      {"per_token_v_output",
       "V should be quantized per token: per-token V has a lower attention-output error than "
       "per-channel V (SCHEMES.md)",
       "per-token V", 1, 2, nullptr, "output_rel_error", false},
      {"pre_rope_k_score",
       "per-channel K quantized before RoPE has a lower score error than after RoPE (KVQuant)",
       "pre-RoPE per-channel K", 2, -1, kCorrectedPrefix, "score_rel_error", false},
      {"literal_formula_finer",
       "the write-up's quantizer has 2^(b+1) levels, so its b-bit error is lower than a true "
       "b-bit quantizer's (SCHEMES.md)",
       "the write-up's formula", 0, 0, kCorrectedPrefix, "score_rel_error", false},
  };
  std::vector<int> bits_list;
  for (const FakeQuantRow& r : rows) {
    if (std::find(bits_list.begin(), bits_list.end(), r.bits) == bits_list.end())
      bits_list.push_back(r.bits);
  }
  std::vector<FakeQuantClaim> claims;
  for (const ClaimSpec& spec : kSpecs) {
    for (int bits : bits_list) {
      // Claims about groupings are checked in both families (as written and
      // corrected); cross-family claims once, on the family the row is in.
      const bool cross = spec.baseline_prefix != nullptr;
      for (const char* prefix : {kWriteupPrefix, kCorrectedPrefix}) {
        if (cross && prefix == kWriteupPrefix && spec.grouping < 0) continue;
        if (cross && spec.grouping >= 0 && prefix == kCorrectedPrefix) continue;
        const std::string base_name =
            RowName(cross ? spec.baseline_prefix : prefix, spec.baseline_grouping);
        const std::string row_name = RowName(prefix, spec.grouping);
        const FakeQuantRow* base = Find(rows, base_name, bits);
        const FakeQuantRow* row = Find(rows, row_name, bits);
        if (base == nullptr || row == nullptr) continue;
        FakeQuantClaim c = Evaluate(spec, FakeQuantFamilyName(row->family), *base, *row);
        if (std::string(spec.id) == "per_channel_k_score" && prefix == kWriteupPrefix &&
            (bits == 2 || bits == 4)) {
          const int b = bits == 2 ? 0 : 1;
          c.reported_ratio = kWriteupReported[0][b] / kWriteupReported[2][b];
        }
        claims.push_back(std::move(c));
      }
    }
  }
  return claims;
}

}  // namespace kvq
