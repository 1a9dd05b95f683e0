// Vega-Lite specs of the study report, built from the study JSON (data
// inlined). Each builder returns no chart when its section is absent or empty
// and an error naming the field when the section has the wrong shape.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "study/study_report.h"
#include "study/study_report_internal.h"
#include "study/study_report_json.h"

namespace kvq {

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

using study_report::MaybeChart;

// Appends `value` to the JSON array `order` unless already there.
//
// Names from the study (schemes, fake-quant rows, memory series) are never put
// in a sort array: Vega-Lite compiles a custom sort order into an expression
// that quotes each value, and a name holding U+2028 (legal in JSON, a line
// break to Vega's expression parser) breaks that chart. Those channels use
// "sort": null instead, which keeps the data's order: the study's order.
void AppendOnce(json& order, const json& value) {
  if (std::find(order.begin(), order.end(), value) == order.end()) order.push_back(value);
}

}  // namespace

namespace study_report {

// Labels get room for the longest names a study holds (a policy file's path as
// a scheme, a write-up row) before Vega-Lite cuts them to "policy:docs/st…",
// which would make two policies look alike.
json BaseSpec() {
  return json{{"$schema", "https://vega.github.io/schema/vega-lite/v5.json"},
              {"background", "white"},
              {"config",
               {{"font", "DejaVu Sans, Helvetica, Arial, sans-serif"},
                {"axis", {{"labelFontSize", 11}, {"titleFontSize", 12}, {"labelLimit", 360}}},
                {"legend", {{"labelLimit", 360}}},
                {"header", {{"labelFontSize", 13}, {"labelFontWeight", "bold"}}}}}};
}

json Tooltip(std::initializer_list<std::pair<const char*, const char*>> fields_and_types,
             const char* number_format) {
  json out = json::array();
  for (const auto& [field, type] : fields_and_types) {
    json t = {{"field", field}, {"type", type}};
    if (std::string(type) == "quantitative") t["format"] = number_format;
    out.push_back(t);
  }
  return out;
}

json RecallHeatmapSpec(json values, const std::vector<int64_t>& contexts, bool by_task,
                       const RecallHeatmapStyle& style) {
  for (size_t i = 0; i < values.size(); ++i) {
    values[i]["context"] = "context " + std::to_string(contexts[i]);
  }
  std::vector<int64_t> distinct = contexts;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  json context_order = json::array();
  for (int64_t c : distinct) context_order.push_back("context " + std::to_string(c));

  const json x = {{"field", "depth"},
                  {"type", "ordinal"},
                  {"title", style.depth_title},
                  {"axis", {{"format", ".0%"}, {"labelAngle", 0}}}};
  const json y = {{"field", "scheme"}, {"type", "nominal"}, {"sort", nullptr}, {"title", nullptr}};
  json spec = BaseSpec();
  spec["data"] = {{"values", std::move(values)}};
  spec["facet"] = {
      {"column",
       {{"field", "context"}, {"type", "nominal"}, {"sort", context_order}, {"title", nullptr}}}};
  if (by_task) {
    spec["facet"]["row"] = {
        {"field", "task"}, {"type", "nominal"}, {"sort", nullptr}, {"title", nullptr}};
  }
  spec["spec"] = {{"width", {{"step", style.step}}},
                  {"layer",
                   {{{"mark", "rect"},
                     {"encoding",
                      {{"x", x},
                       {"y", y},
                       {"color",
                        {{"field", "accuracy"},
                         {"type", "quantitative"},
                         {"title", style.color_title},
                         {"scale", {{"domain", {0, 1}}, {"scheme", "redyellowgreen"}}},
                         {"legend", {{"format", ".0%"}}}}},
                       {"tooltip", style.tooltip}}}},
                    {{"mark", {{"type", "text"}, {"fontSize", style.font_size}}},
                     {"encoding", {{"x", x}, {"y", y}, {"text", {{"field", "label"}}}}}}}}};
  return spec;
}

}  // namespace study_report

std::vector<bool> ParetoFront(const std::vector<std::optional<double>>& x,
                              const std::vector<std::optional<double>>& y) {
  std::vector<bool> on_front(x.size(), false);
  for (size_t i = 0; i < x.size(); ++i) {
    if (!x[i] || !y[i]) continue;
    bool dominated = false;
    for (size_t j = 0; j < x.size() && !dominated; ++j) {
      if (j == i || !x[j] || !y[j]) continue;
      dominated = *x[j] <= *x[i] && *y[j] <= *y[i] && (*x[j] < *x[i] || *y[j] < *y[i]);
    }
    on_front[i] = !dominated;
  }
  return on_front;
}

namespace {

using study_report::BaseSpec;
using study_report::Tooltip;

// ---- 1. outlier heatmap --------------------------------------------------

// The heatmap's rows: one per (tensor, layer, KV head, channel), with the
// orders its axes and panels keep.
struct OutlierRows {
  json values = json::array();
  json row_order = json::array();     // "L<layer> H<head>", first seen first
  json tensor_order = json::array();  // panel labels
  size_t max_channels = 0;
};

StatusOr<OutlierRows> ReadOutlierRows(const json& layers) {
  struct Tensor {
    const char* key;
    const char* label;
  };
  const Tensor tensors[] = {{"k_pre_rope_channel_mean_abs", "K pre-RoPE"},
                            {"k_post_rope_channel_mean_abs", "K post-RoPE"},
                            {"v_channel_mean_abs", "V"}};
  OutlierRows rows;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string path = Index("outliers.layers", i);
    const json& layer = layers[i];
    KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> layer_index, IntMember(layer, "layer", path));
    const int64_t l = layer_index.value_or(static_cast<int64_t>(i));
    for (const Tensor& tensor : tensors) {
      KVQ_ASSIGN_OR_RETURN(const json* heads, ArrayMember(layer, tensor.key, path));
      if (heads == nullptr) continue;
      AppendOnce(rows.tensor_order, tensor.label);
      for (size_t h = 0; h < heads->size(); ++h) {
        const std::string head_path = Index(Join(path, tensor.key), h);
        const json& channels = (*heads)[h];  // [head_dim]
        if (!channels.is_array()) {
          return Status::Error(head_path + ": expected an array of per-channel values");
        }
        const std::string row = "L" + std::to_string(l) + " H" + std::to_string(h);
        AppendOnce(rows.row_order, row);
        rows.max_channels = std::max(rows.max_channels, channels.size());
        for (size_t c = 0; c < channels.size(); ++c) {
          KVQ_ASSIGN_OR_RETURN(std::optional<double> v, AsNumber(channels[c], Index(head_path, c)));
          rows.values.push_back(
              {{"tensor", tensor.label}, {"row", row}, {"channel", c}, {"value", NumberOrNull(v)}});
        }
      }
    }
  }
  return rows;
}

json OutlierHeatmapSpec(OutlierRows rows) {
  json channel_ticks = json::array();  // a label every 8 (or 16) channels
  const size_t tick_step = rows.max_channels > 64 ? 16 : 8;
  for (size_t c = 0; c < rows.max_channels; c += tick_step) channel_ticks.push_back(c);
  const int height = static_cast<int>(std::clamp<size_t>(rows.row_order.size() * 14, 60, 720));

  json spec = BaseSpec();
  spec["data"] = {{"values", std::move(rows.values)}};
  spec["facet"] = {{"column",
                    {{"field", "tensor"},
                     {"type", "nominal"},
                     {"sort", rows.tensor_order},
                     {"title", nullptr}}}};
  spec["spec"] = {{"width", 300},
                  {"height", height},
                  {"mark", "rect"},
                  {"encoding",
                   {{"x",
                     {{"field", "channel"},
                      {"type", "ordinal"},
                      {"title", "channel"},
                      {"axis", {{"values", channel_ticks}, {"labelAngle", 0}}}}},
                    {"y",
                     {{"field", "row"},
                      {"type", "ordinal"},
                      {"sort", rows.row_order},
                      {"title", "layer, KV head"}}},
                    {"color",
                     {{"field", "value"},
                      {"type", "quantitative"},
                      {"title", "mean |x|"},
                      {"scale", {{"scheme", "viridis"}, {"zero", true}}}}},
                    {"tooltip", Tooltip({{"tensor", "nominal"},
                                         {"row", "nominal"},
                                         {"channel", "ordinal"},
                                         {"value", "quantitative"}})}}}};
  spec["resolve"] = {{"scale", {{"color", "independent"}}}};
  return spec;
}

StatusOr<MaybeChart> OutlierHeatmap(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* outliers, ObjectMember(study, "outliers", ""));
  if (outliers == nullptr) return MaybeChart();
  KVQ_ASSIGN_OR_RETURN(const json* layers, ArrayMember(*outliers, "layers", "outliers"));
  if (layers == nullptr || layers->empty()) return MaybeChart();
  KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> capture_tokens,
                       IntMember(*outliers, "capture_tokens", "outliers"));
  KVQ_ASSIGN_OR_RETURN(OutlierRows rows, ReadOutlierRows(*layers));
  if (rows.values.empty()) return MaybeChart();

  std::string caption =
      "Each row is one (layer, KV head) and each column one channel of the head; the colour is the "
      "mean |x| of that channel over the captured tokens";
  if (capture_tokens) caption += " (" + std::to_string(*capture_tokens) + " tokens of the text)";
  caption +=
      ", on a separate scale per panel. A bright vertical stripe is a fixed outlier channel: the "
      "same channel is large in every token, which one scale per token cannot absorb and one "
      "scale per channel can (KIVI, KVQuant). RoPE rotates pairs of channels by a "
      "position-dependent angle, so after RoPE an outlier's magnitude is shared with its partner "
      "channel and the stripe pattern changes. V is mixed token by token into the output; "
      "stripes there would argue against quantizing V per token.";
  return MaybeChart(StudyChart{"outlier-heatmap",
                               "Outlier channels: K before and after RoPE, and V", caption,
                               OutlierHeatmapSpec(std::move(rows))});
}

// ---- 2. fake-quant errors -------------------------------------------------

struct Metric {
  const char* key;
  const char* label;
};
constexpr Metric kFakeQuantMetrics[] = {{"score_rel_error", "score rel. error"},
                                        {"prob_kl", "probability KL"},
                                        {"output_rel_error", "output rel. error"}};

json MetricOrder() {
  json order = json::array();
  for (const Metric& m : kFakeQuantMetrics) order.push_back(m.label);
  return order;
}

// Long-form rows for both fake-quant charts.
struct FakeQuantData {
  json overall = json::array();    // {row, bits, metric, value}
  json per_layer = json::array();  // {row, bits, metric, layer, value}
  json bits_order = json::array();
};

StatusOr<std::optional<FakeQuantData>> ReadFakeQuant(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* fake_quant, ObjectMember(study, "fake_quant", ""));
  if (fake_quant == nullptr) return std::optional<FakeQuantData>();
  KVQ_ASSIGN_OR_RETURN(const json* rows, ArrayMember(*fake_quant, "rows", "fake_quant"));
  if (rows == nullptr || rows->empty()) return std::optional<FakeQuantData>();
  FakeQuantData data;
  std::vector<int64_t> bits_seen;
  for (size_t i = 0; i < rows->size(); ++i) {
    const std::string path = Index("fake_quant.rows", i);
    const json& row = (*rows)[i];
    KVQ_ASSIGN_OR_RETURN(std::string name, StringMember(row, "name", path));
    KVQ_ASSIGN_OR_RETURN(bool literal, BoolMember(row, "literal_formula", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> bits, IntMember(row, "bits", path));
    if (name.empty()) name = "row " + std::to_string(i);
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (literal && lower.find("literal") == std::string::npos) name += " [literal formula]";
    if (!bits) return Status::Error(Join(path, "bits") + ": missing");
    const std::string bits_label = std::to_string(*bits) + "-bit";
    bits_seen.push_back(*bits);
    for (const Metric& m : kFakeQuantMetrics) {
      KVQ_ASSIGN_OR_RETURN(std::optional<double> v, NumberMember(row, m.key, path));
      data.overall.push_back(
          {{"row", name}, {"bits", bits_label}, {"metric", m.label}, {"value", NumberOrNull(v)}});
    }
    KVQ_ASSIGN_OR_RETURN(const json* per_layer, ArrayMember(row, "per_layer", path));
    if (per_layer == nullptr) continue;
    for (size_t j = 0; j < per_layer->size(); ++j) {
      const std::string layer_path = Index(Join(path, "per_layer"), j);
      const json& entry = (*per_layer)[j];
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> layer, IntMember(entry, "layer", layer_path));
      for (const Metric& m : kFakeQuantMetrics) {
        KVQ_ASSIGN_OR_RETURN(std::optional<double> v, NumberMember(entry, m.key, layer_path));
        data.per_layer.push_back({{"row", name},
                                  {"bits", bits_label},
                                  {"metric", m.label},
                                  {"layer", layer.value_or(static_cast<int64_t>(j))},
                                  {"value", NumberOrNull(v)}});
      }
    }
  }
  std::sort(bits_seen.begin(), bits_seen.end());
  bits_seen.erase(std::unique(bits_seen.begin(), bits_seen.end()), bits_seen.end());
  for (int64_t b : bits_seen) data.bits_order.push_back(std::to_string(b) + "-bit");
  return std::optional<FakeQuantData>(std::move(data));
}

StudyChart FakeQuantOverall(const FakeQuantData& data) {
  json spec = BaseSpec();
  spec["data"] = {{"values", data.overall}};
  spec["facet"] = {
      {"column",
       {{"field", "metric"}, {"type", "nominal"}, {"sort", MetricOrder()}, {"title", nullptr}}}};
  spec["spec"] = {
      {"width", 230},
      {"mark", {{"type", "bar"}}},
      {"encoding",
       {{"y", {{"field", "row"}, {"type", "nominal"}, {"sort", nullptr}, {"title", nullptr}}},
        {"yOffset", {{"field", "bits"}, {"type", "nominal"}, {"sort", data.bits_order}}},
        {"x", {{"field", "value"}, {"type", "quantitative"}, {"title", "error (lower is better)"}}},
        {"color",
         {{"field", "bits"},
          {"type", "nominal"},
          {"sort", data.bits_order},
          {"title", "bit width"}}},
        {"tooltip", Tooltip({{"row", "nominal"},
                             {"bits", "nominal"},
                             {"metric", "nominal"},
                             {"value", "quantitative"}})}}}};
  spec["resolve"] = {{"scale", {{"x", "independent"}}}};
  return StudyChart{
      "fake-quant", "Fake quantization of the captured K/V: error by grouping and bit width",
      "The captured K and V are quantized, dequantized and attention is recomputed. Rows "
      "'as written' reproduce the write-up's fake_quant: its symmetric formula (2^(b+1) levels: "
      "its '2-bit' is really a 3-bit grid), one scale per channel over the whole sequence or per "
      "token vector. Rows 'corrected' use true b-bit asymmetric min/max quantizers (2^b levels) "
      "with KIVI's groups (per channel over 32 tokens, per token over 32 channels); the KVQuant "
      "row quantizes K before RoPE. Three errors against the unquantized attention, over all "
      "layers: the relative Frobenius error of the pre-softmax scores (the write-up's metric; it "
      "depends on K only, so rows with the same K grouping tie), the mean KL divergence of the "
      "attention probabilities, and the relative error of the attention output, the only one "
      "that sees V. Shorter bars are better; each panel has its own scale. The table below says "
      "which of the write-up's claims hold here, by how much.",
      std::move(spec)};
}

StudyChart FakeQuantPerLayer(const FakeQuantData& data) {
  json spec = BaseSpec();
  spec["data"] = {{"values", data.per_layer}};
  spec["facet"] = {
      {"column",
       {{"field", "metric"}, {"type", "nominal"}, {"sort", MetricOrder()}, {"title", nullptr}}}};
  spec["spec"] = {
      {"width", 260},
      {"height", 220},
      {"mark", {{"type", "line"}, {"point", true}}},
      {"encoding",
       {{"x",
         {{"field", "layer"},
          {"type", "ordinal"},
          {"title", "layer"},
          {"axis", {{"labelAngle", 0}}}}},
        {"y", {{"field", "value"}, {"type", "quantitative"}, {"title", "error (lower is better)"}}},
        {"color",
         {{"field", "row"},
          {"type", "nominal"},
          {"sort", nullptr},
          {"title", "grouping"},
          {"legend", {{"orient", "bottom"}, {"columns", 2}}}}},
        {"strokeDash",
         {{"field", "bits"},
          {"type", "nominal"},
          {"sort", data.bits_order},
          {"title", "bit width"}}},
        {"tooltip", Tooltip({{"row", "nominal"},
                             {"bits", "nominal"},
                             {"layer", "ordinal"},
                             {"metric", "nominal"},
                             {"value", "quantitative"}})}}}};
  spec["resolve"] = {{"scale", {{"y", "independent"}}}};
  return StudyChart{"fake-quant-layers", "Fake quantization error per layer",
                    "The same three errors, layer by layer (colour: grouping; dash: bit width). A "
                    "layer that stands out is a candidate for more bits in a per-layer policy "
                    "(for Qwen2 models, SCHEMES.md notes the first and last layers' large k_proj "
                    "bias; the k_proj bias norms are in the outlier table above).",
                    std::move(spec)};
}

// ---- 3. quality vs bytes Pareto -------------------------------------------

json ParetoPanel(const char* title, const char* y_field, const char* front_field,
                 const json& y_scale, const char* filter) {
  const json x = {{"field", "bytes_per_token"},
                  {"type", "quantitative"},
                  {"title", "KV bytes per token (all layers, incl. side data)"},
                  {"scale", {{"zero", false}}}};
  const json y = {
      {"field", y_field}, {"type", "quantitative"}, {"title", title}, {"scale", y_scale}};
  json points = {
      {"mark", {{"type", "point"}, {"filled", true}, {"size", 80}}},
      {"encoding",
       {{"x", x},
        {"y", y},
        {"color",
         {{"field", front_field},
          {"type", "nominal"},
          {"title", nullptr},
          {"scale",
           {{"domain", {"Pareto front", "dominated"}}, {"range", {"#d62728", "#8c8c8c"}}}}}},
        {"tooltip", Tooltip({{"name", "nominal"},
                             {"bytes_per_token", "quantitative"},
                             {"bits_per_value", "quantitative"},
                             {"compression_vs_f16", "quantitative"},
                             {"kl_mean", "quantitative"},
                             {"ppl", "quantitative"}})}}}};
  json front_line = {
      {"transform", {{{"filter", {{"field", front_field}, {"equal", "Pareto front"}}}}}},
      {"mark", {{"type", "line"}, {"color", "#d62728"}, {"strokeWidth", 1.5}}},
      {"encoding", {{"x", x}, {"y", y}, {"order", {{"field", "bytes_per_token"}}}}}};
  json labels = {{"mark", {{"type", "text"}, {"align", "left"}, {"dx", 7}, {"fontSize", 10}}},
                 {"encoding", {{"x", x}, {"y", y}, {"text", {{"field", "name"}}}}}};
  return {{"width", 380},
          {"height", 300},
          {"transform", {{{"filter", filter}}}},
          {"layer", {front_line, points, labels}}};
}

StatusOr<MaybeChart> ParetoChart(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* schemes, ArrayMember(study, "schemes", ""));
  if (schemes == nullptr || schemes->empty()) return MaybeChart();
  std::vector<std::string> names;
  std::vector<std::optional<double>> bytes, kl, ppl, bits, compression;
  for (size_t i = 0; i < schemes->size(); ++i) {
    const std::string path = Index("schemes", i);
    const json& s = (*schemes)[i];
    KVQ_ASSIGN_OR_RETURN(std::string name, StringMember(s, "name", path));
    names.push_back(name);
    KVQ_ASSIGN_OR_RETURN(bytes.emplace_back(), NumberMember(s, "bytes_per_token", path));
    KVQ_ASSIGN_OR_RETURN(kl.emplace_back(), NumberMember(s, "kl_mean", path));
    KVQ_ASSIGN_OR_RETURN(ppl.emplace_back(), NumberMember(s, "ppl", path));
    KVQ_ASSIGN_OR_RETURN(bits.emplace_back(), NumberMember(s, "bits_per_value", path));
    KVQ_ASSIGN_OR_RETURN(compression.emplace_back(), NumberMember(s, "compression_vs_f16", path));
  }
  // KL is drawn on a log axis: a zero KL (the f16 reference itself) has no
  // place there. The front still counts it (as findings.md, the comparison
  // page and `kvq study` do), so a 16-bit cache it beats is not marked.
  const std::vector<bool> kl_front = ParetoFront(bytes, kl);
  const std::vector<bool> ppl_front = ParetoFront(bytes, ppl);
  std::string not_drawn;
  json values = json::array();
  int64_t drawable = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const bool kl_on_axis = kl[i] && *kl[i] > 0;
    if (kl[i] && !kl_on_axis) not_drawn += (not_drawn.empty() ? "" : ", ") + names[i];
    if (bytes[i] && (kl_on_axis || ppl[i])) ++drawable;
    values.push_back({{"name", names[i]},
                      {"bytes_per_token", NumberOrNull(bytes[i])},
                      {"bits_per_value", NumberOrNull(bits[i])},
                      {"compression_vs_f16", NumberOrNull(compression[i])},
                      {"kl_mean", NumberOrNull(kl[i])},
                      {"ppl", NumberOrNull(ppl[i])},
                      {"front_kl", kl_front[i] ? "Pareto front" : "dominated"},
                      {"front_ppl", ppl_front[i] ? "Pareto front" : "dominated"}});
  }
  if (drawable == 0) return MaybeChart();

  json spec = BaseSpec();
  spec["data"] = {{"values", values}};
  spec["hconcat"] = {
      ParetoPanel("mean KL vs the f16 cache (log)", "kl_mean", "front_kl", {{"type", "log"}},
                  "isValid(datum.bytes_per_token) && isValid(datum.kl_mean) && datum.kl_mean > 0"),
      ParetoPanel("perplexity", "ppl", "front_ppl", {{"zero", false}},
                  "isValid(datum.bytes_per_token) && isValid(datum.ppl)")};
  std::string caption =
      "Each point is one cache type or scheme, run end to end through the real KV cache: x is the "
      "exact bytes the cache stores per token (every layer, K and V, including scales, "
      "zero-points, residual windows and outliers), y the quality cost. Down and to the left is "
      "better. Red points are on the Pareto front: no other scheme is both smaller and at least "
      "as good; the red line joins them. Grey points are dominated: some other scheme costs "
      "fewer bytes for the same or better quality.";
  if (!not_drawn.empty()) {
    caption += " Not drawn on the log KL axis (KL is exactly 0, the reference): " + not_drawn +
               ". It still counts for the KL front: a scheme it beats is grey.";
  }
  return MaybeChart(
      StudyChart{"pareto", "Quality versus bytes: the Pareto front", caption, std::move(spec)});
}

// ---- 4. memory vs context -------------------------------------------------

StatusOr<MaybeChart> MemoryChart(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* memory, ObjectMember(study, "memory", ""));
  if (memory == nullptr) return MaybeChart();
  KVQ_ASSIGN_OR_RETURN(const json* contexts, ArrayMember(*memory, "contexts", "memory"));
  KVQ_ASSIGN_OR_RETURN(const json* series, ArrayMember(*memory, "series", "memory"));
  if (contexts == nullptr || series == nullptr || contexts->empty() || series->empty()) {
    return MaybeChart();
  }
  std::vector<std::optional<double>> context_values;
  json context_ticks = json::array();
  for (size_t i = 0; i < contexts->size(); ++i) {
    KVQ_ASSIGN_OR_RETURN(std::optional<double> c,
                         AsNumber((*contexts)[i], Index("memory.contexts", i)));
    context_values.push_back(c);
    if (c) context_ticks.push_back(*c);
  }
  json values = json::array();
  for (size_t i = 0; i < series->size(); ++i) {
    const std::string path = Index("memory.series", i);
    const json& s = (*series)[i];
    KVQ_ASSIGN_OR_RETURN(std::string name, StringMember(s, "name", path));
    KVQ_ASSIGN_OR_RETURN(const json* bytes, ArrayMember(s, "bytes", path));
    if (bytes == nullptr) continue;
    if (bytes->size() != contexts->size()) {
      return Status::Error(Join(path, "bytes") + ": " + std::to_string(bytes->size()) +
                           " values for " + std::to_string(contexts->size()) + " contexts");
    }
    for (size_t j = 0; j < bytes->size(); ++j) {
      KVQ_ASSIGN_OR_RETURN(std::optional<double> b,
                           AsNumber((*bytes)[j], Index(Join(path, "bytes"), j)));
      values.push_back({{"series", name},
                        {"context", NumberOrNull(context_values[j])},
                        {"bytes", NumberOrNull(b)}});
    }
  }
  if (values.empty()) return MaybeChart();

  json spec = BaseSpec();
  spec["data"] = {{"values", values}};
  spec["width"] = 560;
  spec["height"] = 320;
  spec["transform"] = {{{"filter",
                         "isValid(datum.context) && datum.context > 0 && "
                         "isValid(datum.bytes) && datum.bytes > 0"}},
                       {{"calculate", "datum.bytes / 1048576"}, {"as", "MiB"}}};
  spec["mark"] = {{"type", "line"}, {"point", true}};
  spec["encoding"] = {
      {"x",
       {{"field", "context"},
        {"type", "quantitative"},
        {"title", "context (tokens, log scale)"},
        {"scale", {{"type", "log"}, {"base", 2}}},
        {"axis",
         {{"values", context_ticks},
          {"labelExpr",
           "datum.value >= 1024 ? format(datum.value / 1024, '~g') + 'K' : datum.value"}}}}},
      {"y",
       {{"field", "MiB"},
        {"type", "quantitative"},
        {"title", "KV cache for one sequence (MiB, log scale)"},
        {"scale", {{"type", "log"}}}}},
      {"color",
       {{"field", "series"},
        {"type", "nominal"},
        {"sort", nullptr},
        {"title", "cache"},
        {"scale", {{"scheme", "tableau20"}}}}},
      {"tooltip",
       Tooltip({{"series", "nominal"}, {"context", "quantitative"}, {"MiB", "quantitative"}})}};
  return MaybeChart(StudyChart{
      "memory", "Memory versus context",
      "Bytes of KV cache one sequence needs at each context length, from kvq's planner (the same "
      "layout the cache allocates, side structures included), for this model. Both axes are "
      "logarithmic, so the lines are parallel and the vertical gap between two lines is their "
      "compression ratio. Multiply by the batch size for a server's cache.",
      std::move(spec)});
}

// ---- 5. recall by depth ---------------------------------------------------

StatusOr<MaybeChart> RecallChart(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* schemes, ArrayMember(study, "schemes", ""));
  if (schemes == nullptr) return MaybeChart();
  json values = json::array();
  std::vector<int64_t> contexts;
  for (size_t i = 0; i < schemes->size(); ++i) {
    const std::string path = Index("schemes", i);
    const json& s = (*schemes)[i];
    KVQ_ASSIGN_OR_RETURN(std::string name, StringMember(s, "name", path));
    KVQ_ASSIGN_OR_RETURN(const json* recall, ArrayMember(s, "recall", path));
    if (recall == nullptr || recall->empty()) continue;
    for (size_t j = 0; j < recall->size(); ++j) {
      const std::string rpath = Index(Join(path, "recall"), j);
      const json& r = (*recall)[j];
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> context, IntMember(r, "context", rpath));
      KVQ_ASSIGN_OR_RETURN(std::optional<double> depth, NumberMember(r, "depth", rpath));
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> correct, IntMember(r, "correct", rpath));
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> trials, IntMember(r, "trials", rpath));
      if (!context || !depth || !correct || !trials) {
        return Status::Error(rpath + ": needs context, depth, correct and trials");
      }
      contexts.push_back(*context);
      json accuracy = *trials > 0 ? json(static_cast<double>(*correct) / *trials) : json(nullptr);
      values.push_back({{"scheme", name},
                        {"depth", *depth},
                        {"accuracy", accuracy},
                        {"label", std::to_string(*correct) + "/" + std::to_string(*trials)}});
    }
  }
  if (values.empty()) return MaybeChart();
  json spec = study_report::RecallHeatmapSpec(std::move(values), contexts, /*by_task=*/false,
                                              {"passkey depth", "exact recall",
                                               Tooltip({{"scheme", "nominal"},
                                                        {"context", "nominal"},
                                                        {"depth", "quantitative"},
                                                        {"label", "nominal"},
                                                        {"accuracy", "quantitative"}},
                                                       ".0%"),
                                               40, 10});
  return MaybeChart(StudyChart{
      "recall", "Exact recall of a passkey by depth",
      "A passkey is hidden at a given depth (fraction of the way into filler text) and asked for "
      "at the end; each cell is correct answers / trials for one scheme at that depth, one panel "
      "per context length. Green is perfect recall, red none. A scheme that loses the passkey "
      "deep in a long context is destroying information that perplexity averages away.",
      std::move(spec)});
}

}  // namespace

StatusOr<std::vector<StudyChart>> BuildStudyCharts(const json& study) {
  if (!study.is_object()) return Status::Error("study: expected a JSON object");
  std::vector<StudyChart> charts;
  KVQ_ASSIGN_OR_RETURN(MaybeChart heatmap, OutlierHeatmap(study));
  if (heatmap) charts.push_back(std::move(*heatmap));
  for (auto builder :
       {study_report::KBiasChart, study_report::SinkChart, study_report::TensorStatsChart}) {
    KVQ_ASSIGN_OR_RETURN(MaybeChart chart, builder(study));
    if (chart) charts.push_back(std::move(*chart));
  }
  KVQ_ASSIGN_OR_RETURN(std::optional<FakeQuantData> fake_quant, ReadFakeQuant(study));
  if (fake_quant) {
    charts.push_back(FakeQuantOverall(*fake_quant));
    if (!fake_quant->per_layer.empty()) charts.push_back(FakeQuantPerLayer(*fake_quant));
  }
  KVQ_ASSIGN_OR_RETURN(MaybeChart pareto, ParetoChart(study));
  if (pareto) charts.push_back(std::move(*pareto));
  KVQ_ASSIGN_OR_RETURN(MaybeChart memory, MemoryChart(study));
  if (memory) charts.push_back(std::move(*memory));
  KVQ_ASSIGN_OR_RETURN(MaybeChart recall, RecallChart(study));
  if (recall) charts.push_back(std::move(*recall));
  for (auto builder :
       {study_report::NeedleChart, study_report::Gsm8kChart, study_report::ContextKlChart}) {
    KVQ_ASSIGN_OR_RETURN(MaybeChart chart, builder(study));
    if (chart) charts.push_back(std::move(*chart));
  }
  return charts;
}

}  // namespace kvq
