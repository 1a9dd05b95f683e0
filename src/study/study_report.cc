// The HTML page of the study report: header, tables, chart sections, the
// embedded chart libraries and the self-check script (see study_report.h).
#include "study/study_report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "study/study.h"
#include "study/study_report_internal.h"
#include "study/study_report_json.h"

// The chart bundles, from the generated assembler file (cmake/vega_assets.cmake).
extern "C" {
extern const char kvq_asset_vega_js[];
extern const uint64_t kvq_asset_vega_js_size;
extern const char kvq_asset_vega_version[];
extern const char kvq_asset_vega_lite_js[];
extern const uint64_t kvq_asset_vega_lite_js_size;
extern const char kvq_asset_vega_lite_version[];
extern const char kvq_asset_vega_embed_js[];
extern const uint64_t kvq_asset_vega_embed_js_size;
extern const char kvq_asset_vega_embed_version[];
}

namespace kvq {

namespace {

using nlohmann::json;
using study_json::ArrayMember;
using study_json::AsNumber;
using study_json::Index;
using study_json::IntMember;
using study_json::Join;
using study_json::NumberMember;
using study_json::ObjectMember;
using study_json::StringMember;

// Every chart section the report can have, in page order, for the note that
// lists what a study left out.
struct KnownChart {
  const char* id;
  const char* what;
};
constexpr KnownChart kKnownCharts[] = {
    {"outlier-heatmap", "outlier structure (outliers)"},
    {"k-bias", "k_proj bias norms (outliers.k_bias)"},
    {"sinks", "attention sinks (outliers.layers[*].sink_mass_per_head)"},
    {"tensor-stats", "K/V value statistics (outliers.layers[*].v_stats)"},
    {"fake-quant", "fake-quant comparison (fake_quant)"},
    {"fake-quant-layers", "per-layer fake-quant errors (fake_quant.rows[*].per_layer)"},
    {"pareto", "end-to-end schemes (schemes)"},
    {"memory", "memory plan (memory)"},
    {"recall", "passkey recall (schemes[*].recall)"},
    {"needle", "needle in a haystack (needle; kvq study --niah or --full)"},
    {"gsm8k", "GSM8K reasoning (gsm8k; kvq study --gsm8k-problems N or --full)"},
    {"context-kl", "KL by context length (context_kl; kvq study --context-kl or --full)"}};

std::string Format(const char* format, double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, x);
  return buf;
}

constexpr const char* kMissing = "&ndash;";  // a value the study did not record

std::string Cell(const std::optional<double>& x, const char* format) {
  return x ? Format(format, *x) : kMissing;
}

// Bytes as an integer when they are one (the planner's counts), else 1 decimal.
std::string BytesCell(const std::optional<double>& x) {
  if (!x) return kMissing;
  return Format(*x == std::floor(*x) ? "%.0f" : "%.1f", *x);
}

std::string Row(const std::vector<std::string>& cells, const char* tag = "td") {
  std::string out = "<tr>";
  for (const std::string& cell : cells) {
    out += std::string("<") + tag + ">" + cell + "</" + tag + ">";
  }
  return out + "</tr>\n";
}

// ---- header ---------------------------------------------------------------

StatusOr<std::string> Header(const json& study) {
  std::string out = "<header>\n<h1>kvq study</h1>\n<dl>\n";
  auto item = [&out](const std::string& term, const std::string& escaped_value) {
    out += "<dt>" + term + "</dt><dd>" + escaped_value + "</dd>\n";
  };
  KVQ_ASSIGN_OR_RETURN(const json* model, ObjectMember(study, "model", ""));
  if (model != nullptr) {
    KVQ_ASSIGN_OR_RETURN(std::string path, StringMember(*model, "path", "model"));
    KVQ_ASSIGN_OR_RETURN(std::string arch, StringMember(*model, "architecture", "model"));
    std::string shape;
    for (const char* key : {"layers", "heads", "kv_heads", "head_dim", "context", "parameters"}) {
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> v, IntMember(*model, key, "model"));
      if (!v) continue;
      shape += std::string(shape.empty() ? "" : ", ") + key + " " + std::to_string(*v);
    }
    item("model", "<code>" + EscapeHtml(path) + "</code>" +
                      (arch.empty() ? "" : " (" + EscapeHtml(arch) + ")") +
                      (shape.empty() ? "" : "<br><span class=\"dim\">" + shape + "</span>"));
  }
  KVQ_ASSIGN_OR_RETURN(const json* text, ObjectMember(study, "text", ""));
  if (text != nullptr) {
    KVQ_ASSIGN_OR_RETURN(std::string path, StringMember(*text, "path", "text"));
    KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> tokens, IntMember(*text, "prefix_tokens", "text"));
    item("text",
         "<code>" + EscapeHtml(path) + "</code>" +
             (tokens ? ", its first " + std::to_string(*tokens) +
                           " tokens for perplexity and capture (passkey filler from all of it)"
                     : ""));
  }
  KVQ_ASSIGN_OR_RETURN(std::string command, StringMember(study, "command", ""));
  if (!command.empty()) item("command", "<code>" + EscapeHtml(command) + "</code>");
  KVQ_ASSIGN_OR_RETURN(std::string created, StringMember(study, "created_utc", ""));
  KVQ_ASSIGN_OR_RETURN(bool quick, study_json::BoolMember(study, "quick", ""));
  if (!created.empty() || quick) {
    item("run", EscapeHtml(created) +
                    (quick ? " &middot; <b>--quick</b> (a smaller run for CI: fewer tokens, "
                             "windows and trials)"
                           : ""));
  }
  KVQ_ASSIGN_OR_RETURN(const json* timings, ObjectMember(study, "timings_seconds", ""));
  if (timings != nullptr) {
    std::string list;
    for (const auto& [name, value] : timings->items()) {
      KVQ_ASSIGN_OR_RETURN(std::optional<double> seconds,
                           AsNumber(value, Join("timings_seconds", name)));
      if (!seconds) continue;
      list += (list.empty() ? "" : ", ") + EscapeHtml(name) + " " + Format("%.1f", *seconds) + " s";
    }
    if (!list.empty()) item("time", list);
  }
  return out + "</dl>\n</header>\n";
}

// ---- the schemes table ----------------------------------------------------

StatusOr<std::string> SchemesTable(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* schemes, ArrayMember(study, "schemes", ""));
  if (schemes == nullptr || schemes->empty()) return std::string();
  std::string out =
      "<section id=\"schemes\">\n<h2>End to end with real caches</h2>\n"
      "<div class=\"scroll\"><table>\n";
  out += Row({"scheme", "K", "V", "rotated", "bits/value", "bytes/token", "vs f16", "perplexity",
              "KL mean", "KL p99", "top-1 agree", "passkey recall"},
             "th");
  for (size_t i = 0; i < schemes->size(); ++i) {
    const std::string path = Index("schemes", i);
    const json& s = (*schemes)[i];
    KVQ_ASSIGN_OR_RETURN(std::string name, StringMember(s, "name", path));
    KVQ_ASSIGN_OR_RETURN(std::string k_type, StringMember(s, "k_type", path));
    KVQ_ASSIGN_OR_RETURN(std::string v_type, StringMember(s, "v_type", path));
    KVQ_ASSIGN_OR_RETURN(bool rotate, study_json::BoolMember(s, "rotate", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> bits, NumberMember(s, "bits_per_value", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> bytes, NumberMember(s, "bytes_per_token", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> ratio, NumberMember(s, "compression_vs_f16", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> ppl, NumberMember(s, "ppl", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> ppl_error, NumberMember(s, "ppl_error", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> kl_mean, NumberMember(s, "kl_mean", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> kl_p99, NumberMember(s, "kl_p99", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> top1, NumberMember(s, "top1_agreement", path));
    KVQ_ASSIGN_OR_RETURN(const json* recall, ArrayMember(s, "recall", path));
    int64_t correct = 0, trials = 0;
    for (size_t j = 0; recall != nullptr && j < recall->size(); ++j) {
      const std::string rpath = Index(Join(path, "recall"), j);
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> c, IntMember((*recall)[j], "correct", rpath));
      KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> t, IntMember((*recall)[j], "trials", rpath));
      correct += c.value_or(0);
      trials += t.value_or(0);
    }
    std::string ppl_cell = Cell(ppl, "%.3f");
    if (ppl && ppl_error) ppl_cell += " &plusmn; " + Format("%.3f", *ppl_error);
    std::string recall_cell = kMissing;
    if (trials > 0) {
      recall_cell = std::to_string(correct) + "/" + std::to_string(trials) + " (" +
                    Format("%.0f", 100.0 * correct / trials) + "%)";
    }
    out +=
        Row({"<b>" + EscapeHtml(name) + "</b>", EscapeHtml(k_type), EscapeHtml(v_type),
             rotate ? "yes" : "no", Cell(bits, "%.2f"), BytesCell(bytes),
             ratio ? Format("%.2f&times;", *ratio) : kMissing, ppl_cell, Cell(kl_mean, "%.3g"),
             Cell(kl_p99, "%.3g"), top1 ? Format("%.2f%%", 100.0 * *top1) : kMissing, recall_cell});
  }
  out +=
      "</table></div>\n<p class=\"caption\">One row per cache type or scheme, each run through the "
      "real KV cache on the same text. <i>bits/value</i> and <i>bytes/token</i> count everything "
      "the cache stores (scales, zero-points, residual windows, outliers), not just the nominal "
      "bits; <i>vs f16</i> is the compression ratio. Perplexity follows kvq perplexity's "
      "convention (the second half of each window is scored); KL is the divergence of the "
      "next-token distribution from the f16 cache's on the same windows, <i>top-1 agree</i> how "
      "often both pick the same most likely token. <i>Passkey recall</i> sums every context and "
      "depth of the recall chart below.</p>\n</section>\n";
  return out;
}

// ---- the outlier table ----------------------------------------------------

std::string ChannelList(const json& channels) {
  if (!channels.is_array() || channels.empty()) return "none";
  std::string out;
  for (const json& c : channels) {
    out += (out.empty() ? "" : ", ") + (c.is_number() ? c.dump() : EscapeHtml(c.dump()));
  }
  return out;
}

StatusOr<std::string> OutlierTable(const json& study) {
  KVQ_ASSIGN_OR_RETURN(const json* outliers, ObjectMember(study, "outliers", ""));
  if (outliers == nullptr) return std::string();
  KVQ_ASSIGN_OR_RETURN(const json* layers, ArrayMember(*outliers, "layers", "outliers"));
  if (layers == nullptr || layers->empty()) return std::string();
  const json* bias_norms = nullptr;  // [layers][kv_heads], may be empty
  KVQ_ASSIGN_OR_RETURN(const json* model, ObjectMember(study, "model", ""));
  if (model != nullptr) {
    KVQ_ASSIGN_OR_RETURN(bias_norms, ArrayMember(*model, "k_bias_norms", "model"));
  }
  std::string out = "<div class=\"scroll\"><table>\n";
  out += Row({"layer", "KV head", "K outlier channels (pre-RoPE)", "consistency",
              "K outlier channels (post-RoPE)", "V outlier channels", "k_proj bias norm",
              "sink mass (layer)"},
             "th");
  for (size_t i = 0; i < layers->size(); ++i) {
    const std::string path = Index("outliers.layers", i);
    const json& layer = (*layers)[i];
    KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> index, IntMember(layer, "layer", path));
    const int64_t l = index.value_or(static_cast<int64_t>(i));
    KVQ_ASSIGN_OR_RETURN(const json* channels,
                         ArrayMember(layer, "k_pre_rope_outlier_channels", path));
    KVQ_ASSIGN_OR_RETURN(const json* consistency,
                         ArrayMember(layer, "k_pre_rope_outlier_consistency", path));
    KVQ_ASSIGN_OR_RETURN(const json* post,
                         ArrayMember(layer, "k_post_rope_outlier_channels", path));
    KVQ_ASSIGN_OR_RETURN(const json* v_channels, ArrayMember(layer, "v_outlier_channels", path));
    KVQ_ASSIGN_OR_RETURN(std::optional<double> sink, NumberMember(layer, "sink_mass", path));
    KVQ_ASSIGN_OR_RETURN(const json* absmax,
                         ArrayMember(layer, "k_pre_rope_channel_mean_abs", path));
    size_t heads = 0;
    for (const json* per_head : {channels, consistency, absmax}) {
      if (per_head != nullptr) heads = std::max(heads, per_head->size());
    }
    for (size_t h = 0; h < heads; ++h) {
      std::optional<double> consistent, bias;
      if (consistency != nullptr && h < consistency->size()) {
        KVQ_ASSIGN_OR_RETURN(
            consistent,
            AsNumber((*consistency)[h], Index(Join(path, "k_pre_rope_outlier_consistency"), h)));
      }
      const size_t layer_slot = static_cast<size_t>(l);
      if (bias_norms != nullptr && l >= 0 && layer_slot < bias_norms->size() &&
          (*bias_norms)[layer_slot].is_array() && h < (*bias_norms)[layer_slot].size()) {
        KVQ_ASSIGN_OR_RETURN(bias, AsNumber((*bias_norms)[layer_slot][h],
                                            Index(Index("model.k_bias_norms", layer_slot), h)));
      }
      auto list = [h](const json* per_head) {
        return per_head != nullptr && h < per_head->size() ? ChannelList((*per_head)[h])
                                                           : std::string(kMissing);
      };
      out += Row({std::to_string(l), std::to_string(h), list(channels),
                  consistent ? Format("%.0f%%", 100.0 * *consistent) : kMissing, list(post),
                  list(v_channels), Cell(bias, "%.3g"), h == 0 ? Cell(sink, "%.3f") : ""});
    }
  }
  out +=
      "</table></div>\n<p class=\"caption\">Outlier channels are those whose mean |x| exceeds 4 "
      "times the median channel of the head; <i>consistency</i> is the fraction of tokens whose "
      "largest channels include that set (near 100% means fixed outlier channels, the case "
      "per-channel key quantization is designed for). RoPE rotates channel pairs, so a "
      "pre-RoPE outlier channel may vanish or move after RoPE. The k_proj bias norm is added to "
      "every "
      "key of the head, so a large one makes a constant offset that per-channel scales absorb. "
      "<i>Sink mass</i> is the mean attention probability on the first token (attention sinks), "
      "which is why some schemes keep that token in full precision.</p>\n";
  return out;
}

// ---- scripts --------------------------------------------------------------

// Runs first: records every error and warning the page meets and each chart's
// result in #kvq-status (the contract the Chromium test reads).
std::string HealthScript(size_t expected_charts) {
  return R"js((function () {
  var s = {expected: )js" +
         std::to_string(expected_charts) +
         R"js(, ok: 0, failed: 0, errors: 0, warnings: 0, done: 0};
  var box = document.getElementById('kvq-status');
  var list = document.getElementById('kvq-errors');
  function show() {
    box.setAttribute('data-charts-ok', String(s.ok));
    box.setAttribute('data-charts-failed', String(s.failed));
    box.setAttribute('data-errors', String(s.errors));
    box.setAttribute('data-warnings', String(s.warnings));
    box.setAttribute('data-done', String(s.done));
    box.textContent = (s.done ? 'Report check: ' : 'Rendering: ') + s.ok + ' of ' + s.expected +
        ' charts rendered, ' + s.errors + ' errors, ' + s.warnings + ' warnings';
    box.className = (s.errors || s.failed) ? 'bad' : (s.done ? 'good' : '');
  }
  function note(kind, text) {
    var item = document.createElement('li');
    item.className = kind;
    item.textContent = kind + ': ' + text;
    list.appendChild(item);
  }
  function text(args) {
    return Array.prototype.map.call(args, function (a) {
      return (a && a.stack) ? String(a.stack) : String(a);
    }).join(' ');
  }
  s.error = function (message) { s.errors++; note('error', message); show(); };
  s.warning = function (message) { s.warnings++; note('warning', message); show(); };
  s.chartOk = function () { s.ok++; show(); };
  s.chartFailed = function (message) { s.failed++; s.error(message); };
  // Also records where each chart and the page ended up, so a screenshot of
  // the same window size can be checked chart by chart.
  s.finish = function () {
    var charts = document.querySelectorAll('.chart');
    for (var i = 0; i < charts.length; i++) {
      var r = charts[i].getBoundingClientRect();
      charts[i].setAttribute('data-box', [r.left + window.scrollX, r.top + window.scrollY,
                                          r.width, r.height].map(Math.round).join(','));
    }
    box.setAttribute('data-page-height', String(document.documentElement.scrollHeight));
    s.done = 1;
    show();
  };
  window.onerror = function (message, source, line, column) {
    s.error(String(message) + ' (line ' + line + ':' + column + ')');
  };
  window.addEventListener('unhandledrejection', function (e) {
    s.error('unhandled rejection: ' + text([e.reason]));
  });
  document.addEventListener('securitypolicyviolation', function (e) {
    s.error('blocked by the page\'s offline policy: ' + e.violatedDirective + ' ' + e.blockedURI);
  });
  var consoleError = console.error, consoleWarn = console.warn;
  console.error = function () { s.error(text(arguments)); return consoleError.apply(console, arguments); };
  console.warn = function () { s.warning(text(arguments)); return consoleWarn.apply(console, arguments); };
  window.kvqStatus = s;
  show();
})();
)js";
}

// Runs last: draws every chart with vega-embed (SVG renderer) and counts the
// marks each one drew.
constexpr const char* kChartScript = R"js((function () {
  var s = window.kvqStatus;
  var charts;
  try {
    charts = JSON.parse(document.getElementById('kvq-charts').textContent);
    if (typeof vegaEmbed !== 'function') throw new Error('vega-embed did not load');
  } catch (e) {
    s.error(String(e && e.message || e));
    s.finish();
    return;
  }
  var pending = charts.length;
  if (pending === 0) s.finish();
  charts.forEach(function (chart) {
    var box = document.getElementById('chart-' + chart.id);
    Promise.resolve()
      .then(function () {
        return vegaEmbed(box, chart.spec, {renderer: 'svg', actions: false});
      })
      .then(function () {
        var marks = box.querySelectorAll('svg .role-mark > *').length;
        box.setAttribute('data-marks', String(marks));
        if (marks > 0) {
          box.setAttribute('data-rendered', 'ok');
          s.chartOk();
        } else {
          box.setAttribute('data-rendered', 'empty');
          s.chartFailed('chart ' + chart.id + ' drew no marks');
        }
      }, function (e) {
        box.setAttribute('data-rendered', 'failed');
        s.chartFailed('chart ' + chart.id + ': ' + String(e && e.message || e));
      })
      .then(function () {
        if (--pending === 0) s.finish();
      });
  });
})();
)js";

constexpr const char* kStyle = R"css(
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; margin: 1.5em auto;
       max-width: 1300px; padding: 0 1em; color: #222; line-height: 1.4; }
h1 { margin: 0.2em 0; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 0.2em 1em; }
dt { font-weight: bold; } dd { margin: 0; } code { background: #f3f3f3; padding: 0 0.2em; }
.dim { color: #666; font-size: 0.9em; }
.caption { color: #444; max-width: 70em; font-size: 0.95em; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; white-space: nowrap; }
th { background: #f0f0f0; } td:first-child, th:first-child { text-align: left; }
.chart { margin: 0.5em 0; min-height: 40px; }
#kvq-status { font-size: 0.85em; padding: 0.3em 0.6em; background: #f6f6f6; border-radius: 4px; }
#kvq-status.good { background: #e8f5e9; } #kvq-status.bad { background: #fde0dc; }
#kvq-errors { color: #b00; font-size: 0.85em; } #kvq-errors:empty { display: none; }
footer { margin-top: 3em; color: #666; font-size: 0.85em; }
footer pre { white-space: pre-wrap; max-width: 80ch; }
)css";

// The embedded bundles are redistributed in every report, so the page carries
// their notice (BSD-3-Clause, clause 2). The text is the packages' LICENSE.
constexpr const char* kChartLibraryLicense =
    R"txt(Copyright (c) 2015, University of Washington Interactive Data Lab.
All rights reserved.

Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:

1. Redistributions of source code must retain the above copyright notice, this
   list of conditions and the following disclaimer.

2. Redistributions in binary form must reproduce the above copyright notice,
   this list of conditions and the following disclaimer in the documentation
   and/or other materials provided with the distribution.

3. Neither the name of the copyright holder nor the names of its contributors
  may be used to endorse or promote products derived from this software
  without specific prior written permission.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT OWNER OR CONTRIBUTORS BE LIABLE
FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER
CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY,
OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
)txt";

Status CheckInlinable(const ChartLibrary& library) {
  if (library.js.empty()) {
    return Status::Error(
        "this kvq was built without the chart libraries (vega, vega-lite, vega-embed from npm, "
        "fetched into .deps by scripts/setup.sh); run scripts/setup.sh, re-run cmake and rebuild");
  }
  // Inside <script>, only "</script" (any case) and "<!--" end or change the
  // element; a bundle containing them cannot be inlined as it is.
  std::string lower(library.js.size(), '\0');
  std::transform(library.js.begin(), library.js.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower.find("</script") != std::string::npos || lower.find("<!--") != std::string::npos) {
    return Status::Error(std::string(library.name) + "@" + std::string(library.version) +
                         ": bundle contains '</script' or '<!--' and cannot be inlined");
  }
  return Status::Ok();
}

}  // namespace

std::string EscapeHtml(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string JsonForScript(const json& value) {
  const std::string text =
      value.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {  // only inside strings: JSON has these nowhere else
      case '<':
        out += "\\u003c";
        break;
      case '>':
        out += "\\u003e";
        break;
      case '&':
        out += "\\u0026";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<ChartLibrary> EmbeddedChartLibraries() {
  return {{"vega", kvq_asset_vega_version, {kvq_asset_vega_js, kvq_asset_vega_js_size}},
          {"vega-lite",
           kvq_asset_vega_lite_version,
           {kvq_asset_vega_lite_js, kvq_asset_vega_lite_js_size}},
          {"vega-embed",
           kvq_asset_vega_embed_version,
           {kvq_asset_vega_embed_js, kvq_asset_vega_embed_js_size}}};
}

namespace study_report {

std::string FormatNumber(const char* format, double x) { return Format(format, x); }

std::string TableRow(const std::vector<std::string>& cells, const char* tag) {
  return Row(cells, tag);
}

StatusOr<std::string> AssemblePage(const PageParts& parts) {
  const std::vector<ChartLibrary> libraries = EmbeddedChartLibraries();
  for (const ChartLibrary& library : libraries) KVQ_RETURN_IF_ERROR(CheckInlinable(library));
  const std::vector<StudyChart>& charts = parts.charts;
  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      // Offline by construction: nothing may be fetched (a fetch would be a
      // policy violation, which the self-check counts as an error). Vega
      // compiles its expressions with Function(), hence 'unsafe-eval'.
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
      "img-src data: blob:; font-src data:\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>" +
      EscapeHtml(parts.title) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  html += "<div id=\"kvq-status\" data-charts-expected=\"" + std::to_string(charts.size()) +
          "\" data-charts-ok=\"0\" data-charts-failed=\"0\" data-errors=\"0\" "
          "data-warnings=\"0\" data-done=\"0\">Rendering charts (needs JavaScript)</div>\n"
          "<ul id=\"kvq-errors\"></ul>\n<script>" +
          HealthScript(charts.size()) + "</script>\n";
  html += parts.body;
  for (const StudyChart& chart : charts) {
    html += "<section id=\"section-" + EscapeHtml(chart.id) + "\">\n<h2>" +
            EscapeHtml(chart.title) + "</h2>\n<div class=\"chart\" id=\"chart-" +
            EscapeHtml(chart.id) + "\" data-chart=\"" + EscapeHtml(chart.id) +
            "\"></div>\n<p class=\"caption\">" + EscapeHtml(chart.caption) + "</p>\n";
    for (const auto& [id, extra] : parts.after_chart) {
      if (id == chart.id) html += extra;
    }
    html += "</section>\n";
  }
  html += parts.note;
  html += "<footer>Written by kvq. Charts: ";
  for (size_t i = 0; i < libraries.size(); ++i) {
    html += std::string(i ? ", " : "") + EscapeHtml(libraries[i].name) + " " +
            EscapeHtml(libraries[i].version);
  }
  html +=
      " (BSD-3-Clause), embedded in this page, which needs no network.\n<details><summary>Licenses "
      "of the embedded chart libraries</summary>\n<pre>" +
      EscapeHtml(kChartLibraryLicense) +
      "</pre>\n<p>The bundles also contain permissively licensed code of their own dependencies "
      "(for example d3 modules and semver: ISC; fast-json-patch and fast-deep-equal: MIT), "
      "whose notices the bundles keep.</p>\n</details>\n</footer>\n";
  for (const ChartLibrary& library : libraries) {
    html += "<script>/* " + std::string(library.name) + " " + std::string(library.version) +
            " */\n" + std::string(library.js) + "\n</script>\n";
  }
  json chart_data = json::array();
  for (const StudyChart& chart : charts) {
    chart_data.push_back({{"id", chart.id}, {"spec", chart.spec}});
  }
  html += "<script type=\"application/json\" id=\"kvq-charts\">" + JsonForScript(chart_data) +
          "</script>\n<script>" + kChartScript + "</script>\n</body>\n</html>\n";
  return html;
}

Status CheckStudyVersion(const json& study, const std::string& what) {
  if (!study.is_object()) return Status::Error(what + ": expected a JSON object");
  KVQ_ASSIGN_OR_RETURN(std::optional<int64_t> version, IntMember(study, "kvq_study_version", ""));
  if (!version || *version != kStudyVersion) {
    return Status::Error(what + ": kvq_study_version must be " + std::to_string(kStudyVersion) +
                         " (this report reads version " + std::to_string(kStudyVersion) +
                         "; re-run kvq study for an older file), got " +
                         (version ? std::to_string(*version) : std::string("none")));
  }
  return Status::Ok();
}

}  // namespace study_report

StatusOr<std::string> RenderStudyReportHtml(const json& study) {
  KVQ_RETURN_IF_ERROR(study_report::CheckStudyVersion(study, "study"));
  study_report::PageParts page;
  KVQ_ASSIGN_OR_RETURN(page.charts, BuildStudyCharts(study));
  KVQ_ASSIGN_OR_RETURN(std::string header, Header(study));
  KVQ_ASSIGN_OR_RETURN(std::string schemes_table, SchemesTable(study));
  KVQ_ASSIGN_OR_RETURN(std::string outlier_table, OutlierTable(study));
  KVQ_ASSIGN_OR_RETURN(std::string claims_table, study_report::ClaimsTable(study));
  KVQ_ASSIGN_OR_RETURN(std::string needle_table, study_report::NeedleTable(study));
  KVQ_ASSIGN_OR_RETURN(std::string gsm8k_table, study_report::Gsm8kTable(study));
  std::string model_name;
  KVQ_ASSIGN_OR_RETURN(const json* model, ObjectMember(study, "model", ""));
  if (model != nullptr) {
    KVQ_ASSIGN_OR_RETURN(model_name, StringMember(*model, "path", "model"));
  }
  page.title = "kvq study" + (model_name.empty() ? "" : ": " + model_name);
  page.body = header + schemes_table;
  page.after_chart = {{"outlier-heatmap", outlier_table},
                      {"fake-quant", claims_table},
                      {"needle", needle_table},
                      {"gsm8k", gsm8k_table}};
  std::string left_out;
  for (const KnownChart& known : kKnownCharts) {
    const bool present = std::any_of(page.charts.begin(), page.charts.end(),
                                     [&](const StudyChart& c) { return c.id == known.id; });
    if (!present) left_out += std::string(left_out.empty() ? "" : "; ") + known.what;
  }
  if (!left_out.empty()) {
    page.note =
        "<p class=\"caption\">Not in this study (no data): " + EscapeHtml(left_out) + ".</p>\n";
  }
  return study_report::AssemblePage(page);
}

Status WriteStudyReport(const json& study, const std::string& path) {
  KVQ_ASSIGN_OR_RETURN(std::string html, RenderStudyReportHtml(study));
  return WriteTextFile(path, html);
}

}  // namespace kvq
