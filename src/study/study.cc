#include "study/study.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>

#include "eval/calibrate.h"
#include "eval/perplexity.h"
#include "eval/planner.h"
#include "io/sha256.h"
#include "kv/kv_calibration.h"
#include "study/study_capture.h"
#include "study/study_gsm8k.h"
#include "study/study_json.h"
#include "study/study_niah.h"
#include "study/study_outliers.h"
#include "study/study_quant.h"
#include "study/study_resume.h"

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

// KVQuant's calibration for the schemes that need one: the user's file, or
// one computed here and saved to the scratch path. Returns the JSON record
// (null when no scheme needs a calibration) and sets *path.
StatusOr<Json> PrepareCalibration(LoadedModel& model, const std::vector<int32_t>& study_tokens,
                                  int64_t evaluated_tokens, const std::vector<SchemeSpec>& schemes,
                                  const StudyOptions& o, std::string* path) {
  const KvShape shape = model.transformer->kv_shape();
  bool needed = false;
  for (const SchemeSpec& spec : schemes) {
    KVQ_ASSIGN_OR_RETURN(bool needs,
                         NeedsCalibrationFile(shape, SchemeCacheOptions(spec, 16, nullptr)));
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

namespace {

// The first of `relative` (from the working directory), the same path from
// the checkout the binary was built in (bin/../..), and from the source folder
// that is a regular file; "" when none is.
std::filesystem::path FindFromCheckout(const std::filesystem::path& relative) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> candidates = {relative};
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path() / "../.." / relative);
#ifdef KVQ_SOURCE_DIR
  candidates.push_back(fs::path(KVQ_SOURCE_DIR) / relative);
#endif
  for (const fs::path& c : candidates) {
    if (fs::is_regular_file(c, ec)) return c;
  }
  return {};
}

}  // namespace

std::string DefaultCorpusPath(const std::string& name) {
  const std::filesystem::path relative = std::filesystem::path(".deps") / "corpus" / name;
  const std::filesystem::path found = FindFromCheckout(relative);
  std::error_code ec;
  if (found.empty() || found == relative) return found.string();
  return std::filesystem::weakly_canonical(found, ec).string();
}

std::string DefaultGsm8kPath() {
  const std::filesystem::path found =
      FindFromCheckout(std::filesystem::path("..") / "shared" / "data" / "gsm8k" / "test.jsonl");
  std::error_code ec;
  return found.empty() ? "" : std::filesystem::weakly_canonical(found, ec).string();
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

namespace {

// A cache for the recall and reasoning stages: room for `sequences`
// sequences of `max_tokens` each (by default 2: the shared prefix and the
// fork that extends it).
std::function<StatusOr<std::unique_ptr<KvCache>>()> CacheMaker(const LoadedModel& model,
                                                               const SchemeSpec& spec,
                                                               int64_t max_tokens,
                                                               const std::string& calibration,
                                                               int64_t sequences = 2) {
  const KvShape shape = model.transformer->kv_shape();
  ThreadPool* pool = model.transformer->pool();
  return [=]() -> StatusOr<std::unique_ptr<KvCache>> {
    KvCacheOptions options = SchemeCacheOptions(spec, max_tokens, pool, calibration);
    KVQ_ASSIGN_OR_RETURN(KvTypePlan plan, PlanKvType(shape, options));
    options.memory_bytes = static_cast<size_t>(ExactKvBytes(plan.layout, sequences, max_tokens));
    return MakeKvCache(shape, options);
  };
}

// f16 first (the baseline of KL and of the recall pass rule), added if absent.
std::vector<SchemeSpec> F16First(std::vector<SchemeSpec> schemes) {
  auto is_f16 = [](const SchemeSpec& s) {
    return s.k_type == "f16" && s.v_type == "f16" && !s.rotate && s.policy.empty();
  };
  auto base_it = std::find_if(schemes.begin(), schemes.end(), is_f16);
  if (base_it == schemes.end()) {
    schemes.insert(schemes.begin(), SchemeSpec{"f16", "f16", "f16", false, ""});
  } else {
    std::rotate(schemes.begin(), base_it, base_it + 1);
  }
  return schemes;
}

Json ModelJson(const LoadedModel& model, const std::vector<std::vector<double>>& bias_norms) {
  const ModelConfig& config = model.transformer->config();
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
  m["k_bias_norms"] = JsonMatrix(bias_norms);
  return m;
}

using Report = std::function<void(const std::string&, const std::string&, int64_t, int64_t)>;

// Stages 1-3 (capture, outliers and sinks, fake quantization) into `out`.
Status RunStructureStages(LoadedModel& model, const std::vector<int32_t>& tokens,
                          const std::vector<std::vector<double>>& bias_norms, const StudyOptions& o,
                          const Report& report, Json& out, Json& timings) {
  const ModelConfig& config = model.transformer->config();
  auto t0 = Clock::now();
  const std::vector<int32_t> capture_ids(tokens.begin(), tokens.begin() + o.capture_tokens);
  KVQ_ASSIGN_OR_RETURN(StudyCapture capture,
                       CaptureKv(model, capture_ids, o.batch, [&](int64_t done, int64_t total) {
                         report("capture", "forward", done, total);
                       }));
  if (!o.dump_path.empty()) {
    KVQ_RETURN_IF_ERROR(WriteCaptureSafetensors(capture, config, model.path, o.dump_path));
  }
  timings["capture"] = Since(t0);
  t0 = Clock::now();
  const std::vector<LayerOutliers> outliers =
      AnalyzeOutliers(capture, [&](int64_t d, int64_t n) { report("outliers", "layer", d, n); });
  out["outliers"] =
      OutliersJson(outliers, capture.tokens, capture.token_ids, model.tokenizer.get(), bias_norms);
  timings["outliers"] = Since(t0);
  t0 = Clock::now();
  std::vector<FakeQuantRow> rows = StudyFakeQuantRows(o.fake_quant_bits, o.token_group);
  FakeQuantOptions fq;
  fq.threads = o.threads;
  KVQ_ASSIGN_OR_RETURN(fq.rope, MakeRopeApplier(config));
  KVQ_RETURN_IF_ERROR(RunFakeQuant(
      capture, fq, &rows, [&](int64_t d, int64_t n) { report("fake_quant", "layer", d, n); }));
  out["fake_quant"] = FakeQuantJson(rows, capture.tokens, o.token_group, config.head_dim);
  timings["fake_quant"] = Since(t0);
  return Status::Ok();
}

// What a resumed end-to-end stage must share with the run that recorded its
// results (the scheme list is not part of it: a rerun may add schemes). The
// KVQuant calibration is not either: it is an input of the schemes that use
// it only, so each of their records carries its digest instead. Otherwise a
// calibration remade on another SIMD target (the same text, other rounding)
// would refuse every scheme a rerun adds.
Json EndToEndConfig(const LoadedModel& model, const std::string& text, const StudyOptions& o) {
  return Json{{"kvq_end_to_end_version", 1},
              {"model", model.path},
              {"text_sha256", Sha256Hex(text)},
              {"context", o.context},
              {"windows", o.chunks},
              {"batch", o.batch},
              {"recall",
               {{"contexts", o.recall.contexts},
                {"depths", o.recall.depths},
                {"trials", o.recall.trials},
                {"seed", o.recall.seed},
                {"answer_tokens", o.recall.answer_tokens}}}};
}

// Each scheme's results file under `dir`, and its last record (null if none).
Status OpenSchemeLogs(const std::string& dir, const std::vector<SchemeSpec>& schemes,
                      std::vector<ResultLog>* logs, std::vector<Json>* recorded) {
  for (size_t i = 0; i < schemes.size(); ++i) {
    const std::string path =
        (std::filesystem::path(dir) / (ResultFileStem(schemes[i].name) + ".jsonl")).string();
    KVQ_ASSIGN_OR_RETURN(ResultLog log, ResultLog::Open(path));
    if (!log.records().empty()) (*recorded)[i] = log.records().back();
    logs->push_back(std::move(log));
  }
  return Status::Ok();
}

// Stage 4: every scheme through the real cache (the f16 cache first). With
// o.end_to_end_dir each scheme's result is a line of <dir>/<scheme>.jsonl and
// a rerun runs only the schemes without one; the f16 log-probs the KL needs
// are scratch (hundreds of MB on a large vocabulary), so f16 runs again,
// unrecorded, whenever another scheme is still to run.
Status RunEndToEndStage(LoadedModel& model, const std::string& text,
                        const std::vector<SchemeSpec>& schemes, const std::string& calibration,
                        const StudyOptions& o, const Report& report, Json& out) {
  const std::vector<int32_t> filler = model.tokenizer->Encode(text);
  EndToEndOptions e2e;
  e2e.calibration_path = calibration;
  e2e.perplexity.context = o.context;
  e2e.perplexity.batch = o.batch;
  e2e.perplexity.max_windows = o.chunks;
  e2e.recall = o.recall;
  e2e.baseline_logits_path = o.baseline_logits_path;
  e2e.threads = o.threads;
  const bool resumable = !o.end_to_end_dir.empty();
  if (resumable) {
    KVQ_RETURN_IF_ERROR(PrepareResultDir(o.end_to_end_dir, EndToEndConfig(model, text, o)));
  }
  std::string calibration_digest;
  if (!calibration.empty()) {
    KVQ_ASSIGN_OR_RETURN(calibration_digest, Sha256File(calibration));
  }
  std::vector<ResultLog> logs;
  std::vector<Json> recorded(schemes.size());  // null: still to run
  if (resumable) KVQ_RETURN_IF_ERROR(OpenSchemeLogs(o.end_to_end_dir, schemes, &logs, &recorded));
  const bool any_missing =
      std::any_of(recorded.begin() + 1, recorded.end(), [](const Json& j) { return j.is_null(); });
  const KvShape shape = model.transformer->kv_shape();
  const int64_t max_tokens = model.transformer->config().max_position_embeddings;
  Json scheme_list = Json::array();
  Json series = Json::array();
  for (size_t i = 0; i < schemes.size(); ++i) {
    const SchemeSpec& spec = schemes[i];
    const KvCacheOptions cache =
        SchemeCacheOptions(spec, max_tokens, model.transformer->pool(), calibration);
    if (recorded[i].is_null() || (i == 0 && any_missing)) {
      auto result =
          RunSchemeEndToEnd(model, text, filler, spec, e2e, i == 0, [&](const SchemeProgress& p) {
            report("scheme " + std::to_string(i + 1) + "/" + std::to_string(schemes.size()) + " " +
                       spec.name,
                   p.stage, p.done, p.total);
          });
      if (!result.ok())
        return Status::Error("scheme " + spec.name + ": " + result.status().message());
      if (recorded[i].is_null()) {
        recorded[i] = SchemeJson(*result);
        KVQ_ASSIGN_OR_RETURN(bool calibrated, NeedsCalibrationFile(shape, cache));
        if (calibrated) recorded[i]["calibration_sha256"] = calibration_digest;
        if (resumable) {
          KVQ_RETURN_IF_ERROR(logs[i].Append(recorded[i]));
          recorded[i] = logs[i].records().back();  // as stamped
        }
      }
    }
    scheme_list.push_back(recorded[i]);
    KVQ_ASSIGN_OR_RETURN(KvTypePlan plan, PlanKvType(shape, cache));
    Json bytes = Json::array();
    for (int64_t c : o.memory_contexts) bytes.push_back(ExactKvBytes(plan.layout, 1, c));
    series.push_back({{"name", spec.name}, {"bytes", std::move(bytes)}});
  }
  out["schemes"] = std::move(scheme_list);
  out["memory"] = {{"contexts", o.memory_contexts}, {"series", std::move(series)}};
  if (resumable) out["end_to_end_dir"] = o.end_to_end_dir;
  return Status::Ok();
}

Status RunNeedleStage(LoadedModel& model, const std::string& calibration, const StudyOptions& o,
                      const Report& report, Json& out) {
  // The caches hold the longest prompt, an extension context's included.
  int64_t longest = 0;
  for (int64_t c : AllContexts(o.needle.options)) longest = std::max(longest, c);
  std::vector<NeedleScheme> schemes;
  for (const SchemeSpec& spec : F16First(o.needle.schemes)) {
    schemes.push_back({spec.name, CacheMaker(model, spec, longest, calibration)});
  }
  KVQ_ASSIGN_OR_RETURN(
      out["needle"],
      RunNeedleStudy(model, schemes, o.needle.options, o.needle.dir, [&](const NeedleProgress& p) {
        report("needle " + p.scheme, "trial", p.done, p.total);
      }));
  return Status::Ok();
}

Status RunGsm8kStage(LoadedModel& model, const std::string& calibration, const StudyOptions& o,
                     const Report& report, Json& out) {
  KVQ_ASSIGN_OR_RETURN(std::vector<Gsm8kProblem> data,
                       LoadGsm8k(o.gsm8k.data_path, o.gsm8k.sha256sums_path));
  // Room for every answer decoding at once (and the unused prefix slot) at
  // the longest prompt plus the longest answer.
  const int64_t context = model.transformer->config().max_position_embeddings;
  KVQ_ASSIGN_OR_RETURN(int64_t longest, Gsm8kLongestPrompt(model, data, o.gsm8k.options.problems,
                                                           o.gsm8k.options.chat));
  const int64_t per_answer = std::min(context, longest + o.gsm8k.options.max_new_tokens);
  std::vector<Gsm8kScheme> schemes;
  for (const SchemeSpec& spec : F16First(o.gsm8k.schemes)) {
    schemes.push_back(
        {spec.name, CacheMaker(model, spec, per_answer, calibration, o.gsm8k.options.batch + 1)});
  }
  KVQ_ASSIGN_OR_RETURN(out["gsm8k"],
                       RunGsm8kStudy(model, data, schemes, o.gsm8k.options, o.gsm8k.dir,
                                     o.gsm8k.data_path, [&](const Gsm8kProgress& p) {
                                       report("gsm8k " + p.scheme, "problem", p.done, p.total);
                                     }));
  return Status::Ok();
}

Status RunContextKlStage(LoadedModel& model, const std::string& text,
                         const std::string& calibration, const StudyOptions& o,
                         const Report& report, Json& out) {
  ContextKlOptions options = o.context_kl.options;
  options.calibration_path = calibration;
  options.threads = o.threads;
  KVQ_ASSIGN_OR_RETURN(
      out["context_kl"],
      RunContextKlStudy(model, text, Sha256Hex(text), F16First(o.context_kl.schemes), options,
                        o.context_kl.dir, [&](const ContextKlProgress& p) {
                          const std::string stage =
                              "context_kl " + p.scheme + " @ " + std::to_string(p.length);
                          if (p.tokens_total == 0) {
                            report(stage, "point", p.done, p.total);
                          } else {
                            report(stage, "tokens", p.tokens_fed, p.tokens_total);
                          }
                        }));
  return Status::Ok();
}

}  // namespace

StatusOr<Json> RunStudy(LoadedModel& model, const std::string& text, const StudyOptions& o,
                        const std::function<void(const StudyEvent&)>& progress) {
  const auto t_start = Clock::now();
  const Report report = [&](const std::string& stage, const std::string& detail, int64_t done,
                            int64_t total) {
    if (progress) progress({stage, detail, done, total});
  };
  const std::vector<int32_t> tokens = PerplexityTokens(model, text);  // BOS first if the model adds
  if (o.core) KVQ_RETURN_IF_ERROR(ValidateStudy(model, tokens, o));
  if (!o.core && !o.needle.run && !o.gsm8k.run && !o.context_kl.run) {
    return Status::Error("no study stage to run");
  }

  Json out;
  out["kvq_study_version"] = kStudyVersion;
  out["created_utc"] = UtcNow();
  out["command"] = o.command;
  out["quick"] = o.quick;
  KVQ_ASSIGN_OR_RETURN(auto bias_norms, KBiasNorms(model.transformer->files()));
  out["model"] = ModelJson(model, bias_norms);
  // prefix_tokens: the perplexity windows and the capture read the text's
  // first tokens; passkey filler comes from seeded offsets anywhere in it
  // (version 1 called this tokens_used, which the filler made untrue).
  const int64_t windows = !o.core        ? 0
                          : o.chunks > 0 ? std::min<int64_t>(o.chunks, tokens.size() / o.context)
                                         : static_cast<int64_t>(tokens.size()) / o.context;
  out["text"] = {{"path", o.text_path},
                 {"prefix_tokens", o.core ? std::max(windows * o.context, o.capture_tokens) : 0},
                 {"text_tokens", static_cast<int64_t>(tokens.size())},
                 {"perplexity_windows", windows},
                 {"perplexity_context", o.context}};
  Json timings = Json::object();
  if (o.core) {
    KVQ_RETURN_IF_ERROR(RunStructureStages(model, tokens, bias_norms, o, report, out, timings));
  }
  const std::vector<SchemeSpec> schemes = F16First(o.schemes);
  std::vector<SchemeSpec> all;  // every cache any stage builds (for the calibration)
  if (o.core) all = schemes;
  if (o.needle.run) all.insert(all.end(), o.needle.schemes.begin(), o.needle.schemes.end());
  if (o.gsm8k.run) all.insert(all.end(), o.gsm8k.schemes.begin(), o.gsm8k.schemes.end());
  if (o.context_kl.run) {
    all.insert(all.end(), o.context_kl.schemes.begin(), o.context_kl.schemes.end());
  }
  report("calibration", "kvquant", 0, 1);
  std::string calibration_path;
  auto calibration =
      PrepareCalibration(model, tokens, windows * o.context, all, o, &calibration_path);
  if (!calibration.ok()) return calibration.status().WithContext("KVQuant calibration");
  out["calibration"] = std::move(*calibration);
  report("calibration", "kvquant", 1, 1);

  Status status = Status::Ok();
  auto stage = [&](const char* name, bool run, const std::function<Status()>& body) {
    if (!run || !status.ok()) return;
    const auto t0 = Clock::now();
    status = body();
    timings[name] = Since(t0);
  };
  stage("end_to_end", o.core,
        [&] { return RunEndToEndStage(model, text, schemes, calibration_path, o, report, out); });
  stage("needle", o.needle.run,
        [&] { return RunNeedleStage(model, calibration_path, o, report, out); });
  stage("gsm8k", o.gsm8k.run,
        [&] { return RunGsm8kStage(model, calibration_path, o, report, out); });
  stage("context_kl", o.context_kl.run,
        [&] { return RunContextKlStage(model, text, calibration_path, o, report, out); });
  std::error_code ignored;
  std::filesystem::remove(o.baseline_logits_path, ignored);
  if (calibration_path == o.calibration_scratch_path && !calibration_path.empty()) {
    std::filesystem::remove(calibration_path, ignored);
  }
  KVQ_RETURN_IF_ERROR(status);
  timings["total"] = Since(t_start);
  out["timings_seconds"] = std::move(timings);
  return out;
}

}  // namespace kvq
