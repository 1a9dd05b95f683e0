// kvq perplexity: perplexity of a text with the KV cache in use, and KL
// divergence against a saved baseline run (eval/perplexity.h has the
// convention, eval/logits_file.h the file format).
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "base/threads.h"
#include "engine/loaded_model.h"
#include "eval/perplexity.h"
#include "eval/planner.h"
#include "io/mapped_file.h"
#include "kv/kv_factory.h"
#include "tools/commands.h"
#include "tools/kv_flags.h"
#include "tools/model_arg.h"

namespace kvq {
namespace {

struct PerplexityFlags {
  std::string model;
  std::string file;
  int64_t context = 512;
  int64_t batch = 512;
  int64_t chunks = 0;
  int threads = 0;
  std::string save_logits;
  bool save_logits_f32 = false;
  std::string logits_format = "kvq";
  std::string kl_divergence;
  KvFlags kv;
};

// Progress on stderr: a terminal gets one updating line; a log gets a line per
// window and, inside windows (a 32K one takes an hour on one thread), one a
// minute.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool live) : live_(live) {}
  void operator()(const PerplexityProgress& p) {
    if (!p.window_done) {
      if (!live_ && p.seconds - last_line_ < 60) return;
      std::fprintf(stderr,
                   live_ ? "\r\033[K[%lld/%lld] %lld/%lld tokens fed, %.1f s"
                         : "[%lld/%lld] %lld/%lld tokens fed, %.1f s\n",
                   (long long)p.window, (long long)p.windows, (long long)p.tokens_fed,
                   (long long)p.tokens_total, p.seconds);
    } else if (live_) {
      std::fprintf(stderr, "\r\033[K[%lld/%lld] PPL %.4f (window %.4f), %lld tokens scored, %.1f s",
                   (long long)p.window, (long long)p.windows, p.running_ppl, p.window_ppl,
                   (long long)p.tokens_scored, p.seconds);
      if (p.window == p.windows) std::fputc('\n', stderr);
    } else {
      const double tps = p.seconds > 0 ? p.tokens_scored / p.seconds : 0;
      std::fprintf(stderr, "[%lld/%lld] PPL %.4f (window %.4f), %.1f s, %.1f scored tokens/s\n",
                   (long long)p.window, (long long)p.windows, p.running_ppl, p.window_ppl,
                   p.seconds, tps);
    }
    last_line_ = p.seconds;
    std::fflush(stderr);
  }

 private:
  bool live_;
  double last_line_ = 0;  // seconds
};

int RunPerplexityCommand(const PerplexityFlags& flags) {
  auto text = ReadTextFile(flags.file);
  if (!text.ok()) return CommandError("perplexity", text.status().message());
  const int threads = flags.threads > 0 ? flags.threads : AvailableThreads();
  auto loaded = LoadModel(flags.model, threads);
  if (!loaded.ok()) return CommandError("perplexity", loaded.status().message());
  auto options = KvFlagsToOptions(flags.kv, flags.context, loaded->transformer->pool());
  if (!options.ok()) return CommandError("perplexity", options.status().message());
  const KvShape shape = loaded->transformer->kv_shape();
  auto plan = PlanKvType(shape, *options);
  if (!plan.ok()) return CommandError("perplexity", plan.status().message());
  auto cache = MakeKvCache(shape, *options);
  if (!cache.ok()) return CommandError("perplexity", cache.status().message());

  PerplexityOptions popts;
  popts.context = flags.context;
  popts.batch = flags.batch;
  popts.max_windows = flags.chunks;
  popts.save_logits_path = flags.save_logits;
  popts.save_logits_f32 = flags.save_logits_f32;
  popts.save_logits_format =
      flags.logits_format == "llama" ? LogitsFormat::kLlamaCpp : LogitsFormat::kKvq;
  popts.kl_base_path = flags.kl_divergence;
  std::fprintf(stderr,
               "kvq perplexity: %s, %d threads, KV cache K %s / V %s%s (%.1f bytes/token), "
               "--ctx %lld, scoring the second half of each window\n",
               loaded->path.c_str(), threads, options->k_type.c_str(), options->v_type.c_str(),
               options->rotate ? " rotated" : "", plan->layout.BytesPerToken(),
               (long long)flags.context);
  const bool live = isatty(STDERR_FILENO) != 0;
  ProgressPrinter on_progress(live);
  auto result = RunPerplexity(*loaded, **cache, *text, popts, on_progress);
  if (!result.ok()) {
    if (live) std::fputc('\n', stderr);
    return CommandError("perplexity", result.status().message());
  }
  const PerplexityResult& r = *result;
  std::printf(
      "text:        %s, %lld tokens%s\n", flags.file.c_str(), (long long)r.text_tokens,
      r.bos_per_window ? " (BOS at the start of each window)" : " (no BOS: model adds none)");
  std::printf("windows:     %lld of %lld tokens, %lld scored (rows %lld..%lld of each window)\n",
              (long long)r.windows, (long long)flags.context, (long long)r.tokens_scored,
              (long long)(flags.context / 2), (long long)(flags.context - 2));
  std::printf("PPL:         %.4f +/- %.5f  (mean NLL %.6f)\n", r.ppl, r.ppl_error, r.mean_nll);
  std::printf("time:        %.2f s, %.1f tokens/s through the model, %.1f scored tokens/s\n",
              r.seconds, r.seconds > 0 ? r.tokens_processed / r.seconds : 0.0,
              r.seconds > 0 ? r.tokens_scored / r.seconds : 0.0);
  if (!flags.save_logits.empty()) {
    std::printf("saved:       log-probs of %lld positions to %s (%s)\n", (long long)r.tokens_scored,
                flags.save_logits.c_str(),
                flags.logits_format == "llama" ? "llama.cpp format"
                : flags.save_logits_f32        ? "f32"
                                               : "f16");
  }
  if (r.kl) {
    const KlStats& k = *r.kl;
    std::printf("KL vs base:  %s\n", flags.kl_divergence.c_str());
    std::printf("  PPL(base)   %.4f +/- %.5f\n", k.base_ppl, k.base_ppl_error);
    std::printf("  PPL(this)   %.4f +/- %.5f\n", r.ppl, r.ppl_error);
    std::printf("  mean KLD    %.4e +/- %.4e  (KL(base || this), nats, %lld positions)\n", k.mean,
                k.mean_error, (long long)k.positions);
    std::printf("  max KLD     %.4e\n  99%% KLD     %.4e\n  median KLD  %.4e\n  min KLD     %.4e\n",
                k.max, k.p99, k.median, k.min);
    std::printf("  same top-1  %.3f +/- %.3f %%\n", k.top1_percent, k.top1_error);
  }
  return 0;
}

}  // namespace

void RegisterPerplexityCommand(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<PerplexityFlags>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity", "Perplexity of a text with the KV cache in use; KL divergence vs a baseline");
  cmd->footer(
      "Convention (llama.cpp's llama-perplexity): the text is tokenized once and cut into\n"
      "non-overlapping windows of --ctx tokens (a partial last window is dropped). Each window\n"
      "is a fresh sequence in the KV cache; when the model adds BOS, BOS replaces the window's\n"
      "first token. The first half of a window is context only: logit rows ctx/2 .. ctx-2\n"
      "are scored against the next token, ctx/2 - 1 tokens per window. PPL = exp(mean NLL),\n"
      "error = PPL * sqrt(var(NLL) / (n - 1)). --kl-divergence reports KL(base || this).");
  AddModelOption(*cmd, &flags->model);
  cmd->add_option("-f,--file", flags->file, "Text file to score")->required();
  cmd->add_option("-c,--ctx", flags->context,
                  "Window length in tokens, even; the second half is scored (default 512)");
  cmd->add_option("-b,--batch", flags->batch,
                  "Tokens per forward call within a window (default 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--chunks", flags->chunks, "Score at most this many windows (default: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("-t,--threads", flags->threads, "Threads (default: all cores)")
      ->check(ThreadsCheck());
  cmd->add_option("--save-logits", flags->save_logits,
                  "Write the scored positions' log-probs here (a baseline for --kl-divergence)");
  cmd->add_flag("--save-logits-f32", flags->save_logits_f32,
                "Store log-probs as f32 (twice the size; default f16). f16 storage alone adds a "
                "KL of ~1e-6 nats: use f32 to compare near-lossless caches such as f16");
  cmd->add_option("--logits-format", flags->logits_format,
                  "Format of --save-logits: kvq (default) or llama, the file llama-perplexity "
                  "--kl-divergence-base writes and reads (16-bit log-probs within 16 nats of the "
                  "top one)")
      ->check(CLI::IsMember({"kvq", "llama"}));
  cmd->add_option("--kl-divergence", flags->kl_divergence,
                  "Compare against a baseline: a kvq --save-logits file or llama-perplexity's "
                  "--kl-divergence-base file (told apart by magic). Prints KL(base || this) and "
                  "top-1 agreement");
  AddKvCacheFlags(*cmd, &flags->kv);
  cmd->callback([flags, &ctx] { ctx.exit_code = RunPerplexityCommand(*flags); });
}

}  // namespace kvq
