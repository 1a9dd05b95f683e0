// The self-contained HTML report of `kvq study`: rendered from the study JSON
// (docs/study.md, kStudyVersion) and never recomputing a
// measurement. Charts are Vega-Lite specs with their data inlined, drawn by
// Vega, Vega-Lite and vega-embed, whose bundles are compiled into kvq
// (cmake/vega_assets.cmake), so the page works offline and kvq needs no file
// at run time.
//
// The page records its own health in
//   <div id="kvq-status" data-charts-expected="N" data-charts-ok=".."
//        data-charts-failed=".." data-errors=".." data-warnings=".." data-done="0|1">
// (window.onerror, unhandled rejections, console.error/warn, Content Security
// Policy violations, and each chart's vegaEmbed promise), which the headless
// Chromium test (tests/report/) reads.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kvq {

// One chart of the report.
struct StudyChart {
  std::string id;       // [a-z0-9-]: the container is <div id="chart-<id>">
  std::string title;    // plain text (escaped when written)
  std::string caption;  // plain text: what the chart shows and how to read it
  nlohmann::json spec;  // Vega-Lite v5 spec, data inlined
};

// The charts the study has data for, in page order: outlier heatmap, fake-
// quant errors (overall, per layer), quality vs bytes Pareto, memory vs
// context, recall by depth. A section that is absent or empty (e.g. a run
// without end-to-end schemes) yields no chart; a section of the wrong shape is
// an error naming the field.
StatusOr<std::vector<StudyChart>> BuildStudyCharts(const nlohmann::json& study);

// The whole page as one string (UTF-8). Errors: not a version-1 study object,
// a malformed section, or a kvq built without the chart bundles.
StatusOr<std::string> RenderStudyReportHtml(const nlohmann::json& study);

// RenderStudyReportHtml, written to `path` (replaced if present).
Status WriteStudyReport(const nlohmann::json& study, const std::string& path);

// One page putting several models' studies side by side (each a study JSON
// of this version): a table of the models, then charts faceted or coloured
// by model for every section at least one study has.
StatusOr<std::string> RenderComparisonReportHtml(const std::vector<nlohmann::json>& studies);
Status WriteComparisonReport(const std::vector<nlohmann::json>& studies, const std::string& path);

// on_front[i]: point i has both coordinates and no other point is at least as
// good in both (both minimized) and strictly better in one. The report's
// fronts and `kvq study`'s printed one (bits or bytes against KL).
std::vector<bool> ParetoFront(const std::vector<std::optional<double>>& x,
                              const std::vector<std::optional<double>>& y);

// Text safe inside HTML element content and quoted attribute values.
std::string EscapeHtml(std::string_view text);

// JSON text safe inside a <script> element: '<', '>', '&' and every non-ASCII
// character are \u-escaped (so no "</script" or "<!--" can appear), invalid
// UTF-8 is replaced by U+FFFD. JSON.parse returns the same value.
std::string JsonForScript(const nlohmann::json& value);

// The embedded chart bundles (empty when kvq was built without .deps).
struct ChartLibrary {
  std::string_view name;     // npm package
  std::string_view version;  // pinned in scripts/setup.sh
  std::string_view js;       // the UMD bundle, build/*.min.js
};
std::vector<ChartLibrary> EmbeddedChartLibraries();

}  // namespace kvq
