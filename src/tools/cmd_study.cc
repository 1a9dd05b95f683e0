// kvq study: which KV-cache scheme can this model afford? Captures the real
// K/V of a text, measures outliers and fake-quant distortion, runs every
// scheme end to end, prints a table and writes the JSON (and the HTML report).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "base/threads.h"
#include "engine/default_model.h"
#include "engine/loaded_model.h"
#include "engine/planner.h"
#include "engine/study.h"
#include "engine/study_report.h"
#include "io/mapped_file.h"
#include "tools/commands.h"
#include "tools/model_arg.h"

namespace kvq {
namespace {

struct StudyFlags {
  std::string model;
  std::string file;
  std::string schemes;
  bool quick = false;
  int64_t context = 0;  // 0 = the mode's default
  int64_t chunks = -1;  // -1 = the mode's default
  int64_t capture = 0;  // 0 = --ctx
  int64_t batch = 512;
  std::vector<int64_t> recall_contexts;
  std::vector<double> recall_depths;
  int recall_trials = 0;  // 0 = the mode's default
  uint64_t seed = 1234;
  int threads = 0;
  std::string json = "study.json";
  std::string report;
  std::string dump;
  std::string kv_calibration;
  std::string calib_file;
  int64_t calib_tokens = 0;  // 0 = the mode's default
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvq study: %s\n", message.c_str());
  return 1;
}

std::string CommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::replace(all.begin(), all.end(), '\0', ' ');
  while (!all.empty() && all.back() == ' ') all.pop_back();
  return all;
}

std::string Mb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MB", bytes / 1e6);
  return buf;
}

// Refuses a model whose weights + largest cache + capture buffers exceed RAM,
// before anything is loaded, with the planner's numbers.
Status CheckFits(const std::string& path, const std::vector<SchemeSpec>& schemes,
                 int64_t capture_tokens) {
  KVQ_ASSIGN_OR_RETURN(PlanModel plan, LoadPlanModel(path));
  const ModelConfig& c = plan.config;
  double weights = 0;
  for (const auto& [dtype, bytes] : plan.weight_bytes) weights += static_cast<double>(bytes);
  if (!plan.weights_from_file && !plan.weight_bytes.empty()) {
    weights = static_cast<double>(plan.weight_bytes.front().second);
  }
  double kv = 0;
  for (const SchemeSpec& s : schemes) {
    KVQ_ASSIGN_OR_RETURN(
        KvTypePlan p,
        PlanKvType(PlanKvShape(c), SchemeCacheOptions(s, c.max_position_embeddings, 1)));
    kv = std::max(kv, ExactKvBytes(p.layout, 1, c.max_position_embeddings));
  }
  // q, K pre/post, V per layer in f32, plus three [T, T] f32 score matrices.
  const double t = static_cast<double>(capture_tokens);
  const double capture =
      4.0 * t * c.num_layers * (c.num_heads + 3 * c.num_kv_heads) * c.head_dim + 12.0 * t * t;
  const double need = weights + kv + capture;
  const double ram = PhysicalRamBytes();
  if (ram > 0 && need > ram) {
    return Status::Error("the model does not fit in memory: weights " + Mb(weights) +
                         " + largest KV cache at " + std::to_string(c.max_position_embeddings) +
                         " tokens " + Mb(kv) + " + capture " + Mb(capture) + " = " + Mb(need) +
                         " > RAM " + Mb(ram) + " (see kvq plan)");
  }
  return Status::Ok();
}

class Progress {
 public:
  Progress() : live_(isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()) {}
  void operator()(const StudyEvent& e) {
    const std::string key = e.stage + "/" + e.detail;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (live_) {
      std::fprintf(stderr, "\r\033[K%6.1f s  [%s] %s %lld/%lld", seconds, e.stage.c_str(),
                   e.detail.c_str(), (long long)e.done, (long long)e.total);
    } else if (key != last_ || (e.done == e.total && e.done != 1)) {
      // Logs get one line when a stage starts and one when it ends.
      std::fprintf(stderr, "%6.1f s  [%s] %s %lld/%lld\n", seconds, e.stage.c_str(),
                   e.detail.c_str(), (long long)e.done, (long long)e.total);
    }
    last_ = key;
    std::fflush(stderr);
  }
  void Done() {
    if (live_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool live_;
  std::chrono::steady_clock::time_point start_;
  std::string last_;
};

std::string Num(const nlohmann::json& j, const char* fmt) {
  if (!j.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), fmt, j.get<double>());
  return buf;
}

void PrintTables(const nlohmann::json& s) {
  const auto& m = s["model"];
  std::printf("model: %s (%s, %lld layers, %lld heads / %lld KV heads, head_dim %lld)\n",
              m["path"].get<std::string>().c_str(), m["architecture"].get<std::string>().c_str(),
              (long long)m["layers"], (long long)m["heads"], (long long)m["kv_heads"],
              (long long)m["head_dim"]);
  std::printf("\nOutliers (captured %lld tokens; channels with mean |x| > 4x the head's median)\n",
              (long long)s["outliers"]["capture_tokens"]);
  std::printf("%-6s %-5s %-24s %-11s %-24s %-10s %s\n", "layer", "head", "K pre-RoPE outliers",
              "consistent", "K post-RoPE outliers", "V outliers", "sink mass");
  for (const auto& l : s["outliers"]["layers"]) {
    const auto& pre = l["k_pre_rope_outlier_channels"];
    for (size_t h = 0; h < pre.size(); ++h) {
      std::printf("%-6lld %-5zu %-24s %-11s %-24s %-10s %s\n", (long long)l["layer"], h,
                  pre[h].dump().c_str(), Num(l["k_outlier_consistency"][h], "%.2f").c_str(),
                  l["k_post_rope_outlier_channels"][h].dump().c_str(),
                  l["v_outlier_channels"][h].dump().c_str(),
                  h == 0 ? Num(l["sink_mass"], "%.3f").c_str() : "");
    }
  }
  std::printf(
      "\nFake quantization of the captured K/V (overall; %s; per-channel groups of %lld "
      "tokens)\n",
      s["fake_quant"]["quantizer"].get<std::string>().c_str(),
      (long long)s["fake_quant"]["per_channel_group_tokens"]);
  std::printf("%-62s %4s %11s %11s %11s\n", "row", "bits", "score err", "prob KL", "output err");
  for (const auto& r : s["fake_quant"]["rows"]) {
    std::printf("%-62s %4d %11s %11s %11s\n", r["name"].get<std::string>().c_str(),
                r["bits"].get<int>(), Num(r["score_rel_error"], "%.4f").c_str(),
                Num(r["prob_kl"], "%.3e").c_str(), Num(r["output_rel_error"], "%.4f").c_str());
  }
  std::printf("\nEnd to end with real caches (KL and top-1 vs the f16 cache)\n");
  if (s.contains("calibration") && s["calibration"].is_object()) {
    const auto& c = s["calibration"];
    if (c["source"] == "file") {
      std::printf("KVQuant calibration: %s\n", c["path"].get<std::string>().c_str());
    } else {
      std::printf(
          "KVQuant calibration: %s, %lld tokens (%lld windows of %lld), weights %s, %.1f s\n",
          c["text"].get<std::string>().c_str(), (long long)c["tokens"], (long long)c["windows"],
          (long long)c["context"], c["method"].get<std::string>().c_str(),
          c["seconds"].get<double>());
    }
  }
  std::printf("%-14s %8s %10s %6s %20s %10s %10s %7s %8s\n", "scheme", "bits/val", "bytes/tok",
              "x f16", "PPL", "KL mean", "KL p99", "top-1", "recall");
  for (const auto& r : s["schemes"]) {
    int correct = 0, trials = 0;
    for (const auto& c : r["recall"]) {
      correct += c["correct"].get<int>();
      trials += c["trials"].get<int>();
    }
    const std::string ppl = Num(r["ppl"], "%.3f") + " +/- " + Num(r["ppl_error"], "%.3f");
    std::printf("%-14s %8s %10s %6s %20s %10s %10s %7s %4d/%-3d\n",
                r["name"].get<std::string>().c_str(), Num(r["bits_per_value"], "%.2f").c_str(),
                Num(r["bytes_per_token"], "%.0f").c_str(),
                Num(r["compression_vs_f16"], "%.2f").c_str(), ppl.c_str(),
                Num(r["kl_mean"], "%.2e").c_str(), Num(r["kl_p99"], "%.2e").c_str(),
                Num(r["top1_agreement"], "%.4f").c_str(), correct, trials);
  }
  const auto& t = s["timings_seconds"];
  std::printf(
      "\ntime: capture %.1f s, outliers %.1f s, fake quant %.1f s, end to end %.1f s, "
      "total %.1f s\n",
      t["capture"].get<double>(), t["outliers"].get<double>(), t["fake_quant"].get<double>(),
      t["end_to_end"].get<double>(), t["total"].get<double>());
}

int RunStudyCommand(const StudyFlags& flags) {
  const std::string model_path = flags.model.empty() ? DefaultModelPath() : flags.model;
  if (model_path.empty())
    return Fail("no model given and the default model was not found; pass -m");
  const std::string text_path = flags.file.empty() ? DefaultStudyTextPath() : flags.file;
  if (text_path.empty()) {
    return Fail("no text given and .deps/corpus/test.txt was not found; pass -f FILE");
  }
  auto text = ReadTextFile(text_path);
  if (!text.ok()) return Fail(text.status().message());

  auto plan = LoadPlanModel(model_path);
  if (!plan.ok()) return Fail(plan.status().message());
  const ModelConfig& c = plan->config;
  const KvShape shape = PlanKvShape(c);
  const std::string scheme_list = flags.schemes.empty() ? DefaultStudySchemes() : flags.schemes;
  auto schemes = ParseSchemeList(scheme_list, shape);
  if (!schemes.ok()) return Fail(schemes.status().message());

  StudyOptions o;
  o.quick = flags.quick;
  const int64_t model_ctx = c.max_position_embeddings;
  // Defaults sized for the <= 2 min (--quick, one core) / <= 10 min budgets
  // on the shipped model; every one can be overridden.
  o.context =
      flags.context > 0 ? flags.context : std::min<int64_t>(model_ctx, flags.quick ? 256 : 1024);
  o.chunks = flags.chunks >= 0 ? flags.chunks : (flags.quick ? 2 : 4);
  o.capture_tokens = flags.capture > 0 ? flags.capture : o.context;
  o.batch = flags.batch;
  o.schemes = *schemes;
  const int64_t top = std::min<int64_t>(model_ctx, 4096);  // recall's longest default context
  o.recall.contexts = flags.recall_contexts;
  if (o.recall.contexts.empty()) {
    o.recall.contexts = flags.quick ? std::vector<int64_t>{top / 4, top}
                                    : std::vector<int64_t>{top / 4, top / 2, top};
  }
  if (!flags.recall_depths.empty()) o.recall.depths = flags.recall_depths;
  if (flags.quick && flags.recall_depths.empty()) o.recall.depths = {0.0, 0.5, 1.0};
  o.recall.trials = flags.recall_trials > 0 ? flags.recall_trials : (flags.quick ? 1 : 2);
  o.recall.seed = flags.seed;
  o.dump_path = flags.dump;
  o.threads = flags.threads > 0 ? flags.threads : AvailableThreads();
  o.text_path = text_path;
  o.command = CommandLine();
  if (model_ctx > o.memory_contexts.back()) o.memory_contexts.push_back(model_ctx);
  const std::filesystem::path scratch =
      std::filesystem::temp_directory_path() / ("kvq-study-" + std::to_string(::getpid()));
  o.baseline_logits_path = scratch.string() + "-f16.logprobs";
  o.calibration_scratch_path = scratch.string() + "-kvquant.safetensors";
  o.calibration_path = flags.kv_calibration;
  o.calibration.tokens = flags.calib_tokens > 0 ? flags.calib_tokens : (flags.quick ? 1024 : 4096);
  o.calibration.context = std::min<int64_t>(model_ctx, 512);
  o.calibration_text_path =
      flags.calib_file.empty() ? DefaultCalibrationTextPath(text_path) : flags.calib_file;
  if (!o.calibration_text_path.empty() && o.calibration_path.empty()) {
    auto calib_text = ReadTextFile(o.calibration_text_path);
    if (!calib_text.ok()) return Fail("calibration text: " + calib_text.status().message());
    o.calibration_text = std::move(calib_text).value();
  }

  Status fits = CheckFits(model_path, o.schemes, o.capture_tokens);
  if (!fits.ok()) return Fail(fits.message());
  auto loaded = LoadModel(model_path, o.threads);
  if (!loaded.ok()) return Fail(loaded.status().message());
  o.model_path = loaded->path;
  std::fprintf(stderr,
               "kvq study: %s, text %s, %d threads, --ctx %lld x %lld windows, capture %lld "
               "tokens, %zu schemes%s\n",
               loaded->path.c_str(), text_path.c_str(), o.threads, (long long)o.context,
               (long long)o.chunks, (long long)o.capture_tokens, o.schemes.size(),
               o.quick ? " (--quick)" : "");
  Progress progress;
  auto result = RunStudy(*loaded, *text, o, [&](const StudyEvent& e) { progress(e); });
  progress.Done();
  if (!result.ok()) return Fail(result.status().message());
  PrintTables(*result);
  {
    std::ofstream out(flags.json);
    if (!out) return Fail(flags.json + ": cannot write the JSON");
    out << result->dump(1) << "\n";
    if (!out) return Fail(flags.json + ": write failed");
  }
  std::printf("json: %s\n", flags.json.c_str());
  if (!flags.dump.empty()) std::printf("dump: %s\n", flags.dump.c_str());
  if (!flags.report.empty()) {
    Status st = WriteStudyReport(*result, flags.report);
    if (!st.ok()) return Fail(st.message());
    std::printf("report: %s\n", flags.report.c_str());
  }
  return 0;
}

}  // namespace

void RegisterStudyCommand(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<StudyFlags>();
  CLI::App* cmd =
      app.add_subcommand("study",
                         "Which KV-cache scheme can this model afford? Outliers, fake-quant error, "
                         "perplexity/KL/recall per scheme, bytes; table + JSON (+ HTML report)");
  cmd->footer(
      "Stages: (1) capture q, K pre/post RoPE, V of the first --capture tokens (f32 cache);\n"
      "(2) per-channel mean |x| and outlier channels (> 4x the head's median), attention-sink\n"
      "mass; (3) fake quantization (asymmetric min/max, 2^b levels; per-token = whole head\n"
      "vector, per-channel = groups of 32 tokens) at 2 and 4 bits, plus the write-up's literal\n"
      "2^(b+1)-level formula, scored by relative score error, attention KL, output error;\n"
      "(4) each --schemes entry as a real cache: perplexity (kvq perplexity convention), KL and\n"
      "top-1 vs the f16 cache, passkey recall at several contexts and depths, bytes per token;\n"
      "kvquant* schemes are calibrated first (kvq calibrate's q2 weights) unless "
      "--kv-calibration.\n"
      "Scheme specs: TYPE (any --kv-cache-dtype), KTYPE/VTYPE (f16/int4), suffix +rot,\n"
      "policy:FILE (a --kv-policy file, e.g. from kvq tune).\n"
      "--dump FILE tensors (F32): layers.{L}.q [tokens, heads, head_dim],\n"
      "layers.{L}.k_pre_rope / k_post_rope / v [tokens, kv_heads, head_dim], token_ids [tokens].");
  AddModelOption(*cmd, &flags->model);
  cmd->add_option("-f,--file", flags->file,
                  "Held-out text (default: .deps/corpus/test.txt when present)");
  cmd->add_option("--schemes", flags->schemes,
                  "Comma-separated KV cache specs (default: " + DefaultStudySchemes() + ")");
  cmd->add_flag(
      "--quick", flags->quick,
      "Small run for CI: --ctx 256, 2 windows, recall at 2 contexts x 3 depths x 1 trial");
  cmd->add_option("-c,--ctx", flags->context,
                  "Perplexity window in tokens, even (default min(model context, 1024); 256 "
                  "with --quick)");
  cmd->add_option("--chunks", flags->chunks,
                  "Perplexity windows to score (default 4; 2 with --quick; 0 = the whole text)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--capture", flags->capture,
                  "Tokens captured for outliers and fake quantization (default: --ctx)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("-b,--batch", flags->batch, "Tokens per forward call (default 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--recall-contexts", flags->recall_contexts,
                  "Passkey context lengths (default C/4, C/2, C with C = min(model context, "
                  "4096); --quick: C/4, C)")
      ->delimiter(',');
  cmd->add_option("--recall-depths", flags->recall_depths,
                  "Passkey depths in [0, 1] (default 0,0.25,0.5,0.75,1; --quick 0,0.5,1)")
      ->delimiter(',')
      ->check(FiniteRange(0, 1));
  cmd->add_option("--recall-trials", flags->recall_trials,
                  "Passkey trials per (context, depth) (default 2; 1 with --quick)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", flags->seed, "Seed of the passkey prompts (default 1234)");
  cmd->add_option("-t,--threads", flags->threads, "Threads (default: all cores)")
      ->check(ThreadsCheck());
  cmd->add_option("--json", flags->json, "Write every number here (default study.json)");
  cmd->add_option("--report", flags->report, "Write the self-contained HTML report here");
  cmd->add_option("--dump", flags->dump, "Write the captured q/K/V as safetensors here");
  cmd->add_option("--kv-calibration", flags->kv_calibration,
                  "KVQuant calibration file (kvq calibrate) for the kvquant schemes (default: "
                  "calibrate here, see --calib-file)");
  cmd->add_option("--calib-file", flags->calib_file,
                  "Text KVQuant calibrates on (default: .deps/corpus/valid.txt when -f is the "
                  "default test split, else the study text after the perplexity windows)");
  cmd->add_option("--calib-tokens", flags->calib_tokens,
                  "KVQuant calibration tokens, in windows of 512 (default 4096; 1024 with --quick)")
      ->check(CLI::PositiveNumber);
  cmd->callback([flags, &ctx] { ctx.exit_code = RunStudyCommand(*flags); });
}

}  // namespace kvq
