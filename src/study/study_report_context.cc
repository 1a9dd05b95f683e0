// The report's "small model + long context" charts: KL vs f16 by context
// length per scheme (one study), and the same across models (a comparison).
#include <string>
#include <vector>

#include "study/study_report_internal.h"
#include "study/study_report_json.h"

namespace kvq::study_report {

namespace {

using nlohmann::json;
using study_json::ArrayMember;
using study_json::BoolMember;
using study_json::Index;
using study_json::IntMember;
using study_json::Join;
using study_json::NumberMember;
using study_json::NumberOrNull;
using study_json::ObjectMember;
using study_json::StringMember;

// Points of the study's context_kl section, f16 left out (KL 0 by definition
// has no place on a log axis); an empty array when the study has none.
StatusOr<json> ContextKlValues(const json& study, const std::string& model) {
  json values = json::array();
  KVQ_ASSIGN_OR_RETURN(const json* section, ObjectMember(study, "context_kl", ""));
  if (section == nullptr) return values;
  KVQ_ASSIGN_OR_RETURN(const json* schemes, ArrayMember(*section, "schemes", "context_kl"));
  for (size_t i = 0; schemes != nullptr && i < schemes->size(); ++i) {
    const std::string path = Index("context_kl.schemes", i);
    const json& s = (*schemes)[i];
    KVQ_ASSIGN_OR_RETURN(std::string name, StringMember(s, "name", path));
    KVQ_ASSIGN_OR_RETURN(bool baseline, BoolMember(s, "baseline", path));
    KVQ_ASSIGN_OR_RETURN(const json* points, ArrayMember(s, "points", path));
    for (size_t j = 0; !baseline && points != nullptr && j < points->size(); ++j) {
      const std::string ppath = Index(Join(path, "points"), j);
      const json& p = (*points)[j];
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> context, IntMember(p, "context", ppath));
      KVQ_ASSIGN_OR_RETURN(std::optional<double> kl, NumberMember(p, "kl_mean", ppath));
      KVQ_ASSIGN_OR_RETURN(std::optional<double> p99, NumberMember(p, "kl_p99", ppath));
      KVQ_ASSIGN_OR_RETURN(std::optional<double> top1, NumberMember(p, "top1_agreement", ppath));
      if (!context) return Status::Error(ppath + ": needs context");
      values.push_back({{"model", model},
                        {"scheme", name},
                        {"context", *context},
                        {"kl_mean", NumberOrNull(kl)},
                        {"kl_p99", NumberOrNull(p99)},
                        {"top1_agreement", NumberOrNull(top1)}});
    }
  }
  return values;
}

// One line per `series` field over context (log 2) and mean KL (log).
json LineLayer(const char* series, int width) {
  return json{{"width", width},
              {"height", 220},
              {"transform", {{{"filter", "isValid(datum.kl_mean) && datum.kl_mean > 0"}}}},
              {"mark", {{"type", "line"}, {"point", true}}},
              {"encoding",
               {{"x",
                 {{"field", "context"},
                  {"type", "quantitative"},
                  {"title", "context length (tokens)"},
                  {"scale", {{"type", "log"}, {"base", 2}}}}},
                {"y",
                 {{"field", "kl_mean"},
                  {"type", "quantitative"},
                  {"title", "mean KL vs f16 (nats, log)"},
                  {"scale", {{"type", "log"}}}}},
                {"color", {{"field", series}, {"type", "nominal"}, {"sort", nullptr}}},
                {"tooltip", Tooltip({{"model", "nominal"},
                                     {"scheme", "nominal"},
                                     {"context", "quantitative"},
                                     {"kl_mean", "quantitative"},
                                     {"kl_p99", "quantitative"},
                                     {"top1_agreement", "quantitative"}})}}}};
}

}  // namespace

StatusOr<MaybeChart> ContextKlChart(const json& study) {
  KVQ_ASSIGN_OR_RETURN(json values, ContextKlValues(study, ""));
  if (values.empty()) return MaybeChart();
  json spec = BaseSpec();
  spec.update(LineLayer("scheme", 420));
  spec["data"] = {{"values", values}};
  KVQ_ASSIGN_OR_RETURN(const json* section, ObjectMember(study, "context_kl", ""));
  std::string best = "none of the schemes is 2-bit";
  if (section->contains("best_2bit") && (*section)["best_2bit"].is_string()) {
    best = "the best 2-bit scheme at the longest length is " +
           (*section)["best_2bit"].get<std::string>();
  }
  return MaybeChart(StudyChart{
      "context-kl", "KL vs f16 by context length",
      "Each point: the scheme's cache over windows of that length, the second half of each "
      "window scored against the f16 cache's next-token distribution (the same windows for "
      "every scheme, about the same number of scored positions at every length). A line that "
      "climbs is a scheme whose error grows with the tokens it holds; " +
          best + ".",
      std::move(spec)});
}

StatusOr<MaybeChart> CompareContextKl(const std::vector<json>& studies,
                                      const std::vector<std::string>& labels) {
  json values = json::array();
  for (size_t i = 0; i < studies.size(); ++i) {
    KVQ_ASSIGN_OR_RETURN(json one, ContextKlValues(studies[i], labels[i]));
    for (json& v : one) values.push_back(std::move(v));
  }
  if (values.empty()) return MaybeChart();
  json spec = BaseSpec();
  spec["data"] = {{"values", values}};
  // Wrapped, 3 panels a row: one row of 5+ schemes is wider than the page.
  spec["facet"] = {{"field", "scheme"}, {"type", "nominal"}, {"sort", nullptr}};
  spec["columns"] = 3;
  spec["spec"] = LineLayer("model", 260);
  return MaybeChart(StudyChart{
      "compare-context-kl", "KL vs f16 by context length, model by model",
      "One panel per scheme, one line per model (each against its own f16 cache; windows of "
      "the context length, the second half of each scored): whether a small model loses more "
      "to the same cache as its context grows.",
      std::move(spec)});
}

}  // namespace kvq::study_report
