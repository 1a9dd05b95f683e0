#include "engine/study.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>

#include "engine/calibrate.h"
#include "engine/perplexity.h"
#include "engine/planner.h"
#include "engine/study_capture.h"
#include "engine/study_outliers.h"
#include "engine/study_quant.h"
#include "kv/kv_calibration.h"

namespace kvq {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Json Matrix(const std::vector<std::vector<double>>& m) {
  Json out = Json::array();
  for (const auto& row : m) {
    Json r = Json::array();
    for (double x : row) r.push_back(JsonNumber(x));
    out.push_back(std::move(r));
  }
  return out;
}

Json Vector(const std::vector<double>& v) {
  Json out = Json::array();
  for (double x : v) out.push_back(JsonNumber(x));
  return out;
}

Json OutliersJson(const std::vector<LayerOutliers>& layers, int64_t tokens) {
  Json out;
  out["capture_tokens"] = tokens;
  out["outlier_rule"] = "mean |x| over tokens > " + std::to_string(kOutlierRatio).substr(0, 3) +
                        "x the head's median channel";
  out["consistency_rule"] =
      "fraction of tokens whose m largest-|x| channels are exactly the m outlier channels";
  out["sink_rule"] = "mean over query heads and query rows 1..T-1 of the probability on token 0";
  Json list = Json::array();
  for (const LayerOutliers& l : layers) {
    Json j;
    j["layer"] = l.layer;
    j["k_pre_rope_channel_absmax"] = Matrix(l.k_pre_mean_abs);
    j["k_post_rope_channel_absmax"] = Matrix(l.k_post_mean_abs);
    j["v_channel_absmax"] = Matrix(l.v_mean_abs);
    j["k_pre_rope_outlier_channels"] = l.k_pre_outliers;
    j["k_post_rope_outlier_channels"] = l.k_post_outliers;
    j["v_outlier_channels"] = l.v_outliers;
    j["k_outlier_consistency"] = Vector(l.k_pre_consistency);
    j["k_post_rope_outlier_consistency"] = Vector(l.k_post_consistency);
    j["sink_mass"] = JsonNumber(l.sink_mass);
    list.push_back(std::move(j));
  }
  out["layers"] = std::move(list);
  return out;
}

Json MetricsJson(const FakeQuantMetrics& m) {
  return Json{{"score_rel_error", JsonNumber(m.score_rel_error)},
              {"prob_kl", JsonNumber(m.prob_kl)},
              {"output_rel_error", JsonNumber(m.output_rel_error)}};
}

Json FakeQuantJson(const std::vector<FakeQuantRow>& rows, int64_t tokens, int64_t token_group) {
  Json out;
  out["capture_tokens"] = tokens;
  out["per_token_group"] = "the whole head vector (head_dim channels of one token)";
  out["per_channel_group_tokens"] = token_group;
  out["quantizer"] = "asymmetric min/max, 2^b levels, round to nearest";
  Json list = Json::array();
  for (const FakeQuantRow& r : rows) {
    Json j = MetricsJson(r.overall);
    j["name"] = r.name;
    j["k_axis"] = QuantAxisName(r.k_axis);
    j["v_axis"] = QuantAxisName(r.v_axis);
    j["literal_formula"] = r.formula == QuantFormula::kLiteralWriteup;
    j["k_pre_rope"] = r.k_pre_rope;
    j["bits"] = r.bits;
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

// KVQuant's calibration for the schemes that need one: the user's file, or
// one computed here and saved to the scratch path. Returns the JSON record
// (null when no scheme needs a calibration) and sets *path.
StatusOr<Json> PrepareCalibration(LoadedModel& model, const std::vector<int32_t>& study_tokens,
                                  int64_t evaluated_tokens, const std::vector<SchemeSpec>& schemes,
                                  const StudyOptions& o, std::string* path) {
  const KvShape shape = model.transformer->kv_shape();
  bool needed = false;
  for (const SchemeSpec& spec : schemes) {
    KVQ_ASSIGN_OR_RETURN(bool needs, NeedsCalibrationFile(shape, SchemeCacheOptions(spec, 16, 1)));
    needed = needed || needs;
  }
  path->clear();
  if (!needed) return Json(nullptr);
  if (!o.calibration_path.empty()) {
    *path = o.calibration_path;
    return Json{{"source", "file"}, {"path", o.calibration_path}};
  }
  if (o.calibration_scratch_path.empty()) {
    return Status::Error("internal: KVQuant schemes need a calibration scratch path");
  }
  const auto start = Clock::now();
  std::vector<int32_t> tokens;
  std::string text_label;
  bool overlaps = false;
  if (!o.calibration_text.empty()) {
    tokens = PerplexityTokens(model, o.calibration_text);
    text_label = o.calibration_text_path.empty() ? "calibration text" : o.calibration_text_path;
  } else if (static_cast<int64_t>(study_tokens.size()) - evaluated_tokens >=
             o.calibration.context) {
    tokens.assign(study_tokens.begin() + evaluated_tokens, study_tokens.end());
    text_label = "the study text after the perplexity windows";
  } else {
    // Too short a text to hold out any: calibrate in-sample and say so.
    tokens = study_tokens;
    text_label = "the study text (in-sample: it is too short to hold out a window)";
    overlaps = true;
  }
  KVQ_ASSIGN_OR_RETURN(CalibrateResult calibrated, CalibrateKvTokens(model, tokens, o.calibration));
  KVQ_RETURN_IF_ERROR(SaveKvCalibration(calibrated.calibration, o.calibration_scratch_path));
  *path = o.calibration_scratch_path;
  const KvCalibration& c = calibrated.calibration;
  return Json{{"source", "computed"},
              {"text", text_label},
              {"overlaps_perplexity_windows", overlaps},
              {"windows", calibrated.windows},
              {"context", o.calibration.context},
              {"tokens", c.tokens},
              {"method", c.method},
              {"outlier_percent", c.outlier_percent},
              {"bits", o.calibration.bits},
              {"seconds", Since(start)}};
}

}  // namespace

std::string DefaultStudyTextPath() { return DefaultCorpusPath("test.txt"); }

std::string DefaultCalibrationTextPath(const std::string& study_text_path) {
  namespace fs = std::filesystem;
  const std::string test = DefaultStudyTextPath();
  std::error_code ec;
  if (test.empty() || !fs::equivalent(test, study_text_path, ec) || ec) return "";
  return DefaultCorpusPath("valid.txt");
}

std::string DefaultCorpusPath(const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path relative = fs::path(".deps") / "corpus" / name;
  std::vector<fs::path> candidates = {relative};
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path() / "../.." / relative);
#ifdef KVQ_SOURCE_DIR
  candidates.push_back(fs::path(KVQ_SOURCE_DIR) / relative);
#endif
  for (const fs::path& c : candidates) {
    if (fs::is_regular_file(c, ec))
      return c == relative ? c.string() : fs::weakly_canonical(c, ec).string();
  }
  return "";
}

Json JsonNumber(double x) { return std::isfinite(x) ? Json(x) : Json(nullptr); }

Status ValidateStudy(const LoadedModel& model, const std::vector<int32_t>& text_tokens,
                     const StudyOptions& o) {
  const int64_t model_context = model.transformer->config().max_position_embeddings;
  const int64_t n = static_cast<int64_t>(text_tokens.size());
  if (o.context < 4 || o.context % 2 != 0 || o.context > model_context) {
    return Status::Error("--ctx must be even and in [4, " + std::to_string(model_context) +
                         "] (the model's context); got " + std::to_string(o.context));
  }
  if (o.capture_tokens < 2 || o.capture_tokens > model_context) {
    return Status::Error("capture tokens must be in [2, " + std::to_string(model_context) +
                         "] (the model's context); got " + std::to_string(o.capture_tokens));
  }
  const int64_t need = std::max(o.capture_tokens, o.context * std::max<int64_t>(o.chunks, 1));
  if (n < need) {
    return Status::Error("the text has " + std::to_string(n) + " tokens; this study needs " +
                         std::to_string(need) + " (--ctx " + std::to_string(o.context) + " x " +
                         std::to_string(std::max<int64_t>(o.chunks, 1)) + " windows, capture " +
                         std::to_string(o.capture_tokens) +
                         "): use a longer text, or lower --ctx / --chunks");
  }
  for (int64_t c : o.recall.contexts) {
    if (c > model_context || c <= o.recall.answer_tokens) {
      return Status::Error("recall context " + std::to_string(c) + " outside (" +
                           std::to_string(o.recall.answer_tokens) + ", " +
                           std::to_string(model_context) + "]");
    }
    if (c > n) {
      return Status::Error("the text has " + std::to_string(n) +
                           " tokens, fewer than the recall context " + std::to_string(c));
    }
    // The needle and the question must fit (fails for tiny contexts).
    KVQ_RETURN_IF_ERROR(
        BuildPasskeyPrompt(model, text_tokens, c - o.recall.answer_tokens, 0.5, "00000").status());
  }
  if (o.schemes.empty()) return Status::Error("no schemes to run");
  if (o.baseline_logits_path.empty()) return Status::Error("internal: no baseline logits path");
  return Status::Ok();
}

StatusOr<Json> RunStudy(LoadedModel& model, const std::string& text, const StudyOptions& o,
                        const std::function<void(const StudyEvent&)>& progress) {
  const auto t_start = Clock::now();
  auto report = [&](const std::string& stage, const std::string& detail, int64_t done,
                    int64_t total) {
    if (progress) progress({stage, detail, done, total});
  };
  const Transformer& t = *model.transformer;
  const ModelConfig& config = t.config();
  const std::vector<int32_t> tokens = PerplexityTokens(model, text);  // BOS first if the model adds
  KVQ_RETURN_IF_ERROR(ValidateStudy(model, tokens, o));
  const std::vector<int32_t> filler = model.tokenizer->Encode(text);

  Json out;
  out["kvq_study_version"] = 1;
  out["created_utc"] = UtcNow();
  out["command"] = o.command;
  out["quick"] = o.quick;
  Json m;
  m["path"] = model.path;
  m["architecture"] = ArchitectureName(config.arch);
  m["layers"] = config.num_layers;
  m["heads"] = config.num_heads;
  m["kv_heads"] = config.num_kv_heads;
  m["head_dim"] = config.head_dim;
  m["context"] = config.max_position_embeddings;
  auto plan_model = LoadPlanModel(model.path);
  m["parameters"] = plan_model.ok() ? Json(plan_model->parameters) : Json(nullptr);
  KVQ_ASSIGN_OR_RETURN(auto bias_norms, KBiasNorms(t.files()));
  m["k_bias_norms"] = Matrix(bias_norms);
  out["model"] = std::move(m);
  // tokens_used: the perplexity windows (the text's first windows x context
  // tokens; the capture reads the first capture_tokens of the same prefix).
  // Passkey filler comes from seeded offsets anywhere in the text.
  const int64_t windows = o.chunks > 0 ? std::min<int64_t>(o.chunks, tokens.size() / o.context)
                                       : static_cast<int64_t>(tokens.size()) / o.context;
  out["text"] = {{"path", o.text_path},
                 {"tokens_used", std::max(windows * o.context, o.capture_tokens)},
                 {"text_tokens", static_cast<int64_t>(tokens.size())},
                 {"perplexity_windows", windows},
                 {"perplexity_context", o.context}};

  // 1. Capture.
  auto t0 = Clock::now();
  const std::vector<int32_t> capture_ids(tokens.begin(), tokens.begin() + o.capture_tokens);
  KVQ_ASSIGN_OR_RETURN(StudyCapture capture,
                       CaptureKv(model, capture_ids, o.batch, [&](int64_t done, int64_t total) {
                         report("capture", "forward", done, total);
                       }));
  if (!o.dump_path.empty()) {
    KVQ_RETURN_IF_ERROR(WriteCaptureSafetensors(capture, config, model.path, o.dump_path));
  }
  const double capture_seconds = Since(t0);

  // 2. Outliers and sinks.
  t0 = Clock::now();
  const std::vector<LayerOutliers> outliers =
      AnalyzeOutliers(capture, [&](int64_t d, int64_t n) { report("outliers", "layer", d, n); });
  out["outliers"] = OutliersJson(outliers, capture.tokens);
  const double outlier_seconds = Since(t0);

  // 3. Fake quantization.
  t0 = Clock::now();
  std::vector<FakeQuantRow> rows = StudyFakeQuantRows(o.fake_quant_bits);
  FakeQuantOptions fq;
  fq.token_group = o.token_group;
  KVQ_ASSIGN_OR_RETURN(fq.rope, MakeRopeApplier(config));
  KVQ_RETURN_IF_ERROR(RunFakeQuant(
      capture, fq, &rows, [&](int64_t d, int64_t n) { report("fake_quant", "layer", d, n); }));
  out["fake_quant"] = FakeQuantJson(rows, capture.tokens, o.token_group);
  const double fake_quant_seconds = Since(t0);
  capture = StudyCapture();  // free the captured tensors before the end-to-end runs

  // 4. End to end: the f16 cache first (the baseline every KL is against).
  t0 = Clock::now();
  std::vector<SchemeSpec> schemes = o.schemes;
  auto is_f16 = [](const SchemeSpec& s) {
    return s.k_type == "f16" && s.v_type == "f16" && !s.rotate && s.policy.empty();
  };
  auto base_it = std::find_if(schemes.begin(), schemes.end(), is_f16);
  if (base_it == schemes.end()) {
    schemes.insert(schemes.begin(), SchemeSpec{"f16", "f16", "f16", false, ""});
  } else {
    std::rotate(schemes.begin(), base_it, base_it + 1);
  }
  report("calibration", "kvquant", 0, 1);
  std::string calibration_path;
  auto calibration =
      PrepareCalibration(model, tokens, windows * o.context, schemes, o, &calibration_path);
  if (!calibration.ok()) return calibration.status().WithContext("KVQuant calibration");
  out["calibration"] = std::move(*calibration);
  report("calibration", "kvquant", 1, 1);
  EndToEndOptions e2e;
  e2e.calibration_path = calibration_path;
  e2e.perplexity.context = o.context;
  e2e.perplexity.batch = o.batch;
  e2e.perplexity.max_windows = o.chunks;
  e2e.recall = o.recall;
  e2e.baseline_logits_path = o.baseline_logits_path;
  e2e.threads = o.threads;
  Json scheme_list = Json::array();
  Json series = Json::array();
  Status status = Status::Ok();
  for (size_t i = 0; i < schemes.size() && status.ok(); ++i) {
    const SchemeSpec& spec = schemes[i];
    auto result =
        RunSchemeEndToEnd(model, text, filler, spec, e2e, i == 0, [&](const SchemeProgress& p) {
          report("scheme " + std::to_string(i + 1) + "/" + std::to_string(schemes.size()) + " " +
                     spec.name,
                 p.stage, p.done, p.total);
        });
    if (!result.ok()) {
      status = Status::Error("scheme " + spec.name + ": " + result.status().message());
      break;
    }
    scheme_list.push_back(SchemeJson(*result));
    Json bytes = Json::array();
    for (int64_t c : o.memory_contexts) bytes.push_back(ExactKvBytes(result->plan.layout, 1, c));
    series.push_back({{"name", spec.name}, {"bytes", std::move(bytes)}});
  }
  std::error_code ignored;
  std::filesystem::remove(o.baseline_logits_path, ignored);
  if (calibration_path == o.calibration_scratch_path && !calibration_path.empty()) {
    std::filesystem::remove(calibration_path, ignored);
  }
  KVQ_RETURN_IF_ERROR(status);
  out["schemes"] = std::move(scheme_list);
  out["memory"] = {{"contexts", o.memory_contexts}, {"series", std::move(series)}};
  out["timings_seconds"] = {{"capture", capture_seconds},
                            {"outliers", outlier_seconds},
                            {"fake_quant", fake_quant_seconds},
                            {"end_to_end", Since(t0)},
                            {"total", Since(t_start)}};
  return out;
}

}  // namespace kvq
