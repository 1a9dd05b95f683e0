// The study report's pure C++ parts: study JSON -> Vega-Lite specs -> HTML,
// escaping, and clear errors for malformed input. (The page itself is opened
// in headless Chromium by tests/report/chromium_report_test.sh.)
#include "study/study_report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "study/study.h"
#include "study/study_gsm8k.h"

namespace kvq {
namespace {

using nlohmann::json;

json LoadFixture() {
  const std::string path = std::string(KVQ_SOURCE_DIR) + "/tests/report/study_fixture.json";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  json study = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(study.is_discarded()) << path;
  return study;
}

bool HaveChartLibraries() {
  for (const ChartLibrary& library : EmbeddedChartLibraries()) {
    if (library.js.empty()) return false;
  }
  return true;
}

#define SKIP_WITHOUT_CHART_LIBRARIES()                                                   \
  if (!HaveChartLibraries()) {                                                           \
    GTEST_SKIP() << "kvq built without the chart bundles (.deps from scripts/setup.sh)"; \
  }

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The chart data JSON the page parses, cut out of the page.
json ChartDataOf(const std::string& html) {
  const std::string open = "id=\"kvq-charts\">";
  const size_t begin = html.find(open);
  if (begin == std::string::npos) return json();
  const size_t end = html.find("</script>", begin);
  return json::parse(html.substr(begin + open.size(), end - begin - open.size()), nullptr, false);
}

std::map<std::string, StudyChart> ById(const std::vector<StudyChart>& charts) {
  std::map<std::string, StudyChart> out;
  for (const StudyChart& c : charts) out[c.id] = c;
  return out;
}

// Scripts a page is made of: the self-check, three libraries, the chart data
// (JSON), the chart driver.
constexpr size_t kScriptsPerPage = 6;

TEST(StudyReport, FixtureHasEveryChartWithAllItsData) {
  const json study = LoadFixture();
  auto charts = BuildStudyCharts(study);
  ASSERT_TRUE(charts.ok()) << charts.status().message();
  std::vector<std::string> ids;
  for (const StudyChart& c : *charts) ids.push_back(c.id);
  EXPECT_EQ(ids, (std::vector<std::string>{"outlier-heatmap", "k-bias", "sinks", "tensor-stats",
                                           "fake-quant", "fake-quant-layers", "pareto", "memory",
                                           "recall", "needle", "gsm8k"}));
  for (const StudyChart& c : *charts) {
    EXPECT_EQ(c.spec.value("$schema", ""), "https://vega.github.io/schema/vega-lite/v5.json");
    EXPECT_FALSE(c.title.empty());
    EXPECT_GT(c.caption.size(), 100u) << c.id << ": a caption says how to read the chart";
  }

  // Every number of each section is in its chart's data, one datum per value.
  auto by_id = ById(*charts);
  size_t channel_values = 0;
  for (const json& layer : study["outliers"]["layers"]) {
    for (const char* key :
         {"k_pre_rope_channel_mean_abs", "k_post_rope_channel_mean_abs", "v_channel_mean_abs"}) {
      for (const json& head : layer[key]) channel_values += head.size();
    }
  }
  EXPECT_EQ(by_id["outlier-heatmap"].spec["data"]["values"].size(), channel_values);
  const json& rows = study["fake_quant"]["rows"];
  size_t layer_entries = 0;
  for (const json& row : rows) layer_entries += row["per_layer"].size();
  EXPECT_EQ(by_id["fake-quant"].spec["data"]["values"].size(), rows.size() * 3);  // 3 metrics
  EXPECT_EQ(by_id["fake-quant-layers"].spec["data"]["values"].size(), layer_entries * 3);
  EXPECT_EQ(by_id["pareto"].spec["data"]["values"].size(), study["schemes"].size());
  size_t memory_points = 0, recall_cells = 0;
  for (const json& s : study["memory"]["series"]) memory_points += s["bytes"].size();
  for (const json& s : study["schemes"]) recall_cells += s["recall"].size();
  EXPECT_EQ(by_id["memory"].spec["data"]["values"].size(), memory_points);
  EXPECT_EQ(by_id["recall"].spec["data"]["values"].size(), recall_cells);
  // Structure: one bar per layer; token 0 and the strongest other sink per
  // (layer, query head); 4 statistics per (tensor, layer, KV head).
  const json& model = study["model"];
  const size_t layers = model["layers"], heads = model["heads"], kv_heads = model["kv_heads"];
  EXPECT_EQ(by_id["k-bias"].spec["data"]["values"].size(), layers);
  EXPECT_NE(by_id["k-bias"].caption.find("Flagged (red): layer 0"), std::string::npos)
      << by_id["k-bias"].caption;
  EXPECT_EQ(by_id["sinks"].spec["data"]["values"].size(), layers * heads * 2);
  EXPECT_EQ(by_id["tensor-stats"].spec["data"]["values"].size(), layers * 3 * kv_heads * 4);
  size_t needle_cells = 0;
  for (const json& s : study["needle"]["schemes"]) needle_cells += s["cells"].size();
  EXPECT_EQ(by_id["needle"].spec["data"]["values"].size(), needle_cells);
  EXPECT_EQ(by_id["gsm8k"].spec["data"]["values"].size(), study["gsm8k"]["schemes"].size());
  // The strongest other sink of layer 1, head 2 is the planted delimiter.
  bool saw_delimiter = false;
  for (const json& v : by_id["sinks"].spec["data"]["values"]) {
    saw_delimiter |= v["layer"] == 1 && v["head"] == 2 && v["kind"] == "strongest other sink" &&
                     v["sink"].get<std::string>().find("token 17") == 0;
  }
  EXPECT_TRUE(saw_delimiter);

  // The literal-formula row keeps its label and is told apart.
  bool saw_literal = false;
  for (const json& v : by_id["fake-quant"].spec["data"]["values"]) {
    saw_literal |= v["row"].get<std::string>().find("literal") != std::string::npos;
  }
  EXPECT_TRUE(saw_literal);
}

TEST(StudyReport, ParetoFrontMarksExactlyTheNonDominatedSchemes) {
  // bytes/token, KL, perplexity. kl: a (100, 0.1) and b (200, 0.05) are on the
  // front, c (200, 0.2) is dominated by b, d (300, 0.05) by b; f16 has KL 0:
  // not drawn on the log axis, but on the front, where it dominates bf16
  // (400, 0.001), which nothing drawn beats. ppl: a 12 and f16 (400, 10) are
  // on the front; b (200, 12) ties a's ppl with more bytes: dominated.
  const json study = {
      {"kvq_study_version", kStudyVersion},
      {"schemes",
       {{{"name", "a"}, {"bytes_per_token", 100}, {"kl_mean", 0.1}, {"ppl", 12}},
        {{"name", "b"}, {"bytes_per_token", 200}, {"kl_mean", 0.05}, {"ppl", 12}},
        {{"name", "c"}, {"bytes_per_token", 200}, {"kl_mean", 0.2}, {"ppl", 13}},
        {{"name", "d"}, {"bytes_per_token", 300}, {"kl_mean", 0.05}, {"ppl", 11}},
        {{"name", "f16"}, {"bytes_per_token", 400}, {"kl_mean", 0}, {"ppl", 10}},
        {{"name", "bf16"}, {"bytes_per_token", 400}, {"kl_mean", 0.001}, {"ppl", 10.5}},
        {{"name", "n"}, {"bytes_per_token", 50}, {"kl_mean", nullptr}}}}};
  auto charts = BuildStudyCharts(study);
  ASSERT_TRUE(charts.ok()) << charts.status().message();
  auto by_id = ById(*charts);
  ASSERT_EQ(by_id.count("pareto"), 1u);
  std::map<std::string, std::pair<std::string, std::string>> front;
  for (const json& v : by_id["pareto"].spec["data"]["values"]) {
    front[v["name"]] = {v["front_kl"], v["front_ppl"]};
  }
  const std::string on = "Pareto front", off = "dominated";
  EXPECT_EQ(front["a"], std::make_pair(on, on));
  EXPECT_EQ(front["b"], std::make_pair(on, off));
  EXPECT_EQ(front["c"], std::make_pair(off, off));
  EXPECT_EQ(front["d"], std::make_pair(off, on));
  EXPECT_EQ(front["f16"], std::make_pair(on, on));
  EXPECT_EQ(front["bf16"], std::make_pair(off, off));
  EXPECT_EQ(front["n"], std::make_pair(off, off));  // no numbers: on no front
  EXPECT_NE(by_id["pareto"].caption.find("f16"), std::string::npos)
      << "the caption names what the log axis leaves out";
}

TEST(StudyReport, PageHoldsLibrariesChartsTablesAndSelfCheck) {
  SKIP_WITHOUT_CHART_LIBRARIES();
  const json study = LoadFixture();
  auto html = RenderStudyReportHtml(study);
  ASSERT_TRUE(html.ok()) << html.status().message();
  const std::string& page = *html;

  size_t library_bytes = 0;
  for (const ChartLibrary& library : EmbeddedChartLibraries()) {
    EXPECT_GT(library.js.size(), 50000u) << library.name;  // real UMD bundles, not stubs
    EXPECT_NE(page.find(library.js), std::string::npos) << library.name << " inlined whole";
    library_bytes += library.js.size();
  }
  EXPECT_GT(page.size(), library_bytes);
  EXPECT_EQ(page.find("src=\"http"), std::string::npos) << "nothing loaded from the network";
  EXPECT_NE(page.find("Content-Security-Policy"), std::string::npos);
  EXPECT_NE(page.find("<div id=\"kvq-status\" data-charts-expected=\"11\""), std::string::npos);
  for (const char* id : {"outlier-heatmap", "k-bias", "sinks", "tensor-stats", "fake-quant",
                         "fake-quant-layers", "pareto", "memory", "recall", "needle", "gsm8k"}) {
    EXPECT_EQ(Count(page, std::string("id=\"chart-") + id + "\""), 1u) << id;
  }
  // The tables: the write-up's claims with their measured texts, the needle
  // summary (cells other schemes did not run say so), GSM8K's intervals.
  EXPECT_NE(page.find("Which claims hold on this model"), std::string::npos);
  for (const json& c : study["fake_quant"]["claims"]) {
    EXPECT_NE(page.find(EscapeHtml(c["text"].get<std::string>())), std::string::npos) << c["text"];
  }
  EXPECT_NE(page.find("<td>not run</td>"), std::string::npos);
  // The needle's context-by-depth grid pools the tasks f16 passes at each
  // context: both at 512, single_repeat alone at 1024 (multikey fails there).
  const json& needle = study["needle"];
  for (const json& s : needle["schemes"]) {
    for (int64_t context : {512, 1024}) {
      std::string row = "<tr><td>" + s["name"].get<std::string>() + "</td><td>" +
                        std::to_string(context) + "</td>";
      for (const json& depth : needle["depths"]) {
        int64_t correct = 0, trials = 0;
        for (const json& c : s["cells"]) {
          const bool pooled = c["task"] == "single_repeat" || context == 512;
          if (c["context"] == context && c["depth"] == depth && pooled) {
            correct += c["correct"].get<int64_t>();
            trials += c["trials"].get<int64_t>();
          }
        }
        EXPECT_EQ(trials, context == 512 ? 40 : 20);
        row += "<td>" + std::to_string(correct) + "/" + std::to_string(trials) + "</td>";
      }
      EXPECT_NE(page.find(row + "</tr>"), std::string::npos) << row;
    }
  }
  EXPECT_NE(page.find("<th>depth 0.25</th>"), std::string::npos);
  EXPECT_NE(page.find("<td><b>int2-c32-asym/int2-g32-asym</b></td>"), std::string::npos);
  EXPECT_NE(page.find("<th>exact McNemar p</th>"), std::string::npos);
  EXPECT_NE(page.find("<td>0.0987</td>"), std::string::npos);  // the fixture's pair
  // The fixture predates the GSM8K stage's "decode": the caption says so.
  EXPECT_NE(page.find("Decoding: not recorded (a study from before batch-invariant"),
            std::string::npos);
  json invariant = study;
  invariant["gsm8k"]["decode"] = "batch-invariant: <as alone>";
  auto invariant_html = RenderStudyReportHtml(invariant);
  ASSERT_TRUE(invariant_html.ok()) << invariant_html.status().message();
  EXPECT_NE(invariant_html->find("Decoding: batch-invariant: &lt;as alone&gt;."),
            std::string::npos);
  for (const json& s : study["schemes"]) {
    EXPECT_NE(page.find("<td><b>" + s["name"].get<std::string>() + "</b></td>"), std::string::npos)
        << s["name"];
  }
  EXPECT_NE(page.find(study["command"].get<std::string>()), std::string::npos);
  EXPECT_EQ(Count(Lower(page), "</script"), kScriptsPerPage);
  EXPECT_EQ(Count(page, "<!--"), 0u);

  const json chart_data = ChartDataOf(page);
  ASSERT_TRUE(chart_data.is_array());
  auto charts = BuildStudyCharts(study);
  ASSERT_TRUE(charts.ok());
  ASSERT_EQ(chart_data.size(), charts->size());
  for (size_t i = 0; i < charts->size(); ++i) {
    EXPECT_EQ(chart_data[i]["id"], (*charts)[i].id);
    EXPECT_EQ(chart_data[i]["spec"], (*charts)[i].spec) << "specs survive the page unchanged";
  }
}

TEST(StudyReport, HostileStringsStayText) {
  SKIP_WITHOUT_CHART_LIBRARIES();
  const std::string hostile =
      "</script><script>alert(1)</script><!-- \xe2\x80\xa8 <b>x</b> & \" ' </SCRIPT>";
  json study = LoadFixture();
  study["command"] = hostile;
  study["model"]["path"] = hostile;
  study["text"]["path"] = hostile;
  study["schemes"][0]["name"] = hostile;
  study["schemes"][0]["v_type"] = hostile;
  study["memory"]["series"][0]["name"] = hostile;
  study["fake_quant"]["rows"][0]["name"] = hostile;
  study["timings_seconds"][hostile] = 2.0;
  auto html = RenderStudyReportHtml(study);
  ASSERT_TRUE(html.ok()) << html.status().message();
  const std::string& page = *html;
  EXPECT_EQ(Count(Lower(page), "</script"), kScriptsPerPage) << "no element ended early";
  EXPECT_EQ(Count(page, "<!--"), 0u);
  EXPECT_EQ(page.find("<b>x</b>"), std::string::npos);
  EXPECT_NE(page.find("&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;!-- "),
            std::string::npos)
      << "shown as text in the header and table";
  const json chart_data = ChartDataOf(page);
  ASSERT_TRUE(chart_data.is_array()) << "the chart data still parses";
  EXPECT_NE(chart_data.dump().find(json(hostile).dump()), std::string::npos)
      << "names reach the charts unchanged";
}

TEST(StudyReport, JsonForScriptIsInertAndRoundTrips) {
  const json value = {{"name", "</script><!-- & > \xe2\x80\xa8 \xc3\xa9"}, {"x", {1.5, nullptr}}};
  const std::string text = JsonForScript(value);
  for (char c : text) {
    EXPECT_TRUE(c != '<' && c != '>' && c != '&') << text;
    EXPECT_LT(static_cast<unsigned char>(c), 0x80) << text;
  }
  EXPECT_EQ(json::parse(text), value);
  // Invalid UTF-8 (a lone continuation byte) is replaced, not thrown.
  std::string bad_text;
  EXPECT_NO_THROW(bad_text = JsonForScript(json("a\x80z")));
  EXPECT_EQ(json::parse(bad_text), json("a\xef\xbf\xbdz"));
}

TEST(StudyReport, EscapeHtml) {
  EXPECT_EQ(EscapeHtml("a<b>&\"'c"), "a&lt;b&gt;&amp;&quot;&#39;c");
  EXPECT_EQ(EscapeHtml("plain é"), "plain é");
}

TEST(StudyReport, MalformedInputIsAClearError) {
  struct Case {
    const char* what;
    json study;
    const char* message;  // the error names this
  };
  json wrong_sink = {{"kvq_study_version", kStudyVersion},
                     {"outliers", {{"layers", {{{"layer", 0}, {"sink_mass", "high"}}}}}}};
  json wrong_channels = {
      {"kvq_study_version", kStudyVersion},
      {"outliers", {{"layers", {{{"layer", 0}, {"k_pre_rope_channel_mean_abs", {{1.0, "x"}}}}}}}}};
  json bad_needle = {
      {"kvq_study_version", kStudyVersion},
      {"needle",
       {{"schemes", {{{"name", "f16"}, {"cells", {{{"task", "t"}, {"context", 512}}}}}}}}}};
  json bad_gsm8k = {{"kvq_study_version", kStudyVersion},
                    {"gsm8k", {{"schemes", {{{"name", "f16"}, {"accuracy", "high"}}}}}}};
  json bad_pair = {{"kvq_study_version", kStudyVersion},
                   {"gsm8k",
                    {{"schemes", {{{"name", "f16"}, {"accuracy", 0.5}}}},
                     {"rule", "r"},
                     {"paired", {{{"a", "f16"}, {"b", "int2"}, {"mcnemar_exact_p", "small"}}}}}}};
  json bad_bias = {{"kvq_study_version", kStudyVersion},
                   {"outliers", {{"k_bias", {{"layer_norms", 3}}}, {"layers", json::array()}}}};
  json short_memory = {
      {"kvq_study_version", kStudyVersion},
      {"memory", {{"contexts", {512, 1024}}, {"series", {{{"name", "f16"}, {"bytes", {1}}}}}}}};
  json bad_recall = {
      {"kvq_study_version", kStudyVersion},
      {"schemes", {{{"name", "int4"}, {"recall", {{{"context", 512}, {"depth", 0.5}}}}}}}};
  json fractional_bits = {{"kvq_study_version", kStudyVersion},
                          {"fake_quant", {{"rows", {{{"name", "r"}, {"bits", 2.5}}}}}}};
  const Case cases[] = {
      {"not an object", json::array(), "expected a JSON object"},
      {"no version", json::object(), "kvq_study_version must be 2"},
      {"version 1", {{"kvq_study_version", 1}}, "got 1"},
      {"schemes not an array",
       {{"kvq_study_version", kStudyVersion}, {"schemes", 3}},
       "schemes: expected an array"},
      {"sink mass a string", wrong_sink, "outliers.layers[0].sink_mass: expected a number"},
      {"channel not a number", wrong_channels,
       "outliers.layers[0].k_pre_rope_channel_mean_abs[0][1]: expected a number"},
      {"needle cell without trials", bad_needle, "needle.schemes[0].cells[0]: needs"},
      {"gsm8k accuracy a string", bad_gsm8k, "gsm8k.schemes[0].accuracy: expected a number"},
      {"gsm8k pair's p a string", bad_pair, "gsm8k.paired[0].mcnemar_exact_p: expected a number"},
      {"k_bias norms not an array", bad_bias, "outliers.k_bias.layer_norms: expected an array"},
      {"memory lengths differ", short_memory, "memory.series[0].bytes: 1 values for 2 contexts"},
      {"recall without trials", bad_recall, "schemes[0].recall[0]: needs"},
      {"fractional bits", fractional_bits, "fake_quant.rows[0].bits: expected an integer"},
  };
  for (const Case& c : cases) {
    StatusOr<std::string> html = Status::Error("not run");
    EXPECT_NO_THROW(html = RenderStudyReportHtml(c.study)) << c.what;
    ASSERT_FALSE(html.ok()) << c.what;
    EXPECT_NE(html.status().message().find(c.message), std::string::npos)
        << c.what << ": " << html.status().message();
  }
}

TEST(StudyReport, AbsentSectionsLeaveChartsOutAndSaySo) {
  SKIP_WITHOUT_CHART_LIBRARIES();
  json study = LoadFixture();
  study.erase("memory");
  study["schemes"] = json::array();
  study["fake_quant"]["rows"][0]["kl_mean"] = nullptr;  // NaN is written as null
  for (json& row : study["fake_quant"]["rows"]) row.erase("per_layer");
  auto html = RenderStudyReportHtml(study);
  ASSERT_TRUE(html.ok()) << html.status().message();
  // Left: the heatmap, the structure charts, fake-quant overall, needle, GSM8K.
  EXPECT_NE(html->find("data-charts-expected=\"7\""), std::string::npos);
  EXPECT_EQ(html->find("id=\"chart-memory\""), std::string::npos);
  EXPECT_NE(html->find("Not in this study (no data): per-layer fake-quant errors"),
            std::string::npos);

  auto bare = RenderStudyReportHtml({{"kvq_study_version", kStudyVersion}});
  ASSERT_TRUE(bare.ok()) << bare.status().message();
  EXPECT_NE(bare->find("data-charts-expected=\"0\""), std::string::npos);
}

TEST(StudyReport, MissingValuesShowAsDashes) {
  SKIP_WITHOUT_CHART_LIBRARIES();
  json study = {
      {"kvq_study_version", kStudyVersion},
      {"schemes",
       {{{"name", "int2"}, {"bytes_per_token", 320}, {"ppl", nullptr}, {"kl_mean", 0.4}}}}};
  auto html = RenderStudyReportHtml(study);
  ASSERT_TRUE(html.ok()) << html.status().message();
  EXPECT_NE(html->find("<td><b>int2</b></td>"), std::string::npos);
  EXPECT_NE(html->find("<td>&ndash;</td>"), std::string::npos);
}

TEST(StudyReport, WriteStudyReportWritesThePage) {
  SKIP_WITHOUT_CHART_LIBRARIES();
  const json study = LoadFixture();
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("kvq_study_report_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "report.html").string();
  ASSERT_TRUE(WriteStudyReport(study, path).ok());
  std::ifstream in(path, std::ios::binary);
  std::stringstream written;
  written << in.rdbuf();
  EXPECT_EQ(written.str(), RenderStudyReportHtml(study).value());
  std::filesystem::remove_all(dir);

  const Status status = WriteStudyReport(study, (dir / "no-such-dir" / "r.html").string());
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("no-such-dir/r.html"), std::string::npos) << status.message();
}

// Several studies side by side: one page, the models' table, every
// comparison chart with all models' data, the claims per model.
TEST(StudyReport, ComparisonPutsModelsSideBySide) {
  SKIP_WITHOUT_CHART_LIBRARIES();
  json a = LoadFixture(), b = LoadFixture();
  b["model"]["path"] = "models/other-model.gguf";
  b["schemes"][1]["kl_mean"] = 0.5;
  auto html = RenderComparisonReportHtml({a, b});
  ASSERT_TRUE(html.ok()) << html.status().message();
  const std::string& page = *html;
  EXPECT_NE(page.find("data-charts-expected=\"5\""), std::string::npos);
  EXPECT_NE(page.find("<td><b>other-model.gguf</b></td>"), std::string::npos);
  EXPECT_NE(page.find("The write-up's claims per model"), std::string::npos);
  const json data = ChartDataOf(page);
  ASSERT_TRUE(data.is_array());
  ASSERT_EQ(data.size(), 5u);
  std::map<std::string, std::set<std::string>> models_per_chart;
  std::map<std::string, json> by_id;
  for (const json& chart : data) {
    by_id[chart["id"]] = chart;
    for (const json& v : chart["spec"]["data"]["values"]) {
      models_per_chart[chart["id"]].insert(v["model"].get<std::string>());
    }
  }
  for (const char* id : {"compare-fronts", "compare-schemes", "compare-fake-quant",
                         "compare-layers", "compare-tasks"}) {
    EXPECT_EQ(models_per_chart[id].size(), 2u) << id;
  }
  // Scheme points: every non-baseline scheme of both models.
  EXPECT_EQ(by_id["compare-schemes"]["spec"]["data"]["values"].size(),
            2 * (a["schemes"].size() - 1));
  // Needle points pool only the cells where f16 passes, the same for every
  // scheme: the fixture's f16 also ran (multikey_repeat, 1024) and failed it.
  std::map<std::string, double> needle_rate;
  for (const json& v : by_id["compare-tasks"]["spec"]["data"]["values"]) {
    if (v["test"] == "needle (where f16 passes)") needle_rate[v["scheme"]] = v["accuracy"];
  }
  EXPECT_EQ(needle_rate.at("f16"), 1.0);
  EXPECT_NEAR(needle_rate.at("int4"), 285.0 / 300.0, 1e-12);  // the fixture's 15 cells
  // Every point carries its count and a 95% Wilson interval around it: the
  // study's own for GSM8K, computed from the pooled trials for the needle.
  std::map<std::string, json> task_point;  // "test/scheme" of the second model
  for (const json& v : by_id["compare-tasks"]["spec"]["data"]["values"]) {
    EXPECT_LE(v["low"].get<double>(), v["accuracy"].get<double>()) << v.dump();
    if (v["model"] == "other-model.gguf") {
      EXPECT_LE(v["low"].get<double>(), v["accuracy"].get<double>()) << v.dump();
      EXPECT_GE(v["high"].get<double>(), v["accuracy"].get<double>()) << v.dump();
      task_point.emplace(v["test"].get<std::string>() + "/" + v["scheme"].get<std::string>(), v);
    }
  }
  const json& needle_int4 = task_point.at("needle (where f16 passes)/int4");
  EXPECT_EQ(needle_int4["count"], "285/300 trials");
  const auto [low, high] = WilsonInterval(285, 300);
  EXPECT_DOUBLE_EQ(needle_int4["low"].get<double>(), low);
  EXPECT_DOUBLE_EQ(needle_int4["high"].get<double>(), high);
  const json& gsm8k_kivi2 = task_point.at("GSM8K/kivi2");
  EXPECT_EQ(gsm8k_kivi2["count"], "70/250 problems");
  EXPECT_EQ(gsm8k_kivi2["low"], a["gsm8k"]["schemes"][1]["wilson95_low"]);
  json bad = b;
  bad["needle"]["per_task"][0]["f16_passing_contexts"][0] = "512";
  auto bad_html = RenderComparisonReportHtml({a, bad});
  ASSERT_FALSE(bad_html.ok());
  EXPECT_NE(bad_html.status().message().find("f16_passing_contexts"), std::string::npos)
      << bad_html.status().message();
  EXPECT_EQ(Count(Lower(page), "</script"), kScriptsPerPage);

  EXPECT_FALSE(RenderComparisonReportHtml({a}).ok());  // one study is not a comparison
  b["kvq_study_version"] = 1;
  auto old = RenderComparisonReportHtml({a, b});
  ASSERT_FALSE(old.ok());
  EXPECT_NE(old.status().message().find("studies[1]"), std::string::npos);
}

// Each model's own Pareto front of KL against bits per value: a scheme with
// fewer or as many bits and a lower KL on the same model dominates; another
// model's schemes do not; f16 (KL 0) dominates but is left off the log axis.
TEST(StudyReport, ComparisonFrontsArePerModel) {
  SKIP_WITHOUT_CHART_LIBRARIES();
  auto scheme = [](const char* name, double bits, double kl) {
    return json{{"name", name}, {"baseline", kl == 0}, {"bits_per_value", bits}, {"kl_mean", kl}};
  };
  json a = LoadFixture(), b = LoadFixture();
  a["model"]["path"] = "models/a.gguf";
  a["schemes"] = {scheme("f16", 16, 0),  scheme("half", 16, 0.01), scheme("big", 9, 0.3),
                  scheme("mid", 8, 0.1), scheme("tie", 8, 0.2),    scheme("low", 4, 0.5)};
  b["model"]["path"] = "models/other-model.gguf";
  b["schemes"] = {scheme("f16", 16, 0), scheme("big", 9, 0.05), scheme("low", 4, 0.9)};
  auto fronts = RenderComparisonReportHtml({a, b});
  ASSERT_TRUE(fronts.ok()) << fronts.status().message();
  std::map<std::string, std::string> front;  // "model/scheme" -> on the front or dominated
  for (const json& chart : ChartDataOf(*fronts)) {
    if (chart["id"] != "compare-fronts") continue;
    for (const json& v : chart["spec"]["data"]["values"]) {
      front[v["model"].get<std::string>() + "/" + v["scheme"].get<std::string>()] = v["front"];
    }
  }
  const std::string a_label = "a.gguf";
  ASSERT_EQ(front.size(), 7u);  // every scheme but the two f16s
  EXPECT_EQ(front.count(a_label + "/f16"), 0u);
  EXPECT_EQ(front[a_label + "/half"], "dominated");  // by f16, which is not drawn
  EXPECT_EQ(front[a_label + "/mid"], "on the front");
  EXPECT_EQ(front[a_label + "/low"], "on the front");
  EXPECT_EQ(front[a_label + "/big"], "dominated");
  EXPECT_EQ(front[a_label + "/tie"], "dominated");
  EXPECT_EQ(front["other-model.gguf/big"], "on the front");
  // a's "low" (4 bits, KL 0.5) would dominate it in a front pooled across models.
  EXPECT_EQ(front["other-model.gguf/low"], "on the front");
}

// KL by context length: one line point per (non-f16 scheme, length), the
// best 2-bit scheme named, each model a line in the comparison; a point
// without its length is a clear error.
TEST(StudyReport, ContextKlChartsHoldEveryPoint) {
  SKIP_WITHOUT_CHART_LIBRARIES();
  auto point = [](int64_t context, double kl) {
    return json{{"context", context}, {"kl_mean", kl}, {"kl_p99", 4 * kl}, {"top1_agreement", 0.9}};
  };
  json a = LoadFixture();
  a["context_kl"] = {
      {"lengths", {512, 1024}},
      {"positions", 2048},
      {"best_2bit", "kivi2"},
      {"schemes",
       {{{"name", "f16"}, {"baseline", true}, {"points", {point(512, 0), point(1024, 0)}}},
        {{"name", "int4"}, {"baseline", false}, {"points", {point(512, 0.01), point(1024, 0.02)}}},
        {{"name", "kivi2"},
         {"baseline", false},
         {"points", {point(512, 0.1), point(1024, 0.3)}}}}}};
  auto charts = BuildStudyCharts(a);
  ASSERT_TRUE(charts.ok()) << charts.status().message();
  auto by_id = ById(*charts);
  ASSERT_TRUE(by_id.count("context-kl"));
  EXPECT_EQ(by_id["context-kl"].spec["data"]["values"].size(), 4u);  // f16 has no log-axis place
  EXPECT_NE(by_id["context-kl"].caption.find("best 2-bit scheme at the longest length is kivi2"),
            std::string::npos);
  json b = a;
  b["model"]["path"] = "models/other-model.gguf";
  auto html = RenderComparisonReportHtml({a, b});
  ASSERT_TRUE(html.ok()) << html.status().message();
  std::set<std::string> models;
  for (const json& chart : ChartDataOf(*html)) {
    if (chart["id"] != "compare-context-kl") continue;
    EXPECT_EQ(chart["spec"]["data"]["values"].size(), 8u);
    for (const json& v : chart["spec"]["data"]["values"]) models.insert(v["model"]);
  }
  EXPECT_EQ(models.size(), 2u);
  a["context_kl"]["schemes"][1]["points"][0].erase("context");
  auto bad = BuildStudyCharts(a);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("context_kl.schemes[1].points[0]"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace kvq
