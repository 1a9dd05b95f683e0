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
#include "base/time_left.h"
#include "engine/chat_template.h"
#include "engine/default_model.h"
#include "engine/loaded_model.h"
#include "eval/planner.h"
#include "io/mapped_file.h"
#include "study/study.h"
#include "study/study_decode.h"
#include "study/study_files.h"
#include "study/study_report.h"
#include "study/study_resume.h"
#include "tools/commands.h"
#include "tools/model_arg.h"
#include "tools/study_tables.h"

namespace kvq {
namespace {

// The needle and GSM8K stages' default schemes: a spread of bit widths and
// families (the full study's 17 would take days at 20 trials a cell). The
// GSM8K list has kivi2 with (kivi2) and without (the same codecs, no -r)
// its 128-token f16 window, and int2, as issue 17 asks.
constexpr const char* kDefaultNeedleSchemes = "f16,int8,int4,int4+rot,kivi4,kivi2,kvquant3,int2";
constexpr const char* kDefaultGsm8kSchemes =
    "f16,int8,int4,kivi4,kivi2,int2-c32-asym/int2-g32-asym,int2";
// KL by context length: issue 17 item 6's int4, kivi2 and kvquant3, and the
// 2-bit candidates the best of which the stage reports (kvquant2, KIVI's
// codecs without the f16 window).
constexpr const char* kDefaultContextKlSchemes =
    "f16,int4,kivi2,kvquant3,kvquant2,int2-c32-asym/int2-g32-asym";

struct StudyFlags {
  std::vector<std::string> models;
  std::vector<std::string> compare;  // study JSONs to put side by side (no run)
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
  bool full = false;         // + needle (20 trials, 1K-8K), GSM8K (250), context KL
  bool niah = false;         // + a small needle stage
  bool no_core = false;      // skip capture .. end to end
  std::string results_dir;
  std::string chat = "auto";
  std::string niah_tasks, niah_schemes;
  std::vector<int64_t> niah_contexts;
  std::vector<int64_t> niah_extend_contexts;
  std::vector<double> niah_depths;
  int niah_trials = 0;
  std::string gsm8k_data, gsm8k_schemes;
  int64_t gsm8k_problems = 0;
  int gsm8k_max_tokens = 512;
  int64_t gsm8k_batch = 32;
  bool context_kl = false;  // + KL vs f16 by context length
  std::vector<int64_t> context_kl_lengths;
  std::string context_kl_schemes;
  int64_t context_kl_positions = 2048;
};

// The command as a reader would type it again: `kvq` (not the path of the
// binary on the machine that ran it), then each argument, quoted for a POSIX
// shell where it needs to be.
std::string CommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string command = "kvq";
  size_t begin = all.find('\0');  // after argv[0]
  while (begin != std::string::npos && begin + 1 < all.size()) {
    const size_t end = all.find('\0', begin + 1);
    const std::string arg = all.substr(begin + 1, end == std::string::npos ? end : end - begin - 1);
    const bool plain = !arg.empty() && arg.find_first_not_of(
                                           "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                           "0123456789_./,:=+@%-") == std::string::npos;
    command += ' ';
    if (plain) {
      command += arg;
    } else {
      command += '\'';
      for (char c : arg) command += c == '\'' ? std::string("'\\''") : std::string(1, c);
      command += '\'';
    }
    begin = end;
  }
  return command;
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
        PlanKvType(PlanKvShape(c), SchemeCacheOptions(s, c.max_position_embeddings, nullptr)));
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
    if (key != last_) time_left_ = TimeLeft();
    time_left_.Observe(seconds, e.done);
    std::string left;
    if (const auto s = time_left_.Seconds(e.total); s && e.done < e.total) {
      left = ", about " + FormatDuration(*s) + " left";
    }
    if (live_) {
      std::fprintf(stderr, "\r\033[K%6.1f s  [%s] %s %lld/%lld%s", seconds, e.stage.c_str(),
                   e.detail.c_str(), (long long)e.done, (long long)e.total, left.c_str());
    } else if (key != last_ || (e.done == e.total && e.done != 1) ||
               seconds - last_line_ >= kLogInterval) {
      // Logs get one line when a stage starts, one when it ends, and one a
      // minute between, so an hour-long stage in a log file shows it moves.
      std::fprintf(stderr, "%6.1f s  [%s] %s %lld/%lld%s\n", seconds, e.stage.c_str(),
                   e.detail.c_str(), (long long)e.done, (long long)e.total, left.c_str());
      last_line_ = seconds;
    }
    last_ = key;
    std::fflush(stderr);
  }
  void Done() {
    if (live_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  static constexpr double kLogInterval = 60;  // seconds
  bool live_;
  std::chrono::steady_clock::time_point start_;
  std::string last_;
  double last_line_ = 0;
  TimeLeft time_left_;  // of the current stage/detail
};

// The context-KL stage: lengths doubling from 512 to 4096 (with --full, to
// the model's context), or --context-kl-lengths.
Status ConfigureContextKl(const StudyFlags& flags, const ModelConfig& c, const KvShape& shape,
                          const std::string& results, StudyOptions& o) {
  o.context_kl.run = flags.full || flags.context_kl || !flags.context_kl_lengths.empty();
  if (!o.context_kl.run) return Status::Ok();
  ContextKlOptions& k = o.context_kl.options;
  k.lengths = flags.context_kl_lengths;
  if (k.lengths.empty()) {
    const int64_t longest =
        flags.full ? c.max_position_embeddings : std::min<int64_t>(4096, c.max_position_embeddings);
    for (int64_t x = 512; x <= longest; x *= 2) k.lengths.push_back(x);
  }
  if (k.lengths.empty()) return Status::Error("no context-KL length fits the model's context");
  k.positions = flags.context_kl_positions;
  k.batch = o.batch;
  KVQ_ASSIGN_OR_RETURN(o.context_kl.schemes,
                       ParseSchemeList(flags.context_kl_schemes.empty() ? kDefaultContextKlSchemes
                                                                        : flags.context_kl_schemes,
                                       shape));
  o.context_kl.dir = results + "/context_kl";
  return Status::Ok();
}

// The needle stage's grid and schemes from the flags (chat is set by the caller).
Status ConfigureNeedle(const StudyFlags& flags, const ModelConfig& c, const KvShape& shape,
                       StudyOptions::NeedleStage& needle) {
  NeedleOptions& n = needle.options;
  const std::string tasks = !flags.niah_tasks.empty()
                                ? flags.niah_tasks
                                : (flags.full ? AllNeedleTasks() : "single_repeat,multikey_repeat");
  for (size_t start = 0; start <= tasks.size();) {
    const size_t comma = std::min(tasks.find(',', start), tasks.size());
    KVQ_ASSIGN_OR_RETURN(NeedleTask t, ParseNeedleTask(tasks.substr(start, comma - start)));
    n.tasks.push_back(t);
    start = comma + 1;
  }
  n.contexts = flags.niah_contexts;
  n.extend_contexts = flags.niah_extend_contexts;
  if (n.contexts.empty()) {
    for (int64_t x : {1024, 2048, 4096}) {
      if (x <= c.max_position_embeddings && (flags.full || x <= 2048)) n.contexts.push_back(x);
    }
    if (flags.full && flags.niah_extend_contexts.empty() && c.max_position_embeddings >= 8192) {
      n.extend_contexts = {8192};
    }
  }
  std::vector<int64_t> all = n.contexts;
  all.insert(all.end(), n.extend_contexts.begin(), n.extend_contexts.end());
  for (int64_t x : all) {
    if (x > c.max_position_embeddings) {
      return Status::Error("needle context " + std::to_string(x) + " exceeds the model's " +
                           std::to_string(c.max_position_embeddings));
    }
  }
  if (n.contexts.empty()) return Status::Error("no needle context fits the model's context");
  if (!flags.niah_depths.empty()) n.depths = flags.niah_depths;
  n.trials = flags.niah_trials > 0 ? flags.niah_trials : (flags.full ? 20 : 4);
  n.seed = flags.seed;
  KVQ_ASSIGN_OR_RETURN(
      needle.schemes,
      ParseSchemeList(flags.niah_schemes.empty() ? kDefaultNeedleSchemes : flags.niah_schemes,
                      shape));
  return Status::Ok();
}

// The needle, GSM8K and context-KL stages' options from the flags
// (model-dependent defaults; chat "auto" needs the loaded tokenizer).
Status ConfigureExtraStages(const StudyFlags& flags, const LoadedModel& model,
                            const std::string& model_path, StudyOptions& o) {
  const ModelConfig& c = model.transformer->config();
  const KvShape shape = model.transformer->kv_shape();
  const bool has_template = ChatTemplate::FromJinja(model.tokenizer->chat_template()).ok();
  auto chat = [&](const std::string& mode) -> StatusOr<bool> {
    if (mode == "auto") return has_template;
    if (mode == "on" && !has_template) {
      return Status::Error("--chat on: the model has no chat template kvq knows");
    }
    if (mode == "on" || mode == "off") return mode == "on";
    return Status::Error("--chat must be auto, on or off; got '" + mode + "'");
  };
  std::string stem = std::filesystem::path(model_path).filename().string();
  if (stem.empty()) stem = std::filesystem::path(model_path).parent_path().filename().string();
  const std::string results =
      flags.results_dir.empty() ? "kvq-study-results/" + ResultFileStem(stem) : flags.results_dir;
  o.core = !flags.no_core;
  // Only when asked for: a plain rerun (e.g. after a rebuild) measures anew.
  if (o.core && (flags.full || !flags.results_dir.empty()))
    o.end_to_end_dir = results + "/end_to_end";
  o.needle.run = flags.full || flags.niah;
  if (o.needle.run) {
    KVQ_RETURN_IF_ERROR(ConfigureNeedle(flags, c, shape, o.needle));
    KVQ_ASSIGN_OR_RETURN(o.needle.options.chat, chat(flags.chat));
    o.needle.dir = results + "/needle";
  }
  o.gsm8k.run = flags.full || flags.gsm8k_problems > 0;
  if (o.gsm8k.run) {
    o.gsm8k.data_path = flags.gsm8k_data.empty() ? DefaultGsm8kPath() : flags.gsm8k_data;
    if (o.gsm8k.data_path.empty()) {
      return Status::Error("GSM8K data not found (../shared/data/gsm8k/test.jsonl); pass --gsm8k");
    }
    const std::string sums =
        (std::filesystem::path(o.gsm8k.data_path).parent_path() / "SHA256SUMS").string();
    std::error_code ec;
    o.gsm8k.sha256sums_path = std::filesystem::exists(sums, ec) ? sums : "";
    o.gsm8k.options.problems = flags.gsm8k_problems > 0 ? flags.gsm8k_problems : 250;
    o.gsm8k.options.max_new_tokens = flags.gsm8k_max_tokens;
    o.gsm8k.options.batch = flags.gsm8k_batch;
    KVQ_ASSIGN_OR_RETURN(o.gsm8k.options.chat, chat(flags.chat));
    KVQ_ASSIGN_OR_RETURN(
        o.gsm8k.schemes,
        ParseSchemeList(flags.gsm8k_schemes.empty() ? kDefaultGsm8kSchemes : flags.gsm8k_schemes,
                        shape));
    o.gsm8k.dir = results + "/gsm8k";
  }
  return ConfigureContextKl(flags, c, shape, results, o);
}

// The core study's options: flags over defaults sized for the budgets.
StatusOr<StudyOptions> CoreStudyOptions(const StudyFlags& flags, const ModelConfig& c,
                                        std::vector<SchemeSpec> schemes,
                                        const std::string& text_path) {
  StudyOptions o;
  o.schemes = std::move(schemes);
  o.quick = flags.quick;
  const int64_t model_ctx = c.max_position_embeddings;
  // Defaults sized for the <= 3 min (--quick) / <= 15 min budgets on 2
  // cores; every one can be overridden.
  o.context =
      flags.context > 0 ? flags.context : std::min<int64_t>(model_ctx, flags.quick ? 256 : 1024);
  // Two windows score 1,024 positions at the default --ctx, enough to rank
  // the schemes' KL (its standard error is printed beside it) in ~12 s each.
  o.chunks = flags.chunks >= 0 ? flags.chunks : 2;
  // Fake quantization costs capture^2 per head and layer: 512 tokens keep it
  // near 30 s on a 30-layer model (SmolLM2-135M) instead of ~2 min at 1024.
  o.capture_tokens = flags.capture > 0 ? flags.capture : std::min<int64_t>(o.context, 512);
  o.batch = flags.batch;
  // Passkey prompts were most of the end-to-end time (17 schemes x every
  // prompt's prefill): on SmolLM2-135M 2 shared cores prefill ~150-250
  // tokens/s, and 4.6K recall tokens a scheme took the default study past 15
  // minutes (session 7: ~210 s a scheme under load). The defaults keep ~1.5K
  // (three prompts at C/4); long contexts are the needle stage's job (--niah,
  // --full) and --recall-ctx asks for more.
  const int64_t top = std::min<int64_t>(model_ctx, 2048);
  o.recall.contexts = flags.recall_contexts;
  if (o.recall.contexts.empty()) o.recall.contexts = {top / 4};
  if (!flags.recall_depths.empty()) o.recall.depths = flags.recall_depths;
  if (flags.recall_depths.empty()) o.recall.depths = {0.0, 0.5, 1.0};
  o.recall.trials = flags.recall_trials > 0 ? flags.recall_trials : 1;
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
  // KVQuant's calibration took ~195 s of the default run at 4096 tokens.
  o.calibration.tokens = flags.calib_tokens > 0 ? flags.calib_tokens : (flags.quick ? 1024 : 2048);
  o.calibration.context = std::min<int64_t>(model_ctx, 512);
  o.calibration_text_path =
      flags.calib_file.empty() ? DefaultCalibrationTextPath(text_path) : flags.calib_file;
  if (!o.calibration_text_path.empty() && o.calibration_path.empty()) {
    auto calib_text = ReadTextFile(o.calibration_text_path);
    if (!calib_text.ok()) return calib_text.status().WithContext("calibration text");
    o.calibration_text = std::move(calib_text).value();
  }
  return o;
}

// One model's study; writes its JSON to `json_path`.
StatusOr<nlohmann::json> RunOneStudy(const StudyFlags& flags, const std::string& model_path,
                                     const std::string& json_path) {
  const std::string text_path = flags.file.empty() ? DefaultStudyTextPath() : flags.file;
  if (text_path.empty()) {
    return Status::Error("no text given and .deps/corpus/test.txt was not found; pass -f FILE");
  }
  KVQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(text_path));
  KVQ_ASSIGN_OR_RETURN(PlanModel plan, LoadPlanModel(model_path));
  const ModelConfig& c = plan.config;
  const KvShape shape = PlanKvShape(c);
  const std::string scheme_list = flags.schemes.empty() ? DefaultStudySchemes() : flags.schemes;
  KVQ_ASSIGN_OR_RETURN(std::vector<SchemeSpec> schemes, ParseSchemeList(scheme_list, shape));
  KVQ_ASSIGN_OR_RETURN(StudyOptions o, CoreStudyOptions(flags, c, std::move(schemes), text_path));

  KVQ_RETURN_IF_ERROR(CheckFits(model_path, o.schemes, o.capture_tokens));
  KVQ_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(model_path, o.threads));
  o.model_path = loaded.path;
  KVQ_RETURN_IF_ERROR(ConfigureExtraStages(flags, loaded, model_path, o));
  std::fprintf(stderr,
               "kvq study: %s, text %s, %d threads, --ctx %lld x %lld windows, capture %lld "
               "tokens, %zu schemes%s%s%s%s%s\n",
               loaded.path.c_str(), text_path.c_str(), o.threads, (long long)o.context,
               (long long)o.chunks, (long long)o.capture_tokens, o.schemes.size(),
               o.quick ? " (--quick)" : "", o.core ? "" : " (no core stages)",
               o.needle.run ? (", needle stage in " + o.needle.dir).c_str() : "",
               o.gsm8k.run ? (", GSM8K stage in " + o.gsm8k.dir).c_str() : "",
               o.context_kl.run ? (", context-KL stage in " + o.context_kl.dir).c_str() : "");
  Progress progress;
  auto result = RunStudy(loaded, text, o, [&](const StudyEvent& e) { progress(e); });
  progress.Done();
  if (!result.ok()) return result.status();
  PrintStudyTables(*result);
  KVQ_RETURN_IF_ERROR(WriteTextFile(json_path, result->dump(1) + "\n"));
  std::printf("json: %s\n", json_path.c_str());
  if (!flags.dump.empty()) std::printf("dump: %s\n", flags.dump.c_str());
  return result;
}

// study.json -> study-<model>.json for one of several models.
std::string JsonPathFor(const std::string& json, const std::string& model, size_t index) {
  std::filesystem::path p(json);
  std::string name = std::filesystem::path(model).filename().string();
  if (name.empty()) name = "model" + std::to_string(index + 1);
  return (p.parent_path() /
          (p.stem().string() + "-" + ResultFileStem(name) + p.extension().string()))
      .string();
}

int RunStudyCommand(const StudyFlags& flags) {
  std::vector<nlohmann::json> studies;
  if (!flags.compare.empty()) {
    if (!flags.models.empty())
      return CommandError("study", "--compare reads study JSONs: no -m with it");
    if (flags.report.empty()) return CommandError("study", "--compare needs --report OUT.html");
    for (const std::string& path : flags.compare) {
      auto study = LoadStudy(path);
      if (!study.ok()) return CommandError("study", study.status().message());
      studies.push_back(std::move(study).value());
    }
  } else {
    std::vector<std::string> models = flags.models;
    if (models.empty()) {
      const std::string path = DefaultModelPath();
      if (path.empty())
        return CommandError("study", "no model given and the default model was not found; pass -m");
      models.push_back(path);
    }
    for (size_t i = 0; i < models.size(); ++i) {
      const std::string json =
          models.size() == 1 ? flags.json : JsonPathFor(flags.json, models[i], i);
      auto result = RunOneStudy(flags, models[i], json);
      if (!result.ok()) return CommandError("study", models[i] + ": " + result.status().message());
      studies.push_back(std::move(result).value());
    }
  }
  if (!flags.report.empty()) {
    Status st = studies.size() == 1 ? WriteStudyReport(studies[0], flags.report)
                                    : WriteComparisonReport(studies, flags.report);
    if (!st.ok()) return CommandError("study", st.message());
    std::printf("report: %s\n", flags.report.c_str());
  }
  return 0;
}

// The stages every study runs: what to study, the windows, recall, outputs.
// What `kvq study --help` says the stages do.
constexpr const char* kStudyFooter =
    "Stages: (1) capture q, K pre/post RoPE, V of the first --capture tokens (f32 cache);\n"
    "(2) per-channel mean |x| and outlier channels (> 4x the head's median), attention-sink\n"
    "mass; (3) fake quantization at 2 and 4 bits: the write-up's fake_quant as written\n"
    "(symmetric, 2^(b+1) levels, per-channel over the whole sequence, per-token over the head\n"
    "vector), the corrected b-bit quantizers (asymmetric, 2^b levels, KIVI's groups of 32) and\n"
    "the same with K quantized before RoPE, scored by relative score error, attention KL and\n"
    "output error;\n"
    "(4) each --schemes entry as a real cache: perplexity (kvq perplexity convention), KL and\n"
    "top-1 vs the f16 cache, passkey recall at several contexts and depths, bytes per token;\n"
    "kvquant* schemes are calibrated first (kvq calibrate's q2 weights) unless "
    "--kv-calibration.\n"
    "Scheme specs: TYPE (any --kv-cache-dtype), KTYPE/VTYPE (f16/int4), suffix +rot,\n"
    "policy:FILE (a --kv-policy file, e.g. from kvq tune).\n"
    "--dump FILE tensors (F32): layers.{L}.q [tokens, heads, head_dim],\n"
    "layers.{L}.k_pre_rope / k_post_rope / v [tokens, kv_heads, head_dim], token_ids [tokens].";

void AddCoreStudyOptions(CLI::App* cmd, StudyFlags* flags) {
  cmd->footer(kStudyFooter);
  // Repeatable, unlike AddModelOption's single -m; the same resolver (hub
  // ids) applies to each.
  cmd->add_option("-m,--model", flags->models,
                  "GGUF file, Hugging Face folder or cached hub id (default: the shipped "
                  "model); repeat -m to study several models: one JSON each "
                  "(study-<model>.json) and one report putting them side by side")
      ->transform(ModelArgResolver());
  cmd->add_option("--compare", flags->compare,
                  "Study JSONs or study directories (comma-separated; a directory is its "
                  "study.json with the long stages' needle.json, gsm8k.json, context_kl.json) "
                  "to put side by side in --report; runs nothing")
      ->delimiter(',');
  cmd->add_option("-f,--file", flags->file,
                  "Held-out text (default: .deps/corpus/test.txt when present)");
  cmd->add_option("--schemes", flags->schemes,
                  "Comma-separated KV cache specs (default: " + DefaultStudySchemes() + ")");
  cmd->add_flag("--quick", flags->quick,
                "Small run for CI: --ctx 256, 2 windows, recall at 1 context x 3 depths x 1 trial");
  cmd->add_option("-c,--ctx", flags->context,
                  "Perplexity window in tokens, even (default min(model context, 1024); 256 "
                  "with --quick)");
  cmd->add_option("--chunks", flags->chunks,
                  "Perplexity windows to score (default 2; 0 = the whole text)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--capture", flags->capture,
                  "Tokens captured for outliers and fake quantization (default: --ctx, at most "
                  "512)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("-b,--batch", flags->batch, "Tokens per forward call (default 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--recall-contexts", flags->recall_contexts,
                  "Passkey context lengths (default C/4 with C = min(model context, 2048))")
      ->delimiter(',');
  cmd->add_option("--recall-depths", flags->recall_depths,
                  "Passkey depths in [0, 1] (default 0,0.5,1)")
      ->delimiter(',')
      ->check(FiniteRange(0, 1));
  cmd->add_option("--recall-trials", flags->recall_trials,
                  "Passkey trials per (context, depth) (default 1)")
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
                  "KVQuant calibration tokens, in windows of 512 (default 2048; 1024 with --quick)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--full", flags->full,
                "The long, resumable run: also needle in a haystack (every task at 1K-4K and, "
                "for the tasks f16 passes there, 8K; within the model's context; 5 depths, 20 "
                "trials), GSM8K (250 problems) and "
                "context KL (512 to the model's context); "
                "results kept in --results-dir, a rerun continues where it stopped");
  cmd->add_flag("--niah", flags->niah,
                "Also the needle-in-a-haystack stage (default single_repeat,multikey_repeat at "
                "1K/2K, 5 depths, 4 trials)");
  cmd->add_flag("--no-core", flags->no_core,
                "Skip capture, outliers, fake quantization and end to end (only the stages "
                "asked for with --niah/--gsm8k-problems/--context-kl/--full)");
}

// The long, resumable stages: needle in a haystack, GSM8K, KL by context length.
void AddLongStageOptions(CLI::App* cmd, StudyFlags* flags) {
  cmd->add_option("--results-dir", flags->results_dir,
                  "Where the needle, GSM8K and context-KL results are appended (default "
                  "kvq-study-results/<model>); rerun with the same one to resume. Given (or "
                  "with --full), the end-to-end schemes are recorded there too and a rerun "
                  "runs only the missing ones");
  cmd->add_option("--chat", flags->chat,
                  "Chat template for needle/GSM8K prompts: auto (when the model has one), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--niah-tasks", flags->niah_tasks, "Needle tasks, of " + AllNeedleTasks());
  cmd->add_option("--niah-contexts", flags->niah_contexts,
                  "Needle context lengths (prompt + answer; default 1024,2048 and with --full "
                  "4096, within the model's context)")
      ->delimiter(',');
  cmd->add_option("--niah-extend-contexts", flags->niah_extend_contexts,
                  "Longer needle contexts, ascending, that f16 runs only for the tasks it passes "
                  "at every shorter context (each task's longest passing length, without long "
                  "prompts for tasks the model already fails; default with --full and no "
                  "--niah-contexts: 8192 within the model's context)")
      ->delimiter(',');
  cmd->add_option("--niah-depths", flags->niah_depths,
                  "Needle depths in [0, 1] (default 0,0.25,0.5,0.75,1)")
      ->delimiter(',')
      ->check(FiniteRange(0, 1));
  cmd->add_option("--niah-trials", flags->niah_trials,
                  "Needle trials per (task, context, depth) (default 4; 20 with --full)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--niah-schemes", flags->niah_schemes,
                  std::string("Needle schemes (default ") + kDefaultNeedleSchemes + ")");
  cmd->add_option("--gsm8k", flags->gsm8k_data,
                  "GSM8K test.jsonl (default ../shared/data/gsm8k/test.jsonl beside the source "
                  "tree; its SHA256SUMS is checked when present)");
  cmd->add_option("--gsm8k-problems", flags->gsm8k_problems,
                  "Run the GSM8K stage on the first N problems (250 with --full)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--gsm8k-schemes", flags->gsm8k_schemes,
                  std::string("GSM8K schemes (default ") + kDefaultGsm8kSchemes + ")");
  cmd->add_option("--gsm8k-max-tokens", flags->gsm8k_max_tokens,
                  "Tokens generated per GSM8K answer at most (default 512: at 320 half of "
                  "Qwen2.5-Coder-1.5B's worked answers were cut short)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--gsm8k-batch", flags->gsm8k_batch,
                  "GSM8K answers decoding together, one forward call per step (default 32; "
                  "each answer is the one decoded alone, so a run may resume with another)")
      ->check(CLI::Range(int64_t{1}, PrefixRunner::kMaxBatch));
  cmd->add_flag("--context-kl", flags->context_kl,
                "Also KL vs f16 by context length (windows of 512..4096 within the model's "
                "context; with --full up to the model's context), resumable in --results-dir");
  cmd->add_option("--context-kl-lengths", flags->context_kl_lengths,
                  "Context-KL window lengths (even; implies --context-kl)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  cmd->add_option("--context-kl-schemes", flags->context_kl_schemes,
                  std::string("Context-KL schemes (default ") + kDefaultContextKlSchemes + ")");
  cmd->add_option("--context-kl-positions", flags->context_kl_positions,
                  "Scored positions per context-KL length (default 2048; windows of L score L/2-1 "
                  "each)")
      ->check(CLI::PositiveNumber);
}

}  // namespace

void RegisterStudyCommand(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<StudyFlags>();
  CLI::App* cmd =
      app.add_subcommand("study",
                         "Which KV-cache scheme can this model afford? Outliers, fake-quant error, "
                         "perplexity/KL/recall per scheme, bytes; table + JSON (+ HTML report)");
  AddCoreStudyOptions(cmd, flags.get());
  AddLongStageOptions(cmd, flags.get());
  cmd->callback([flags, &ctx] { ctx.exit_code = RunStudyCommand(*flags); });
}

}  // namespace kvq
