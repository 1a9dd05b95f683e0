// Pieces of the study report shared between its files (internal to
// study/study_report*.cc).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "study/study_report.h"

namespace kvq::study_report {

using MaybeChart = std::optional<StudyChart>;

nlohmann::json BaseSpec();
nlohmann::json Tooltip(std::initializer_list<std::pair<const char*, const char*>> fields_and_types,
                       const char* number_format = ".4~g");
// How a recall heatmap looks: its depth axis's title, its colour legend's
// title, the tooltip fields and the cell size.
struct RecallHeatmapStyle {
  const char* depth_title;
  const char* color_title;
  nlohmann::json tooltip;
  int step;
  int font_size;
};
// A faceted accuracy heatmap (passkey recall, needle tasks): one rect per
// (depth, scheme) coloured by "accuracy" on [0, 1] with the cell's "label"
// on top, one column per context length in ascending order and, when
// by_task, one row per "task". values: objects with "scheme", "depth",
// "accuracy", "label" (and "task"); contexts[i] is values[i]'s context
// length, which the spec labels "context N".
nlohmann::json RecallHeatmapSpec(nlohmann::json values, const std::vector<int64_t>& contexts,
                                 bool by_task, const RecallHeatmapStyle& style);

// Structure of the cache (study_report_structure.cc): k_proj bias norms per
// layer, attention sinks per layer and head, K/V value statistics.
StatusOr<MaybeChart> KBiasChart(const nlohmann::json& study);
StatusOr<MaybeChart> SinkChart(const nlohmann::json& study);
StatusOr<MaybeChart> TensorStatsChart(const nlohmann::json& study);

// The write-up's claims as an HTML table (study_report_structure.cc); "" when
// the study has none.
StatusOr<std::string> ClaimsTable(const nlohmann::json& study);

// Needle in a haystack and GSM8K (study_report_tasks.cc): a chart and a
// table each ("" / no chart when the study has no such section).
StatusOr<MaybeChart> NeedleChart(const nlohmann::json& study);
// One needle cell of one scheme, as needle.json holds it.
struct NeedleCell {
  std::string scheme, task;
  int64_t context = 0;
  double depth = 0;
  int64_t correct = 0, trials = 0;
};
// Every scheme's cells, in order; a cell without its numbers is an error.
StatusOr<std::vector<NeedleCell>> ReadNeedleCells(const nlohmann::json& needle);
// The (task, context) pairs where the study's f16 cache passed the needle test.
StatusOr<std::set<std::pair<std::string, int64_t>>> NeedlePassingPairs(
    const nlohmann::json& needle);
// Two tables: every (task, context) pair, then the grid, context by
// depth, with the tasks f16 passes pooled.
StatusOr<std::string> NeedleTable(const nlohmann::json& study);
StatusOr<MaybeChart> Gsm8kChart(const nlohmann::json& study);
StatusOr<std::string> Gsm8kTable(const nlohmann::json& study);

// KL by context length (study_report_context.cc): one study's chart, and
// the comparison's (one panel per scheme, a line per model).
StatusOr<MaybeChart> ContextKlChart(const nlohmann::json& study);
StatusOr<MaybeChart> CompareContextKl(const std::vector<nlohmann::json>& studies,
                                      const std::vector<std::string>& labels);

// The page around `body` (study_report.cc): head, self-check, body, the
// chart sections (each followed by after_chart[id] if present), footer,
// libraries, chart data and driver.
struct PageParts {
  std::string title;
  std::string body;  // HTML before the chart sections
  std::vector<StudyChart> charts;
  std::vector<std::pair<std::string, std::string>> after_chart;  // (chart id, HTML)
  std::string note;                                              // HTML after the chart sections
};
StatusOr<std::string> AssemblePage(const PageParts& parts);

// <tr> of cells that are already HTML.
std::string TableRow(const std::vector<std::string>& cells, const char* tag = "td");

std::string FormatNumber(const char* format, double x);

// An error unless `study` is an object of this kStudyVersion; `what` names it.
Status CheckStudyVersion(const nlohmann::json& study, const std::string& what);

}  // namespace kvq::study_report
