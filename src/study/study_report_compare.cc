// The model comparison page: several studies (one per model) side by side.
// Every chart draws all models at once, each value tagged with its model,
// from the same JSON fields the single-study report reads.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "study/study_gsm8k.h"
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
using study_report::BaseSpec;
using study_report::MaybeChart;
using study_report::NeedleCell;
using study_report::ReadNeedleCells;
using study_report::TableRow;
using study_report::Tooltip;

// Colour and shape channels: one per model, in the order the studies came.
json ModelField() { return {{"field", "model"}, {"type", "nominal"}, {"sort", nullptr}}; }

// A short, unique label per study: the model file's name.
StatusOr<std::vector<std::string>> ModelLabels(const std::vector<json>& studies) {
  std::vector<std::string> labels;
  for (size_t i = 0; i < studies.size(); ++i) {
    KVQ_ASSIGN_OR_RETURN(const json* model, ObjectMember(studies[i], "model", ""));
    std::string path;
    if (model != nullptr) {
      KVQ_ASSIGN_OR_RETURN(path, StringMember(*model, "path", "model"));
    }
    while (!path.empty() && path.back() == '/') path.pop_back();
    std::string label = path.substr(path.find_last_of('/') + 1);
    if (label.empty()) label = "study " + std::to_string(i + 1);
    if (std::find(labels.begin(), labels.end(), label) != labels.end())
      label += " #" + std::to_string(i + 1);
    labels.push_back(label);
  }
  return labels;
}

StatusOr<std::string> ModelTable(const std::vector<json>& studies,
                                 const std::vector<std::string>& labels) {
  std::string out = "<section id=\"models\">\n<h2>Models</h2>\n<div class=\"scroll\"><table>\n" +
                    TableRow({"model", "architecture", "parameters", "layers", "heads / KV heads",
                              "head_dim", "context", "k_proj bias spikes", "study run"},
                             "th");
  for (size_t i = 0; i < studies.size(); ++i) {
    const json& s = studies[i];
    KVQ_ASSIGN_OR_RETURN(const json* m, ObjectMember(s, "model", ""));
    auto num = [&](const char* key) -> StatusOr<std::string> {
      if (m == nullptr) return std::string("&ndash;");
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> v, IntMember(*m, key, "model"));
      return v ? std::to_string(*v) : std::string("&ndash;");
    };
    std::string arch;
    if (m != nullptr) {
      KVQ_ASSIGN_OR_RETURN(arch, StringMember(*m, "architecture", "model"));
    }
    KVQ_ASSIGN_OR_RETURN(std::string params, num("parameters"));
    KVQ_ASSIGN_OR_RETURN(std::string layers, num("layers"));
    KVQ_ASSIGN_OR_RETURN(std::string heads, num("heads"));
    KVQ_ASSIGN_OR_RETURN(std::string kv_heads, num("kv_heads"));
    KVQ_ASSIGN_OR_RETURN(std::string head_dim, num("head_dim"));
    KVQ_ASSIGN_OR_RETURN(std::string context, num("context"));
    std::string spikes = "&ndash;";
    KVQ_ASSIGN_OR_RETURN(const json* outliers, ObjectMember(s, "outliers", ""));
    if (outliers != nullptr) {
      KVQ_ASSIGN_OR_RETURN(const json* bias, ObjectMember(*outliers, "k_bias", "outliers"));
      if (bias != nullptr) {
        KVQ_ASSIGN_OR_RETURN(const json* list, ArrayMember(*bias, "spike_layers", "k_bias"));
        spikes = list == nullptr || list->empty() ? "none" : EscapeHtml(list->dump());
      }
    }
    KVQ_ASSIGN_OR_RETURN(std::string created, StringMember(s, "created_utc", ""));
    KVQ_ASSIGN_OR_RETURN(std::string command, StringMember(s, "command", ""));
    out += TableRow({"<b>" + EscapeHtml(labels[i]) + "</b>", EscapeHtml(arch), params, layers,
                     heads + " / " + kv_heads, head_dim, context, spikes,
                     EscapeHtml(created) + "<br><code>" + EscapeHtml(command) + "</code>"});
  }
  return out + "</table></div>\n</section>\n";
}

// The schemes every study ran, end to end: KL and perplexity ratio to f16.
StatusOr<MaybeChart> CompareSchemes(const std::vector<json>& studies,
                                    const std::vector<std::string>& labels) {
  json values = json::array();
  for (size_t i = 0; i < studies.size(); ++i) {
    KVQ_ASSIGN_OR_RETURN(const json* schemes, ArrayMember(studies[i], "schemes", ""));
    std::optional<double> f16_ppl;
    for (size_t j = 0; schemes != nullptr && j < schemes->size(); ++j) {
      const std::string path = Index("schemes", j);
      const json& s = (*schemes)[j];
      KVQ_ASSIGN_OR_RETURN(std::string name, StringMember(s, "name", path));
      KVQ_ASSIGN_OR_RETURN(bool baseline, BoolMember(s, "baseline", path));
      KVQ_ASSIGN_OR_RETURN(std::optional<double> kl, NumberMember(s, "kl_mean", path));
      KVQ_ASSIGN_OR_RETURN(std::optional<double> ppl, NumberMember(s, "ppl", path));
      KVQ_ASSIGN_OR_RETURN(std::optional<double> bits, NumberMember(s, "bits_per_value", path));
      if (baseline) f16_ppl = ppl;
      std::optional<double> ratio;
      if (ppl && f16_ppl && *f16_ppl > 0) ratio = *ppl / *f16_ppl;
      if (baseline) continue;  // KL 0 by definition: no place on a log axis
      values.push_back({{"model", labels[i]},
                        {"scheme", name},
                        {"kl_mean", NumberOrNull(kl)},
                        {"ppl_ratio", NumberOrNull(ratio)},
                        {"bits_per_value", NumberOrNull(bits)}});
    }
  }
  if (values.empty()) return MaybeChart();
  auto panel = [](const char* field, const char* title, json scale) {
    return json{
        {"width", 300},
        {"transform",
         {{{"filter", std::string("isValid(datum.") + field + ") && datum." + field + " > 0"}}}},
        {"mark", {{"type", "point"}, {"filled", true}, {"size", 60}}},
        {"encoding",
         {{"y", {{"field", "scheme"}, {"type", "nominal"}, {"sort", nullptr}, {"title", nullptr}}},
          {"x", {{"field", field}, {"type", "quantitative"}, {"title", title}, {"scale", scale}}},
          {"color", ModelField()},
          {"shape", ModelField()},
          {"tooltip", Tooltip({{"model", "nominal"},
                               {"scheme", "nominal"},
                               {"bits_per_value", "quantitative"},
                               {"kl_mean", "quantitative"},
                               {"ppl_ratio", "quantitative"}})}}}};
  };
  json spec = BaseSpec();
  spec["data"] = {{"values", values}};
  spec["hconcat"] = {
      panel("kl_mean", "mean KL vs the model's f16 cache (log)", {{"type", "log"}}),
      panel("ppl_ratio", "perplexity / the model's f16 perplexity", {{"zero", false}})};
  return MaybeChart(StudyChart{
      "compare-schemes", "End to end per scheme, model by model",
      "Each point is one scheme on one model (colour and shape: model), against that model's own "
      "f16 cache: left the mean KL of the next-token distribution, right the perplexity ratio. A "
      "scheme whose points spread apart costs some models much more than others.",
      std::move(spec)});
}

// The fronts chart: each model's front joined and labelled, the rest faded.
json FrontsSpec(json values) {
  const json x = {{"field", "bits_per_value"},
                  {"type", "quantitative"},
                  {"title", "bits per value (codes and side data, per stored K or V value)"},
                  {"scale", {{"zero", false}}}};
  const json y = {{"field", "kl_mean"},
                  {"type", "quantitative"},
                  {"title", "mean KL vs the model's f16 cache (log)"},
                  {"scale", {{"type", "log"}}}};
  const json on_front = {{"filter", {{"field", "front"}, {"equal", "on the front"}}}};
  // The points' legend (colour and shape) names the models; the lines' and
  // labels' colour alone would make a second one.
  json unlisted = ModelField();
  unlisted["legend"] = nullptr;
  json line = {
      {"transform", {on_front}},
      {"mark", {{"type", "line"}, {"strokeWidth", 1.5}}},
      {"encoding",
       {{"x", x}, {"y", y}, {"color", unlisted}, {"order", {{"field", "bits_per_value"}}}}}};
  json points = {
      {"mark", {{"type", "point"}, {"filled", true}, {"size", 60}}},
      {"encoding",
       {{"x", x},
        {"y", y},
        {"color", ModelField()},
        {"shape", ModelField()},
        {"opacity",
         {{"field", "front"},
          {"type", "ordinal"},
          {"sort", {"on the front", "dominated"}},
          {"title", nullptr},
          {"scale", {{"domain", {"on the front", "dominated"}}, {"range", {1.0, 0.25}}}}}},
        {"tooltip", Tooltip({{"model", "nominal"},
                             {"scheme", "nominal"},
                             {"bits_per_value", "quantitative"},
                             {"kl_mean", "quantitative"},
                             {"front", "nominal"}})}}}};
  json labels_on_front = {
      {"transform", {on_front}},
      {"mark", {{"type", "text"}, {"align", "left"}, {"dx", 7}, {"fontSize", 10}}},
      {"encoding", {{"x", x}, {"y", y}, {"color", unlisted}, {"text", {{"field", "scheme"}}}}}};
  json spec = BaseSpec();
  spec["data"] = {{"values", std::move(values)}};
  spec["width"] = 520;
  spec["height"] = 340;
  spec["layer"] = {line, points, labels_on_front};
  return spec;
}

// Each model's Pareto front of KL against bits per value (not bytes: models
// differ in layers and heads, so only bits per value compare across them).
StatusOr<MaybeChart> CompareFronts(const std::vector<json>& studies,
                                   const std::vector<std::string>& labels) {
  json values = json::array();
  for (size_t i = 0; i < studies.size(); ++i) {
    KVQ_ASSIGN_OR_RETURN(const json* schemes, ArrayMember(studies[i], "schemes", ""));
    if (schemes == nullptr) continue;
    std::vector<std::string> names;
    std::vector<std::optional<double>> bits, kl;
    for (size_t j = 0; j < schemes->size(); ++j) {
      const std::string path = Index("schemes", j);
      KVQ_ASSIGN_OR_RETURN(names.emplace_back(), StringMember((*schemes)[j], "name", path));
      KVQ_ASSIGN_OR_RETURN(bits.emplace_back(),
                           NumberMember((*schemes)[j], "bits_per_value", path));
      KVQ_ASSIGN_OR_RETURN(kl.emplace_back(), NumberMember((*schemes)[j], "kl_mean", path));
    }
    // f16 takes part in the front (it dominates bf16, as in findings.md and
    // the CLI's line) but is not drawn: KL 0 has no place on a log axis.
    const std::vector<bool> front = ParetoFront(bits, kl);
    for (size_t j = 0; j < names.size(); ++j) {
      if (!bits[j] || !kl[j] || *kl[j] <= 0) continue;
      values.push_back({{"model", labels[i]},
                        {"scheme", names[j]},
                        {"bits_per_value", *bits[j]},
                        {"kl_mean", *kl[j]},
                        {"front", front[j] ? "on the front" : "dominated"}});
    }
  }
  if (values.empty()) return MaybeChart();
  json spec = FrontsSpec(std::move(values));
  return MaybeChart(StudyChart{
      "compare-fronts", "Which cache to choose: each model's Pareto front",
      "Each point is one scheme on one model (colour and shape: model): x its bits per stored "
      "value, y its mean KL against that model's own f16 cache. Solid, labelled and joined: the "
      "model's Pareto front, the schemes no other scheme of that model beats with fewer or as "
      "many bits and a KL as low or lower. Faded: dominated on that model. f16 itself (KL 0) "
      "belongs to every front but is not drawn on the log axis.",
      std::move(spec)});
}

StatusOr<MaybeChart> CompareFakeQuant(const std::vector<json>& studies,
                                      const std::vector<std::string>& labels) {
  json values = json::array();
  for (size_t i = 0; i < studies.size(); ++i) {
    KVQ_ASSIGN_OR_RETURN(const json* fq, ObjectMember(studies[i], "fake_quant", ""));
    if (fq == nullptr) continue;
    KVQ_ASSIGN_OR_RETURN(const json* rows, ArrayMember(*fq, "rows", "fake_quant"));
    for (size_t j = 0; rows != nullptr && j < rows->size(); ++j) {
      const std::string path = Index("fake_quant.rows", j);
      KVQ_ASSIGN_OR_RETURN(std::string name, StringMember((*rows)[j], "name", path));
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> bits, IntMember((*rows)[j], "bits", path));
      KVQ_ASSIGN_OR_RETURN(std::optional<double> err,
                           NumberMember((*rows)[j], "score_rel_error", path));
      KVQ_ASSIGN_OR_RETURN(std::optional<double> out,
                           NumberMember((*rows)[j], "output_rel_error", path));
      values.push_back({{"model", labels[i]},
                        {"row", name},
                        {"bits", bits ? std::to_string(*bits) + "-bit" : "?"},
                        {"score_rel_error", NumberOrNull(err)},
                        {"output_rel_error", NumberOrNull(out)}});
    }
  }
  if (values.empty()) return MaybeChart();
  json spec = BaseSpec();
  spec["data"] = {{"values", values}};
  spec["facet"] = {{"column", {{"field", "bits"}, {"type", "nominal"}, {"title", nullptr}}}};
  spec["spec"] = {
      {"width", 260},
      {"mark", {{"type", "point"}, {"filled", true}, {"size", 60}}},
      {"encoding",
       {{"y", {{"field", "row"}, {"type", "nominal"}, {"sort", nullptr}, {"title", nullptr}}},
        {"x",
         {{"field", "score_rel_error"},
          {"type", "quantitative"},
          {"title", "attention-score relative error"}}},
        {"color", ModelField()},
        {"shape", ModelField()},
        {"tooltip", Tooltip({{"model", "nominal"},
                             {"row", "nominal"},
                             {"bits", "nominal"},
                             {"score_rel_error", "quantitative"},
                             {"output_rel_error", "quantitative"}})}}}};
  spec["resolve"] = {{"scale", {{"x", "independent"}}}};
  return MaybeChart(StudyChart{
      "compare-fake-quant", "The write-up's table, model by model",
      "The fake-quant score error of every row (the write-up's as written, the corrected "
      "quantizers, KVQuant's pre-RoPE K) on each model's captured K/V; one panel per bit width.",
      std::move(spec)});
}

// Per layer of every model: the k_proj bias ratio to the median layer and the
// token-0 sink mass, on a common x axis (layer / (layers - 1)) so models of
// different depth line up.
StatusOr<MaybeChart> CompareLayers(const std::vector<json>& studies,
                                   const std::vector<std::string>& labels) {
  json values = json::array();
  for (size_t i = 0; i < studies.size(); ++i) {
    KVQ_ASSIGN_OR_RETURN(const json* outliers, ObjectMember(studies[i], "outliers", ""));
    if (outliers == nullptr) continue;
    KVQ_ASSIGN_OR_RETURN(const json* layers, ArrayMember(*outliers, "layers", "outliers"));
    const size_t n = layers == nullptr ? 0 : layers->size();
    auto depth = [n](size_t l) { return n > 1 ? static_cast<double>(l) / (n - 1) : 0.0; };
    for (size_t l = 0; l < n; ++l) {
      KVQ_ASSIGN_OR_RETURN(std::optional<double> sink,
                           NumberMember((*layers)[l], "sink_mass", Index("outliers.layers", l)));
      values.push_back({{"model", labels[i]},
                        {"layer", l},
                        {"depth", depth(l)},
                        {"metric", "token-0 sink mass"},
                        {"value", NumberOrNull(sink)}});
    }
    KVQ_ASSIGN_OR_RETURN(const json* bias, ObjectMember(*outliers, "k_bias", "outliers"));
    if (bias == nullptr) continue;
    KVQ_ASSIGN_OR_RETURN(const json* ratio, ArrayMember(*bias, "ratio_to_median", "k_bias"));
    for (size_t l = 0; ratio != nullptr && l < ratio->size(); ++l) {
      KVQ_ASSIGN_OR_RETURN(std::optional<double> r,
                           AsNumber((*ratio)[l], Index("k_bias.ratio_to_median", l)));
      const double d = ratio->size() > 1 ? static_cast<double>(l) / (ratio->size() - 1) : 0.0;
      values.push_back({{"model", labels[i]},
                        {"layer", l},
                        {"depth", d},
                        {"metric", "k_proj bias / median layer"},
                        {"value", NumberOrNull(r)}});
    }
  }
  if (values.empty()) return MaybeChart();
  json spec = BaseSpec();
  spec["data"] = {{"values", values}};
  spec["transform"] = {{{"filter", "isValid(datum.value)"}}};
  spec["facet"] = {{"column",
                    {{"field", "metric"},
                     {"type", "nominal"},
                     {"sort", {"k_proj bias / median layer", "token-0 sink mass"}},
                     {"title", nullptr}}}};
  spec["spec"] = {{"width", 320},
                  {"height", 220},
                  {"mark", {{"type", "line"}, {"point", true}}},
                  {"encoding",
                   {{"x",
                     {{"field", "depth"},
                      {"type", "quantitative"},
                      {"title", "layer / (layers - 1)"},
                      {"axis", {{"format", ".0%"}}}}},
                    {"y", {{"field", "value"}, {"type", "quantitative"}, {"title", nullptr}}},
                    {"color", ModelField()},
                    {"tooltip", Tooltip({{"model", "nominal"},
                                         {"layer", "ordinal"},
                                         {"metric", "nominal"},
                                         {"value", "quantitative"}})}}}};
  spec["resolve"] = {{"scale", {{"y", "independent"}}}};
  return MaybeChart(StudyChart{
      "compare-layers", "Layer structure, model by model",
      "Left: each layer's k_proj bias norm over the model's median layer (Qwen2-family models "
      "spike in the first and last layers). Right: the mean attention on the first token per "
      "layer. x is the relative depth, so models with different layer counts line up.",
      std::move(spec)});
}

// "24/50 problems": the count behind a rate, so a reader sees how much a
// point can move (the intervals say it too, but not why).
std::string CountText(double correct, double total, const char* unit) {
  return std::to_string(std::llround(correct)) + "/" + std::to_string(std::llround(total)) + " " +
         unit;
}

// One GSM8K accuracy per scheme of a study, if it ran the stage, with its
// 95% Wilson interval and count.
Status AppendGsm8k(const json& study, const std::string& label, json& values) {
  KVQ_ASSIGN_OR_RETURN(const json* gsm8k, ObjectMember(study, "gsm8k", ""));
  if (gsm8k == nullptr) return Status::Ok();
  KVQ_ASSIGN_OR_RETURN(const json* schemes, ArrayMember(*gsm8k, "schemes", "gsm8k"));
  for (size_t j = 0; schemes != nullptr && j < schemes->size(); ++j) {
    const std::string path = Index("gsm8k.schemes", j);
    KVQ_ASSIGN_OR_RETURN(std::string name, StringMember((*schemes)[j], "name", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> acc, NumberMember((*schemes)[j], "accuracy", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> correct,
                         NumberMember((*schemes)[j], "correct", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> problems,
                         NumberMember((*schemes)[j], "problems", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> low,
                         NumberMember((*schemes)[j], "wilson95_low", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> high,
                         NumberMember((*schemes)[j], "wilson95_high", path));
    json point = {{"model", label},           {"test", "GSM8K"},
                  {"scheme", name},           {"accuracy", NumberOrNull(acc)},
                  {"low", NumberOrNull(low)}, {"high", NumberOrNull(high)}};
    if (correct && problems) point["count"] = CountText(*correct, *problems, "problems");
    values.push_back(std::move(point));
  }
  return Status::Ok();
}

// Each needle scheme's exact-match rate over the cells where f16 passes: the
// same cells for every scheme (f16 also runs cells it fails, which would
// otherwise pull its own rate below the schemes compared with it).
Status AppendNeedle(const json& study, const std::string& label, json& values) {
  KVQ_ASSIGN_OR_RETURN(const json* needle, ObjectMember(study, "needle", ""));
  if (needle == nullptr) return Status::Ok();
  KVQ_ASSIGN_OR_RETURN(auto passing, study_report::NeedlePassingPairs(*needle));
  KVQ_ASSIGN_OR_RETURN(std::vector<NeedleCell> cells, ReadNeedleCells(*needle));
  std::vector<std::string> order;                            // schemes as the study lists them
  std::map<std::string, std::pair<int64_t, int64_t>> tally;  // scheme -> (correct, trials)
  for (const NeedleCell& c : cells) {
    if (passing.count({c.task, c.context}) == 0) continue;
    if (tally.count(c.scheme) == 0) order.push_back(c.scheme);
    tally[c.scheme].first += c.correct;
    tally[c.scheme].second += c.trials;
  }
  for (const std::string& name : order) {
    const auto& [correct, trials] = tally[name];
    if (trials == 0) continue;
    const auto [low, high] = WilsonInterval(correct, trials);
    values.push_back({{"model", label},
                      {"test", "needle (where f16 passes)"},
                      {"scheme", name},
                      {"accuracy", static_cast<double>(correct) / trials},
                      {"low", low},
                      {"high", high},
                      {"count", CountText(static_cast<double>(correct), static_cast<double>(trials),
                                          "trials")}});
  }
  return Status::Ok();
}

StatusOr<MaybeChart> CompareTasks(const std::vector<json>& studies,
                                  const std::vector<std::string>& labels) {
  json values = json::array();
  for (size_t i = 0; i < studies.size(); ++i) {
    KVQ_RETURN_IF_ERROR(AppendGsm8k(studies[i], labels[i], values));
    KVQ_RETURN_IF_ERROR(AppendNeedle(studies[i], labels[i], values));
  }
  if (values.empty()) return MaybeChart();
  json spec = BaseSpec();
  spec["data"] = {{"values", values}};
  spec["facet"] = {{"column", {{"field", "test"}, {"type", "nominal"}, {"title", nullptr}}}};
  // Models share a scheme's row, so each model's points and intervals sit
  // at their own offset within it.
  const json y = {{"field", "scheme"}, {"type", "nominal"}, {"sort", nullptr}, {"title", nullptr}};
  const json y_offset = {{"field", "model"}, {"type", "nominal"}};
  const json x = {{"field", "accuracy"},
                  {"type", "quantitative"},
                  {"axis", {{"format", ".0%"}}},
                  {"scale", {{"domain", {0, 1}}}}};
  // One legend, the colours': the rule layer has no shape channel, so a
  // shape legend would stand apart from it, in grey.
  json point_shape = ModelField();
  point_shape["legend"] = nullptr;
  const json interval = {{"mark", {{"type", "rule"}, {"strokeWidth", 1.5}}},
                         {"encoding",
                          {{"y", y},
                           {"yOffset", y_offset},
                           {"x", {{"field", "low"}, {"type", "quantitative"}}},
                           {"x2", {{"field", "high"}}},
                           {"color", ModelField()}}}};
  const json point = {{"mark", {{"type", "point"}, {"filled", true}, {"size", 60}}},
                      {"encoding",
                       {{"y", y},
                        {"yOffset", y_offset},
                        {"x", x},
                        {"color", ModelField()},
                        {"shape", point_shape},
                        {"tooltip", Tooltip({{"model", "nominal"},
                                             {"test", "nominal"},
                                             {"scheme", "nominal"},
                                             {"count", "nominal"},
                                             {"accuracy", "quantitative"},
                                             {"low", "quantitative"},
                                             {"high", "quantitative"}},
                                            ".1%")}}}};
  spec["spec"] = {{"width", 300}, {"layer", {interval, point}}};
  return MaybeChart(StudyChart{
      "compare-tasks", "Exact recall and reasoning, model by model",
      "GSM8K accuracy per scheme, and the needle tests' exact-match rate over the (task, "
      "context) cells where the model's f16 cache answers at least 90% (the other schemes run "
      "only there; a model with no such cell has no needle points), per model. Lines: 95% "
      "Wilson intervals; the tooltip gives the count behind each point (problems or trials).",
      std::move(spec)});
}

}  // namespace

StatusOr<std::string> RenderComparisonReportHtml(const std::vector<json>& studies) {
  if (studies.size() < 2) return Status::Error("a comparison needs at least two studies");
  for (size_t i = 0; i < studies.size(); ++i) {
    KVQ_RETURN_IF_ERROR(study_report::CheckStudyVersion(studies[i], Index("studies", i)));
  }
  KVQ_ASSIGN_OR_RETURN(std::vector<std::string> labels, ModelLabels(studies));
  study_report::PageParts page;
  page.title = "kvq study: " + std::to_string(studies.size()) + " models side by side";
  for (auto builder : {CompareFronts, CompareSchemes, CompareFakeQuant, CompareLayers, CompareTasks,
                       study_report::CompareContextKl}) {
    auto chart = builder(studies, labels);
    if (!chart.ok()) return chart.status();
    if (*chart) page.charts.push_back(std::move(**chart));
  }
  KVQ_ASSIGN_OR_RETURN(std::string models, ModelTable(studies, labels));
  page.body = "<header>\n<h1>kvq study: models side by side</h1>\n</header>\n" + models;
  // The claims, one column per model.
  std::string claims = "<h3>The write-up's claims per model</h3>\n<div class=\"scroll\"><table>\n";
  std::vector<std::string> header = {"claim", "rows", "bits"};
  for (const std::string& l : labels) header.push_back(EscapeHtml(l));
  claims += TableRow(header, "th");
  std::vector<std::string> keys;  // "id|family|bits" in first-seen order
  std::map<std::string, std::vector<std::string>> cells;
  std::map<std::string, std::vector<std::string>> lead;
  for (size_t i = 0; i < studies.size(); ++i) {
    KVQ_ASSIGN_OR_RETURN(const json* fq, ObjectMember(studies[i], "fake_quant", ""));
    if (fq == nullptr) continue;
    KVQ_ASSIGN_OR_RETURN(const json* list, ArrayMember(*fq, "claims", "fake_quant"));
    for (size_t j = 0; list != nullptr && j < list->size(); ++j) {
      const std::string path = Index("fake_quant.claims", j);
      const json& c = (*list)[j];
      KVQ_ASSIGN_OR_RETURN(std::string id, StringMember(c, "id", path));
      KVQ_ASSIGN_OR_RETURN(std::string claim, StringMember(c, "claim", path));
      KVQ_ASSIGN_OR_RETURN(std::string family, StringMember(c, "family", path));
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> bits, IntMember(c, "bits", path));
      KVQ_ASSIGN_OR_RETURN(std::optional<double> ratio, NumberMember(c, "ratio", path));
      KVQ_ASSIGN_OR_RETURN(bool holds, BoolMember(c, "holds", path));
      const std::string b = bits ? std::to_string(*bits) : "";
      const std::string key = id + "|" + family + "|" + b;
      if (!cells.count(key)) {
        keys.push_back(key);
        cells[key].assign(studies.size(), "&ndash;");
        lead[key] = {EscapeHtml(claim), EscapeHtml(family), b};
      }
      cells[key][i] = (ratio ? study_report::FormatNumber("%.2f&times; ", *ratio) : "") +
                      (holds ? "holds" : "<b>fails</b>");
    }
  }
  for (const std::string& key : keys) {
    std::vector<std::string> row = lead[key];
    row.insert(row.end(), cells[key].begin(), cells[key].end());
    claims += TableRow(row);
  }
  claims += "</table></div>\n";
  if (!keys.empty()) page.after_chart.push_back({"compare-fake-quant", claims});
  return study_report::AssemblePage(page);
}

Status WriteComparisonReport(const std::vector<json>& studies, const std::string& path) {
  KVQ_ASSIGN_OR_RETURN(std::string html, RenderComparisonReportHtml(studies));
  return WriteTextFile(path, html);
}

}  // namespace kvq
