// The report's charts of the cache's structure: k_proj bias norms per layer
// (the Qwen2 boundary-layer spike), attention sinks per layer and query head,
// and the value statistics of K (before and after RoPE) and V per layer.
#include <algorithm>
#include <string>
#include <vector>

#include "study/study_report_internal.h"
#include "study/study_report_json.h"

namespace kvq::study_report {

namespace {

using nlohmann::json;
using study_json::ArrayMember;
using study_json::AsNumber;
using study_json::BoolMember;
using study_json::Index;
using study_json::IntMember;
using study_json::Join;
using study_json::NumberMember;
using study_json::NumberOrNull;
using study_json::ObjectMember;
using study_json::StringMember;

StatusOr<const json*> OutlierLayers(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* outliers, ObjectMember(study, "outliers", ""));
  if (outliers == nullptr) return static_cast<const json*>(nullptr);
  KVQ_ASSIGN_OR_RETURN(const json* layers, ArrayMember(*outliers, "layers", "outliers"));
  if (layers == nullptr || layers->empty()) return static_cast<const json*>(nullptr);
  return layers;
}

}  // namespace

StatusOr<MaybeChart> KBiasChart(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* outliers, ObjectMember(study, "outliers", ""));
  if (outliers == nullptr) return MaybeChart();
  KVQ_ASSIGN_OR_RETURN(const json* bias, ObjectMember(*outliers, "k_bias", "outliers"));
  if (bias == nullptr) return MaybeChart();
  KVQ_ASSIGN_OR_RETURN(const json* norms, ArrayMember(*bias, "layer_norms", "outliers.k_bias"));
  KVQ_ASSIGN_OR_RETURN(const json* ratios,
                       ArrayMember(*bias, "ratio_to_median", "outliers.k_bias"));
  KVQ_ASSIGN_OR_RETURN(const json* spikes, ArrayMember(*bias, "spike_layers", "outliers.k_bias"));
  KVQ_ASSIGN_OR_RETURN(std::string rule, StringMember(*bias, "spike_rule", "outliers.k_bias"));
  KVQ_ASSIGN_OR_RETURN(bool boundary, BoolMember(*bias, "boundary_spike", "outliers.k_bias"));
  if (norms == nullptr || norms->empty()) return MaybeChart();
  std::vector<int64_t> spike_list;
  for (size_t i = 0; spikes != nullptr && i < spikes->size(); ++i) {
    KVQ_ASSIGN_OR_RETURN(std::optional<double> l,
                         AsNumber((*spikes)[i], Index("outliers.k_bias.spike_layers", i)));
    if (l) spike_list.push_back(static_cast<int64_t>(*l));
  }
  json values = json::array();
  for (size_t l = 0; l < norms->size(); ++l) {
    KVQ_ASSIGN_OR_RETURN(std::optional<double> n,
                         AsNumber((*norms)[l], Index("outliers.k_bias.layer_norms", l)));
    std::optional<double> r;
    if (ratios != nullptr && l < ratios->size()) {
      KVQ_ASSIGN_OR_RETURN(r, AsNumber((*ratios)[l], Index("outliers.k_bias.ratio_to_median", l)));
    }
    const bool spike = std::find(spike_list.begin(), spike_list.end(), static_cast<int64_t>(l)) !=
                       spike_list.end();
    values.push_back({{"layer", l},
                      {"norm", NumberOrNull(n)},
                      {"ratio", NumberOrNull(r)},
                      {"kind", spike ? "spike" : "ordinary"}});
  }
  json spec = BaseSpec();
  spec["data"] = {{"values", values}};
  spec["width"] = 560;
  spec["height"] = 220;
  spec["mark"] = {{"type", "bar"}};
  spec["encoding"] = {
      {"x", {{"field", "layer"}, {"type", "ordinal"}, {"axis", {{"labelAngle", 0}}}}},
      {"y", {{"field", "norm"}, {"type", "quantitative"}, {"title", "||k_proj bias|| (L2)"}}},
      {"color",
       {{"field", "kind"},
        {"type", "nominal"},
        {"title", nullptr},
        {"scale", {{"domain", {"spike", "ordinary"}}, {"range", {"#d62728", "#4c78a8"}}}}}},
      {"tooltip",
       Tooltip({{"layer", "ordinal"}, {"norm", "quantitative"}, {"ratio", "quantitative"}})}};
  std::string caption =
      "The L2 norm of each layer's k_proj bias (every KV head together). The bias is added to "
      "every key, so a large one shifts every key by the same vector: harmless for per-channel "
      "quantization (each channel's offset absorbs it), costly for per-token schemes whose range "
      "it widens. Qwen2-family models carry a huge bias in their first and last layers. Rule: " +
      rule + ". ";
  if (spike_list.empty()) {
    caption += "No layer is flagged on this model.";
  } else {
    caption += "Flagged (red): layer";
    for (size_t i = 0; i < spike_list.size(); ++i) {
      caption += (i ? ", " : spike_list.size() > 1 ? "s " : " ") + std::to_string(spike_list[i]);
    }
    caption += boundary ? " (a boundary-layer spike: consider the policy '*: X; 0,-1: f16')." : ".";
  }
  return MaybeChart(StudyChart{"k-bias", "k_proj bias norm per layer", caption, std::move(spec)});
}

// One layer's cells: per query head, token 0's mass and the strongest other
// sink's (0 and "none" where the layer has none for that head). Counts the
// other sinks into *other_sinks.
Status AppendSinkCells(const json& layer, size_t i, json* values, int64_t* other_sinks) {
  const std::string path = Index("outliers.layers", i);
  KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> index, IntMember(layer, "layer", path));
  const int64_t l = index.value_or(static_cast<int64_t>(i));
  KVQ_ASSIGN_OR_RETURN(const json* heads, ArrayMember(layer, "sink_mass_per_head", path));
  KVQ_ASSIGN_OR_RETURN(const json* sinks, ArrayMember(layer, "sinks", path));
  if (heads == nullptr) return Status::Ok();
  std::vector<std::optional<double>> other(heads->size());
  std::vector<std::string> other_label(heads->size());
  for (size_t s = 0; sinks != nullptr && s < sinks->size(); ++s) {
    const std::string spath = Index(Join(path, "sinks"), s);
    KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> head, IntMember((*sinks)[s], "head", spath));
    KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> pos, IntMember((*sinks)[s], "position", spath));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> mass, NumberMember((*sinks)[s], "mass", spath));
    KVQ_ASSIGN_OR_RETURN(std::string text, StringMember((*sinks)[s], "token_text", spath));
    if (!head || !pos || !mass || *pos == 0 || *head < 0 ||
        static_cast<size_t>(*head) >= other.size()) {
      continue;
    }
    ++*other_sinks;
    if (!other[*head] || *mass > *other[*head]) {
      other[*head] = mass;
      other_label[*head] = "token " + std::to_string(*pos) + " " + text;
    }
  }
  for (size_t h = 0; h < heads->size(); ++h) {
    KVQ_ASSIGN_OR_RETURN(std::optional<double> m0,
                         AsNumber((*heads)[h], Index(Join(path, "sink_mass_per_head"), h)));
    values->push_back({{"layer", l},
                       {"head", h},
                       {"kind", "token 0"},
                       {"mass", NumberOrNull(m0)},
                       {"sink", "token 0"}});
    values->push_back({{"layer", l},
                       {"head", h},
                       {"kind", "strongest other sink"},
                       {"mass", other[h] ? json(*other[h]) : json(0.0)},
                       {"sink", other[h] ? other_label[h] : "none"}});
  }
  return Status::Ok();
}

json SinkSpec(json values) {
  json spec = BaseSpec();
  spec["data"] = {{"values", std::move(values)}};
  spec["facet"] = {{"column",
                    {{"field", "kind"},
                     {"type", "nominal"},
                     {"sort", {"token 0", "strongest other sink"}},
                     {"title", nullptr}}}};
  spec["spec"] = {{"width", {{"step", 16}}},
                  {"height", {{"step", 14}}},
                  {"mark", "rect"},
                  {"encoding",
                   {{"x", {{"field", "head"}, {"type", "ordinal"}, {"title", "query head"}}},
                    {"y", {{"field", "layer"}, {"type", "ordinal"}, {"title", "layer"}}},
                    {"color",
                     {{"field", "mass"},
                      {"type", "quantitative"},
                      {"title", "attention mass"},
                      {"scale", {{"domain", {0, 1}}, {"scheme", "viridis"}}}}},
                    {"tooltip", Tooltip({{"layer", "ordinal"},
                                         {"head", "ordinal"},
                                         {"kind", "nominal"},
                                         {"sink", "nominal"},
                                         {"mass", "quantitative"}})}}}};
  return spec;
}

StatusOr<MaybeChart> SinkChart(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* layers, OutlierLayers(study));
  if (layers == nullptr) return MaybeChart();
  json values = json::array();
  int64_t other_sinks = 0;
  for (size_t i = 0; i < layers->size(); ++i) {
    KVQ_RETURN_IF_ERROR(AppendSinkCells((*layers)[i], i, &values, &other_sinks));
  }
  if (values.empty()) return MaybeChart();
  KVQ_ASSIGN_OR_RETURN(const json* outliers, ObjectMember(study, "outliers", ""));
  KVQ_ASSIGN_OR_RETURN(std::string rule,
                       StringMember(*outliers, "sink_detection_rule", "outliers"));
  std::string caption =
      "Left: the mean attention probability each (layer, query head) puts on the first token, "
      "over every later query. Right: the strongest other token that draws attention like a "
      "sink (KVSink-style), 0 where none passes the rule. Sinks concentrate attention on a few "
      "tokens, so an error in their keys or values reaches every query: a reason to keep them "
      "in full precision. " +
      std::to_string(other_sinks) + " (head, token) sinks besides token 0 on this capture.";
  if (!rule.empty()) caption += " Rule: " + rule + ".";
  return MaybeChart(StudyChart{"sinks", "Attention sinks per layer and head", caption,
                               SinkSpec(std::move(values))});
}

StatusOr<MaybeChart> TensorStatsChart(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* layers, OutlierLayers(study));
  if (layers == nullptr) return MaybeChart();
  struct Tensor {
    const char* key;
    const char* label;
  };
  const Tensor tensors[] = {
      {"k_pre_rope_stats", "K pre-RoPE"}, {"k_post_rope_stats", "K post-RoPE"}, {"v_stats", "V"}};
  json values = json::array();
  for (size_t i = 0; i < layers->size(); ++i) {
    const std::string path = Index("outliers.layers", i);
    const json& layer = (*layers)[i];
    KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> index, IntMember(layer, "layer", path));
    const int64_t l = index.value_or(static_cast<int64_t>(i));
    for (const Tensor& t : tensors) {
      KVQ_ASSIGN_OR_RETURN(const json* heads, ArrayMember(layer, t.key, path));
      for (size_t h = 0; heads != nullptr && h < heads->size(); ++h) {
        const std::string hpath = Index(Join(path, t.key), h);
        KVQ_ASSIGN_OR_RETURN(std::optional<double> rms, NumberMember((*heads)[h], "rms", hpath));
        KVQ_ASSIGN_OR_RETURN(std::optional<double> absmax,
                             NumberMember((*heads)[h], "absmax", hpath));
        KVQ_ASSIGN_OR_RETURN(std::optional<double> kurt,
                             NumberMember((*heads)[h], "kurtosis", hpath));
        KVQ_ASSIGN_OR_RETURN(std::optional<double> cv,
                             NumberMember((*heads)[h], "token_norm_cv", hpath));
        std::optional<double> peak;
        if (rms && absmax && *rms > 0) peak = *absmax / *rms;
        const std::pair<const char*, std::optional<double>> metrics[] = {
            {"peak / rms", peak}, {"kurtosis", kurt}, {"token-norm CV", cv}, {"rms", rms}};
        for (const auto& [name, v] : metrics) {
          values.push_back({{"tensor", t.label},
                            {"layer", l},
                            {"head", h},
                            {"metric", name},
                            {"value", NumberOrNull(v)}});
        }
      }
    }
  }
  if (values.empty()) return MaybeChart();
  json spec = BaseSpec();
  spec["data"] = {{"values", values}};
  spec["transform"] = {{{"filter", "isValid(datum.value)"}}};
  spec["facet"] = {{"column",
                    {{"field", "metric"},
                     {"type", "nominal"},
                     {"sort", {"peak / rms", "kurtosis", "token-norm CV", "rms"}},
                     {"title", nullptr}}}};
  spec["spec"] = {{"width", 200},
                  {"height", 180},
                  {"mark", {{"type", "line"}, {"point", true}}},
                  {"encoding",
                   // Quantitative: a 30-layer model gets round ticks, not 30 labels.
                   {{"x",
                     {{"field", "layer"},
                      {"type", "quantitative"},
                      {"axis", {{"format", "d"}, {"tickMinStep", 1}}}}},
                    {"y",
                     {{"aggregate", "mean"},
                      {"field", "value"},
                      {"type", "quantitative"},
                      {"title", "mean over KV heads"}}},
                    {"color",
                     {{"field", "tensor"},
                      {"type", "nominal"},
                      {"sort", {"K pre-RoPE", "K post-RoPE", "V"}},
                      {"title", nullptr}}}}}};
  spec["resolve"] = {{"scale", {{"y", "independent"}}}};
  return MaybeChart(StudyChart{
      "tensor-stats", "Value statistics of K and V per layer",
      "Per layer (mean over KV heads) of the captured K before and after RoPE and of V: "
      "peak / rms is the largest |x| over the root mean square (how far the extreme values stand "
      "out, which sets a min/max quantizer's step), kurtosis the fourth standardized moment (3 "
      "for a Gaussian; heavy tails above), token-norm CV the spread of the per-token vector "
      "norms (a per-token scale absorbs it), rms the scale itself.",
      std::move(spec)});
}

}  // namespace kvq::study_report

namespace kvq::study_report {

StatusOr<std::string> ClaimsTable(const nlohmann::json& study) {
  using study_json::ArrayMember;
  using study_json::BoolMember;
  using study_json::Index;
  using study_json::IntMember;
  using study_json::NumberMember;
  using study_json::ObjectMember;
  using study_json::StringMember;
  KVQ_ASSIGN_OR_RETURN(const nlohmann::json* fq, ObjectMember(study, "fake_quant", ""));
  if (fq == nullptr) return std::string();
  KVQ_ASSIGN_OR_RETURN(const nlohmann::json* claims, ArrayMember(*fq, "claims", "fake_quant"));
  if (claims == nullptr || claims->empty()) return std::string();
  std::string out =
      "<h3>Which claims hold on this model</h3>\n<div class=\"scroll\"><table>\n" +
      TableRow({"claim", "rows", "bits", "measured", "ratio", "write-up reported", "verdict"},
               "th");
  for (size_t i = 0; i < claims->size(); ++i) {
    const std::string path = Index("fake_quant.claims", i);
    const nlohmann::json& c = (*claims)[i];
    KVQ_ASSIGN_OR_RETURN(std::string claim, StringMember(c, "claim", path));
    KVQ_ASSIGN_OR_RETURN(std::string family, StringMember(c, "family", path));
    KVQ_ASSIGN_OR_RETURN(std::string text, StringMember(c, "text", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> bits, IntMember(c, "bits", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> ratio, NumberMember(c, "ratio", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> reported, NumberMember(c, "reported_ratio", path));
    KVQ_ASSIGN_OR_RETURN(bool holds, BoolMember(c, "holds", path));
    out += TableRow({EscapeHtml(claim), EscapeHtml(family), bits ? std::to_string(*bits) : "",
                     EscapeHtml(text), ratio ? FormatNumber("%.2f&times;", *ratio) : "&ndash;",
                     reported ? FormatNumber("%.2f&times;", *reported) : "",
                     holds ? "<b>holds</b>" : "<b>fails</b>"});
  }
  out +=
      "</table></div>\n<p class=\"caption\">Each claim compares two fake-quant rows above on "
      "one metric; <i>ratio</i> is the first row's error over the second's (above 1: the "
      "claimed improvement is there). <i>writeup</i> rows use the write-up's quantizer as "
      "written; <i>corrected</i> rows true b-bit quantizers with KIVI's groups. The write-up's "
      "own ratio is quoted where it reported one (on Qwen2.5-0.5B).</p>\n";
  return out;
}

}  // namespace kvq::study_report
