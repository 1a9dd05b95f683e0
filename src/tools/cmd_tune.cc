// kvq tune: per-layer K/V cache types that minimize bytes per token under a
// KL-divergence budget on calibration text; writes a --kv-policy file and
// prints the frontier it explored (eval/tune.h has the search).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/threads.h"
#include "engine/loaded_model.h"
#include "eval/kv_export.h"
#include "eval/tune.h"
#include "io/mapped_file.h"
#include "tools/commands.h"
#include "tools/kv_flags.h"
#include "tools/model_arg.h"

namespace kvq {
namespace {

struct TuneFlags {
  std::string model;
  std::string file;
  std::string output = "kv-policy.txt";
  double kl_budget = 0.01;
  int64_t context = 512;
  int64_t windows = 4;
  std::string k_candidates = "f16,int8,int4-c32-asym-r128,int2-c32-asym-r128";
  std::string v_candidates = "f16,int8,int4-g32-asym-r128,int2-g32-asym-r128";
  int threads = 0;
  std::string calibration;  // --kv-calibration (nuq*, oscar-int2, fp8_e4m3-tcal candidates)
  std::string command;
  std::vector<std::string> export_args;  // --export STACK FILE
  std::string scales;                    // --export-scales FILE (vllm)
};

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

// The frontier tune explored and the policy it chose.
void PrintFrontier(const TuneFlags& flags, const std::string& model_path, const TuneResult& r) {
  std::printf("model:     %s\ncalibration: %s, %lld windows of %lld tokens, f16 PPL %.4f\n",
              model_path.c_str(), flags.file.c_str(), (long long)flags.windows,
              (long long)flags.context, r.baseline_ppl);
  std::printf("budget:    mean KL(f16 || policy) <= %g nats/token\n\n", flags.kl_budget);
  std::printf("frontier explored (%lld runs, %.1f s):\n", (long long)r.evaluations, r.seconds);
  std::printf("  %10s %8s %12s %12s %8s  %s\n", "B/token", "vs f16", "KL predicted", "KL measured",
              "top-1 %", "step");
  for (const TunePoint& p : r.frontier) {
    char measured[32] = "-", top1[32] = "-";
    if (p.measured_kl >= 0) {
      std::snprintf(measured, sizeof(measured), "%.3e", p.measured_kl);
      std::snprintf(top1, sizeof(top1), "%.2f", p.top1_percent);
    }
    std::printf("  %10.1f %7.2fx %12.3e %12s %8s  %s%s\n", p.bytes_per_token,
                r.f16_bytes_per_token / p.bytes_per_token, p.predicted_kl, measured, top1,
                p.step.c_str(),
                p.measured_kl < 0 ? " (skipped)" : (p.accepted ? "" : " (over budget)"));
  }
  std::printf(
      "\nbest:      %.1f B/token (%.2fx smaller than f16), measured KL %.3e, top-1 %.2f%%\n",
      r.best.bytes_per_token, r.f16_bytes_per_token / r.best.bytes_per_token, r.best.measured_kl,
      r.best.top1_percent);
}

// --export hf|vllm FILE: the policy in the peer's cache configuration.
int ExportPolicy(const TuneFlags& flags, const LoadedModel& loaded, const std::string& policy) {
  KvExportInput in;
  in.policy = policy;
  in.num_layers = loaded.transformer->kv_shape().num_layers;
  in.model = loaded.path;
  in.command = flags.command;
  const bool hf = flags.export_args[0] == "hf";
  auto json = hf ? HfCacheExportJson(in) : VllmCacheExportJson(in, flags.scales);
  if (!json.ok()) return CommandError("tune", json.status().message());
  const Status written = WriteTextFile(flags.export_args[1], *json);
  if (!written.ok()) return CommandError("tune", written.message());
  std::printf("export:    %s (%s)\n", flags.export_args[1].c_str(),
              hf ? "transformers QuantizedCacheConfig" : "vLLM --kv-cache-dtype");
  return 0;
}

int RunTuneCommand(const TuneFlags& flags) {
  auto text = ReadTextFile(flags.file);
  if (!text.ok()) return CommandError("tune", text.status().message());
  const int threads = flags.threads > 0 ? flags.threads : AvailableThreads();
  auto loaded = LoadModel(flags.model, threads);
  if (!loaded.ok()) return CommandError("tune", loaded.status().message());
  const int64_t model_context = loaded->transformer->config().max_position_embeddings;
  if (flags.context < 4 || flags.context % 2 != 0 || flags.context > model_context) {
    return CommandError("tune", "--ctx " + std::to_string(flags.context) +
                                    ": need an even number in [4, " +
                                    std::to_string(model_context) + "] (the model's context)");
  }
  TuneOptions options;
  options.k_candidates = SplitList(flags.k_candidates);
  options.v_candidates = SplitList(flags.v_candidates);
  options.kl_budget = flags.kl_budget;
  options.context = flags.context;
  options.windows = flags.windows;
  options.cache.pool = loaded->transformer->pool();
  options.cache.calibration_path = flags.calibration;
  std::error_code ec;
  const std::filesystem::path work =
      std::filesystem::temp_directory_path(ec) / ("kvq-tune-" + std::to_string(getpid()));
  std::filesystem::create_directories(work, ec);
  if (ec) return CommandError("tune", "cannot create a temporary folder: " + ec.message());
  options.work_dir = work.string();
  const bool live = isatty(STDERR_FILENO) != 0;
  auto progress = [live](const std::string& line) {
    std::fprintf(stderr, live ? "\r\033[K%s" : "%s\n", line.c_str());
    std::fflush(stderr);
  };
  auto result = RunTune(*loaded, *text, options, progress);
  std::filesystem::remove_all(work, ec);
  if (live) std::fputc('\n', stderr);
  if (!result.ok()) return CommandError("tune", result.status().message());
  const TuneResult& r = *result;

  PrintFrontier(flags, loaded->path, r);
  std::ostringstream policy;
  policy << "# kvq tune policy (use with --kv-policy " << flags.output << ")\n"
         << "# " << flags.command << "\n"
         << "# budget mean KL <= " << flags.kl_budget << "; measured KL " << r.best.measured_kl
         << ", " << r.best.bytes_per_token << " B/token (f16 " << r.f16_bytes_per_token << ")\n"
         << r.best.policy;
  const Status written = WriteTextFile(flags.output, policy.str());
  if (!written.ok()) return CommandError("tune", written.message());
  std::printf("policy:    %s\n%s", flags.output.c_str(), r.best.policy.c_str());
  if (flags.export_args.empty()) return 0;
  return ExportPolicy(flags, *loaded, r.best.policy);
}

}  // namespace

void RegisterTuneCommand(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<TuneFlags>();
  CLI::App* cmd = app.add_subcommand(
      "tune",
      "Per-layer K/V cache types: fewest bytes under a KL budget; writes a --kv-policy file");
  cmd->footer(
      "Search: the f16 cache's log-probs on the calibration windows are the baseline; each\n"
      "(layer, K or V, candidate) is measured alone (sensitivity); then a greedy descent takes\n"
      "the step down with the least predicted KL per byte saved (KL summed over the steps),\n"
      "measures it, keeps it if the measured KL fits the budget, else freezes that layer's K or\n"
      "V. Bytes per token are the blocks' (scales included); per-sequence f16 windows of\n"
      "residual schemes are a constant on top (see kvq plan).");
  AddModelOption(*cmd, &flags->model);
  cmd->add_option("-f,--file", flags->file, "Calibration text")->required();
  cmd->add_option("-o,--output", flags->output, "Policy file to write (default kv-policy.txt)");
  cmd->add_option("--kl-budget", flags->kl_budget,
                  "Mean KL(f16 || policy) allowed, nats per token (default 0.01)")
      ->check(FiniteRange(1e-9, 1e3));
  cmd->add_option("-c,--ctx", flags->context, "Calibration window in tokens (default 512)")
      ->check(CLI::Range(int64_t{4}, int64_t{1} << 24));
  cmd->add_option("--windows", flags->windows, "Calibration windows (default 4)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--k-candidates", flags->k_candidates,
                  "K types, most precise first (default f16,int8,int4-c32-asym-r128,"
                  "int2-c32-asym-r128: KIVI's keys at 4 and 2 bits)");
  cmd->add_option("--v-candidates", flags->v_candidates,
                  "V types, most precise first (default f16,int8,int4-g32-asym-r128,"
                  "int2-g32-asym-r128: KIVI's values)");
  cmd->add_option("-t,--threads", flags->threads, "Threads (default: all cores)")
      ->check(ThreadsCheck());
  cmd->add_option("--kv-calibration", flags->calibration,
                  "Calibration file from `kvq calibrate`, for candidates that need one (nuq*, "
                  "oscar-int2, fp8_e4m3-tcal)")
      ->check(CLI::ExistingFile);
  auto* exp = cmd->add_option("--export", flags->export_args,
                              "STACK FILE: also write the chosen policy for another stack: hf "
                              "(transformers QuantizedCacheConfig JSON) or vllm (the "
                              "--kv-cache-dtype it maps to, JSON); docs/export.md")
                  ->expected(2);
  cmd->add_option("--export-scales", flags->scales,
                  "vllm: the k_scale/v_scale file (kvq calibrate --export vllm) to name")
      ->needs(exp);
  cmd->callback([flags, &ctx] {
    if (!flags->export_args.empty() && flags->export_args[0] != "hf" &&
        flags->export_args[0] != "vllm") {
      std::fprintf(stderr, "kvq tune: --export %s: the stacks are vllm and hf\n",
                   flags->export_args[0].c_str());
      ctx.exit_code = 1;
      return;
    }
    char budget[32];
    std::snprintf(budget, sizeof(budget), "%g", flags->kl_budget);
    flags->command = "kvq tune" + (flags->model.empty() ? "" : " -m " + flags->model) + " -f " +
                     flags->file + " --kl-budget " + budget + " --ctx " +
                     std::to_string(flags->context) + " --windows " +
                     std::to_string(flags->windows) + " --k-candidates " + flags->k_candidates +
                     " --v-candidates " + flags->v_candidates +
                     (flags->calibration.empty() ? "" : " --kv-calibration " + flags->calibration);
    ctx.exit_code = RunTuneCommand(*flags);
  });
}

}  // namespace kvq
