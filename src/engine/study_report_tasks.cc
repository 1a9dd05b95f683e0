// The report's exact-recall (needle in a haystack) and reasoning (GSM8K)
// sections: a chart and a table each.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "engine/study_report_internal.h"
#include "engine/study_report_json.h"

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

struct NeedleCell {
  std::string scheme, task;
  int64_t context = 0;
  double depth = 0;
  int64_t correct = 0, trials = 0;
};

StatusOr<std::vector<NeedleCell>> ReadNeedleCells(const json& needle) {
  std::vector<NeedleCell> cells;
  KVQ_ASSIGN_OR_RETURN(const json* schemes, ArrayMember(needle, "schemes", "needle"));
  for (size_t i = 0; schemes != nullptr && i < schemes->size(); ++i) {
    const std::string path = Index("needle.schemes", i);
    KVQ_ASSIGN_OR_RETURN(std::string name, StringMember((*schemes)[i], "name", path));
    KVQ_ASSIGN_OR_RETURN(const json* list, ArrayMember((*schemes)[i], "cells", path));
    for (size_t j = 0; list != nullptr && j < list->size(); ++j) {
      const std::string cpath = Index(Join(path, "cells"), j);
      const json& c = (*list)[j];
      NeedleCell cell;
      cell.scheme = name;
      KVQ_ASSIGN_OR_RETURN(cell.task, StringMember(c, "task", cpath));
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> context, IntMember(c, "context", cpath));
      KVQ_ASSIGN_OR_RETURN(std::optional<double> depth, NumberMember(c, "depth", cpath));
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> correct, IntMember(c, "correct", cpath));
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> trials, IntMember(c, "trials", cpath));
      if (!context || !depth || !correct || !trials) {
        return Status::Error(cpath + ": needs context, depth, correct and trials");
      }
      cell.context = *context;
      cell.depth = *depth;
      cell.correct = *correct;
      cell.trials = *trials;
      cells.push_back(std::move(cell));
    }
  }
  return cells;
}

}  // namespace

StatusOr<MaybeChart> NeedleChart(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* needle, ObjectMember(study, "needle", ""));
  if (needle == nullptr) return MaybeChart();
  KVQ_ASSIGN_OR_RETURN(std::vector<NeedleCell> cells, ReadNeedleCells(*needle));
  if (cells.empty()) return MaybeChart();
  json values = json::array();
  std::vector<int64_t> contexts;
  for (const NeedleCell& c : cells) {
    if (std::find(contexts.begin(), contexts.end(), c.context) == contexts.end())
      contexts.push_back(c.context);
    values.push_back(
        {{"scheme", c.scheme},
         {"task", c.task},
         {"context", "context " + std::to_string(c.context)},
         {"depth", c.depth},
         {"accuracy", c.trials > 0 ? json(static_cast<double>(c.correct) / c.trials) : json()},
         {"label", std::to_string(c.correct) + "/" + std::to_string(c.trials)}});
  }
  std::sort(contexts.begin(), contexts.end());
  json context_order = json::array();
  for (int64_t c : contexts) context_order.push_back("context " + std::to_string(c));
  const json x = {{"field", "depth"},
                  {"type", "ordinal"},
                  {"title", "needle depth"},
                  {"axis", {{"format", ".0%"}, {"labelAngle", 0}}}};
  const json y = {{"field", "scheme"}, {"type", "nominal"}, {"sort", nullptr}, {"title", nullptr}};
  json spec = BaseSpec();
  spec["data"] = {{"values", values}};
  spec["facet"] = {
      {"row", {{"field", "task"}, {"type", "nominal"}, {"sort", nullptr}, {"title", nullptr}}},
      {"column",
       {{"field", "context"}, {"type", "nominal"}, {"sort", context_order}, {"title", nullptr}}}};
  spec["spec"] = {{"width", {{"step", 36}}},
                  {"layer",
                   {{{"mark", "rect"},
                     {"encoding",
                      {{"x", x},
                       {"y", y},
                       {"color",
                        {{"field", "accuracy"},
                         {"type", "quantitative"},
                         {"title", "exact match"},
                         {"scale", {{"domain", {0, 1}}, {"scheme", "redyellowgreen"}}},
                         {"legend", {{"format", ".0%"}}}}},
                       {"tooltip", Tooltip({{"scheme", "nominal"},
                                            {"task", "nominal"},
                                            {"context", "nominal"},
                                            {"depth", "quantitative"},
                                            {"label", "nominal"}},
                                           ".0%")}}}},
                    {{"mark", {{"type", "text"}, {"fontSize", 9}}},
                     {"encoding", {{"x", x}, {"y", y}, {"text", {{"field", "label"}}}}}}}}};
  KVQ_ASSIGN_OR_RETURN(std::string statement, StringMember(*needle, "statement", "needle"));
  KVQ_ASSIGN_OR_RETURN(std::string rule, StringMember(*needle, "rule", "needle"));
  return MaybeChart(StudyChart{
      "needle", "Needle in a haystack: exact recall by task, context and depth",
      "RULER-style tests generated by kvq: special numbers hidden in filler text (repeated "
      "sentences, or a haystack made of other needles), one asked for at the end; each cell is "
      "exact answers / trials. Rows: task; columns: context length. " +
          rule + ". " + statement + ".",
      std::move(spec)});
}

StatusOr<std::string> NeedleTable(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* needle, ObjectMember(study, "needle", ""));
  if (needle == nullptr) return std::string();
  KVQ_ASSIGN_OR_RETURN(std::vector<NeedleCell> cells, ReadNeedleCells(*needle));
  // (scheme, task, context) -> (correct, trials), in the study's order.
  std::vector<std::string> schemes, tasks;
  std::map<std::tuple<std::string, std::string, int64_t>, std::pair<int64_t, int64_t>> tally;
  std::vector<int64_t> contexts;
  for (const NeedleCell& c : cells) {
    if (std::find(schemes.begin(), schemes.end(), c.scheme) == schemes.end())
      schemes.push_back(c.scheme);
    if (std::find(tasks.begin(), tasks.end(), c.task) == tasks.end()) tasks.push_back(c.task);
    if (std::find(contexts.begin(), contexts.end(), c.context) == contexts.end())
      contexts.push_back(c.context);
    auto& t = tally[{c.scheme, c.task, c.context}];
    t.first += c.correct;
    t.second += c.trials;
  }
  std::sort(contexts.begin(), contexts.end());
  std::vector<std::string> header = {"task", "context"};
  for (const std::string& s : schemes) header.push_back(EscapeHtml(s));
  std::string out = "<div class=\"scroll\"><table>\n" + TableRow(header, "th");
  for (const std::string& task : tasks) {
    for (int64_t context : contexts) {
      std::vector<std::string> row = {EscapeHtml(task), std::to_string(context)};
      for (const std::string& s : schemes) {
        auto it = tally.find({s, task, context});
        if (it == tally.end() || it->second.second == 0) {
          row.push_back("not run");
          continue;
        }
        row.push_back(FormatNumber("%.0f%%", 100.0 * it->second.first / it->second.second) + " (" +
                      std::to_string(it->second.first) + "/" + std::to_string(it->second.second) +
                      ")");
      }
      out += TableRow(row);
    }
  }
  KVQ_ASSIGN_OR_RETURN(std::string statement, StringMember(*needle, "statement", "needle"));
  out +=
      "</table></div>\n<p class=\"caption\">Exact matches over every depth per task and "
      "context. Schemes other than f16 run only where f16 reaches 90% (<i>not run</i> "
      "elsewhere: there the model itself cannot do the task). " +
      EscapeHtml(statement) + ".</p>\n";
  return out;
}

StatusOr<MaybeChart> Gsm8kChart(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* gsm8k, ObjectMember(study, "gsm8k", ""));
  if (gsm8k == nullptr) return MaybeChart();
  KVQ_ASSIGN_OR_RETURN(const json* schemes, ArrayMember(*gsm8k, "schemes", "gsm8k"));
  if (schemes == nullptr || schemes->empty()) return MaybeChart();
  json values = json::array();
  for (size_t i = 0; i < schemes->size(); ++i) {
    const std::string path = Index("gsm8k.schemes", i);
    const json& s = (*schemes)[i];
    KVQ_ASSIGN_OR_RETURN(std::string name, StringMember(s, "name", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> acc, NumberMember(s, "accuracy", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> low, NumberMember(s, "wilson95_low", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> high, NumberMember(s, "wilson95_high", path));
    values.push_back({{"scheme", name},
                      {"accuracy", NumberOrNull(acc)},
                      {"low", NumberOrNull(low)},
                      {"high", NumberOrNull(high)}});
  }
  const json y = {{"field", "scheme"}, {"type", "nominal"}, {"sort", nullptr}, {"title", nullptr}};
  json spec = BaseSpec();
  spec["data"] = {{"values", values}};
  spec["width"] = 420;
  spec["layer"] = {
      {{"mark", {{"type", "bar"}, {"color", "#4c78a8"}}},
       {"encoding",
        {{"y", y},
         {"x",
          {{"field", "accuracy"},
           {"type", "quantitative"},
           {"title", "GSM8K accuracy (95% Wilson interval)"},
           {"axis", {{"format", ".0%"}}},
           {"scale", {{"domain", {0, 1}}}}}},
         {"tooltip", Tooltip({{"scheme", "nominal"},
                              {"accuracy", "quantitative"},
                              {"low", "quantitative"},
                              {"high", "quantitative"}},
                             ".1%")}}}},
      {{"mark", {{"type", "rule"}, {"color", "#222"}}},
       {"encoding",
        {{"y", y},
         {"x", {{"field", "low"}, {"type", "quantitative"}}},
         {"x2", {{"field", "high"}}}}}},
      // A dot at the accuracy, so a 0% bar still shows where it is.
      {{"mark", {{"type", "point"}, {"filled", true}, {"color", "#d62728"}, {"size", 160}}},
       {"encoding", {{"y", y}, {"x", {{"field", "accuracy"}, {"type", "quantitative"}}}}}}};
  KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> n, IntMember(*gsm8k, "problems", "gsm8k"));
  return MaybeChart(StudyChart{
      "gsm8k", "Reasoning: GSM8K accuracy per scheme",
      "Greedy answers to the same " + (n ? std::to_string(*n) : std::string("")) +
          " GSM8K test problems for every scheme; a problem counts when the model's last "
          "number equals the reference's. Bars: accuracy; lines: 95% Wilson intervals (two "
          "schemes whose intervals overlap widely are not distinguished by this many "
          "problems).",
      std::move(spec)});
}

StatusOr<std::string> Gsm8kTable(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* gsm8k, ObjectMember(study, "gsm8k", ""));
  if (gsm8k == nullptr) return std::string();
  KVQ_ASSIGN_OR_RETURN(const json* schemes, ArrayMember(*gsm8k, "schemes", "gsm8k"));
  if (schemes == nullptr || schemes->empty()) return std::string();
  std::string out =
      "<div class=\"scroll\"><table>\n" +
      TableRow({"scheme", "correct", "accuracy", "95% Wilson", "mean tokens", "hit token limit"},
               "th");
  for (size_t i = 0; i < schemes->size(); ++i) {
    const std::string path = Index("gsm8k.schemes", i);
    const json& s = (*schemes)[i];
    KVQ_ASSIGN_OR_RETURN(std::string name, StringMember(s, "name", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> correct, IntMember(s, "correct", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> problems, IntMember(s, "problems", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> acc, NumberMember(s, "accuracy", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> low, NumberMember(s, "wilson95_low", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> high, NumberMember(s, "wilson95_high", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> tokens,
                         NumberMember(s, "mean_generated_tokens", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> limited, IntMember(s, "hit_token_limit", path));
    out += TableRow(
        {"<b>" + EscapeHtml(name) + "</b>",
         std::to_string(correct.value_or(0)) + "/" + std::to_string(problems.value_or(0)),
         acc ? FormatNumber("%.1f%%", 100 * *acc) : "&ndash;",
         low && high
             ? FormatNumber("%.1f", 100 * *low) + "&ndash;" + FormatNumber("%.1f%%", 100 * *high)
             : "&ndash;",
         tokens ? FormatNumber("%.0f", *tokens) : "&ndash;", std::to_string(limited.value_or(0))});
  }
  KVQ_ASSIGN_OR_RETURN(std::string rule, StringMember(*gsm8k, "rule", "gsm8k"));
  out += "</table></div>\n<p class=\"caption\">" + EscapeHtml(rule) + ".</p>\n";
  return out;
}

}  // namespace kvq::study_report
