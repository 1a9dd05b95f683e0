#include "study/study_json.h"

#include <span>
#include <string>

#include "study/study.h"

namespace kvq {

using Json = nlohmann::json;

Json JsonMatrix(const std::vector<std::vector<double>>& m) {
  Json out = Json::array();
  for (const auto& row : m) out.push_back(JsonVector(row));
  return out;
}

Json JsonVector(const std::vector<double>& v) {
  Json out = Json::array();
  for (double x : v) out.push_back(JsonNumber(x));
  return out;
}

namespace {

std::string Fixed(double x, int digits) {
  std::string s = std::to_string(x);
  return s.substr(0, s.find('.') + (digits > 0 ? digits + 1 : 0));
}

Json StatsJson(const std::vector<TensorStats>& heads) {
  Json out = Json::array();
  for (const TensorStats& s : heads) {
    out.push_back({{"mean_abs", JsonNumber(s.mean_abs)},
                   {"rms", JsonNumber(s.rms)},
                   {"absmax", JsonNumber(s.absmax)},
                   {"kurtosis", JsonNumber(s.kurtosis)},
                   {"token_norm_cv", JsonNumber(s.token_norm_cv)}});
  }
  return out;
}

Json KBiasJson(const std::vector<std::vector<double>>& per_head) {
  const KBiasSummary s = SummarizeKBias(per_head);
  return {{"spike_rule", "the L2 norm of a layer's whole k_proj bias > " +
                             Fixed(kBiasSpikeRatio, 1) + "x the median layer's"},
          {"layer_norms", JsonVector(s.layer_norms)},
          {"median", JsonNumber(s.median)},
          {"ratio_to_median", JsonVector(s.ratio_to_median)},
          {"spike_layers", s.spikes},
          {"boundary_spike", s.boundary_spike}};
}

}  // namespace

Json OutliersJson(const std::vector<LayerOutliers>& layers, int64_t tokens,
                  const std::vector<int32_t>& token_ids, const Tokenizer* tokenizer,
                  const std::vector<std::vector<double>>& k_bias_norms) {
  Json out;
  out["capture_tokens"] = tokens;
  out["outlier_rule"] =
      "mean |x| over tokens > " + Fixed(kOutlierRatio, 1) + "x the head's median channel";
  out["consistency_rule"] =
      "fraction of tokens whose m largest-|x| channels are exactly the m outlier channels";
  out["sink_rule"] = "mean over query heads and query rows 1..T-1 of the probability on token 0";
  out["sink_detection_rule"] =
      "token j is a sink of a (layer, query head) when the mean probability m_j it receives from "
      "the query rows i >= j + " +
      std::to_string(kSinkWindow) + " (j = 0: i >= 1) is >= " + Fixed(kSinkMinMass, 2) +
      " and >= " + Fixed(kSinkUniformRatio, 0) +
      "x u_j, the mean of 1/(i+1) over those rows, with at least " + std::to_string(kSinkWindow) +
      " such rows";
  out["k_bias"] = KBiasJson(k_bias_norms);
  Json list = Json::array();
  for (const LayerOutliers& l : layers) {
    Json j;
    j["layer"] = l.layer;
    j["k_pre_rope_channel_mean_abs"] = JsonMatrix(l.k_pre_mean_abs);
    j["k_post_rope_channel_mean_abs"] = JsonMatrix(l.k_post_mean_abs);
    j["v_channel_mean_abs"] = JsonMatrix(l.v_mean_abs);
    j["k_pre_rope_outlier_channels"] = l.k_pre_outliers;
    j["k_post_rope_outlier_channels"] = l.k_post_outliers;
    j["v_outlier_channels"] = l.v_outliers;
    j["k_pre_rope_outlier_consistency"] = JsonVector(l.k_pre_consistency);
    j["k_post_rope_outlier_consistency"] = JsonVector(l.k_post_consistency);
    j["k_pre_rope_stats"] = StatsJson(l.k_pre_stats);
    j["k_post_rope_stats"] = StatsJson(l.k_post_stats);
    j["v_stats"] = StatsJson(l.v_stats);
    j["sink_mass"] = JsonNumber(l.sink_mass);
    j["sink_mass_per_head"] = JsonVector(l.sink_mass_heads);
    Json sinks = Json::array();
    for (const AttentionSink& s : l.sinks) {
      Json e = {{"head", s.head},
                {"position", s.position},
                {"mass", JsonNumber(s.mass)},
                {"uniform_mass", JsonNumber(s.uniform)}};
      if (s.position < static_cast<int64_t>(token_ids.size())) {
        e["token_id"] = token_ids[s.position];
        const int32_t id = token_ids[s.position];
        if (tokenizer != nullptr)
          e["token_text"] = tokenizer->Decode(std::span<const int32_t>(&id, 1));
      }
      sinks.push_back(std::move(e));
    }
    j["sinks"] = std::move(sinks);
    list.push_back(std::move(j));
  }
  out["layers"] = std::move(list);
  return out;
}

namespace {

Json MetricsJson(const FakeQuantMetrics& m) {
  return Json{{"score_rel_error", JsonNumber(m.score_rel_error)},
              {"prob_kl", JsonNumber(m.prob_kl)},
              {"output_rel_error", JsonNumber(m.output_rel_error)}};
}

Json ClaimJson(const FakeQuantClaim& c) {
  return {{"id", c.id},
          {"claim", c.claim},
          {"family", c.family},
          {"bits", c.bits},
          {"metric", c.metric},
          {"baseline_row", c.baseline_row},
          {"row", c.row},
          {"baseline_value", JsonNumber(c.baseline_value)},
          {"value", JsonNumber(c.value)},
          {"ratio", JsonNumber(c.ratio)},
          {"holds", c.holds},
          {"reported_ratio", c.reported_ratio ? JsonNumber(*c.reported_ratio) : Json(nullptr)},
          {"text", c.text}};
}

}  // namespace

Json FakeQuantJson(const std::vector<FakeQuantRow>& rows, int64_t tokens, int64_t kivi_group,
                   int64_t head_dim) {
  Json out;
  out["capture_tokens"] = tokens;
  out["kivi_group"] = kivi_group;
  out["quantizers"] = {
      {"writeup",
       "the write-up's fake_quant as written: symmetric, scale = absmax / (2^b - 1), clamp to "
       "[-2^b, 2^b - 1] (2^(b+1) levels); per-channel absmax over the whole sequence, per-token "
       "over the whole head vector; K after RoPE"},
      {"corrected",
       "asymmetric min/max, exactly 2^b levels, round to nearest; KIVI's groups: per-channel "
       "over " +
           std::to_string(kivi_group) + " tokens, per-token over " + std::to_string(kivi_group) +
           " channels; K after RoPE"},
      {"kvquant", "as corrected, K quantized before RoPE and RoPE applied after dequantizing"}};
  Json list = Json::array();
  for (const FakeQuantRow& r : rows) {
    Json j = MetricsJson(r.overall);
    j["name"] = r.name;
    j["family"] = FakeQuantFamilyName(r.family);
    j["k_axis"] = QuantAxisName(r.k_axis);
    j["v_axis"] = QuantAxisName(r.v_axis);
    j["literal_formula"] = r.formula == QuantFormula::kLiteralWriteup;
    j["k_pre_rope"] = r.k_pre_rope;
    j["bits"] = r.bits;
    j["per_channel_whole_sequence"] = r.token_group == 0;
    j["per_channel_group_tokens"] = r.token_group == 0 ? tokens : r.token_group;
    j["per_token_group_channels"] = r.channel_group == 0 ? head_dim : r.channel_group;
    j["reported_score_rel_error"] = nullptr;
    for (int g = 0; g < 4 && r.family == FakeQuantFamily::kWriteup; ++g) {
      if (r.name == std::string(kWriteupPrefix) + kWriteupGroupings[g] &&
          (r.bits == 2 || r.bits == 4)) {
        j["reported_score_rel_error"] = kWriteupReported[g][r.bits == 2 ? 0 : 1];
      }
    }
    Json per_layer = Json::array();
    for (size_t l = 0; l < r.per_layer.size(); ++l) {
      Json p = MetricsJson(r.per_layer[l]);
      p["layer"] = l;
      per_layer.push_back(std::move(p));
    }
    j["per_layer"] = std::move(per_layer);
    list.push_back(std::move(j));
  }
  out["rows"] = std::move(list);
  Json claims = Json::array();
  for (const FakeQuantClaim& c : EvaluateFakeQuantClaims(rows)) claims.push_back(ClaimJson(c));
  out["claims"] = std::move(claims);
  return out;
}

Json SchemeJson(const SchemeResult& r) {
  Json j;
  j["name"] = r.spec.name;
  j["k_type"] = r.spec.k_type;
  j["v_type"] = r.spec.v_type;
  j["rotate"] = r.spec.rotate;
  j["policy"] = r.spec.policy.empty() ? Json(nullptr) : Json(r.spec.policy);
  j["baseline"] = r.baseline;
  j["k_bits_nominal"] = r.plan.k_bits;
  j["v_bits_nominal"] = r.plan.v_bits;
  j["bits_per_value"] = JsonNumber(r.bits_per_value);
  j["bytes_per_token"] = JsonNumber(r.bytes_per_token);
  j["side_bytes"] = r.plan.layout.side_bytes;
  j["compression_vs_f16"] = JsonNumber(r.compression_vs_f16);
  j["ppl"] = JsonNumber(r.ppl.ppl);
  j["ppl_error"] = JsonNumber(r.ppl.ppl_error);
  j["ppl_windows"] = r.ppl.windows;
  j["ppl_tokens_scored"] = r.ppl.tokens_scored;
  j["kl_mean"] = JsonNumber(r.kl_mean);
  j["kl_p99"] = JsonNumber(r.kl_p99);
  j["top1_agreement"] = JsonNumber(r.top1_agreement);
  Json recall = Json::array();
  for (const RecallCell& c : r.recall) {
    recall.push_back({{"context", c.context},
                      {"depth", c.depth},
                      {"correct", c.correct},
                      {"trials", c.trials},
                      {"example_answer", c.example_answer}});
  }
  j["recall"] = std::move(recall);
  j["seconds"] = JsonNumber(r.seconds);
  return j;
}

}  // namespace kvq
