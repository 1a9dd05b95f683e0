// kvq generate: stream a completion and report speed and memory figures.
#include <cstdio>
#include <string>

#include "base/threads.h"
#include "engine/generate.h"
#include "engine/loaded_model.h"
#include "eval/planner.h"
#include "kv/kv_factory.h"
#include "tools/commands.h"
#include "tools/kv_flags.h"
#include "tools/model_arg.h"

namespace kvq {
namespace {

struct GenerateFlags {
  std::string model;
  std::string prompt;
  int64_t max_new_tokens = 64;
  float temperature = 0.0f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  uint64_t seed = 0;
  bool chat = false;
  int threads = 0;
  int poll_us = 0;  // set by AddPollFlag
  int64_t context = 0;
  bool batch_invariant = false;
  int64_t prefill_chunk = kDefaultPrefillChunk;
  KvFlags kv;
};

int RunGenerate(const GenerateFlags& flags) {
  const int threads = flags.threads > 0 ? flags.threads : AvailableThreads();
  auto loaded = LoadModel(flags.model, threads);
  if (!loaded.ok()) {
    return CommandError("generate", loaded.status().message());
  }
  loaded->transformer->pool()->SetPollMicros(flags.poll_us);
  const ModelConfig& config = loaded->transformer->config();
  const int64_t context = flags.context > 0 ? flags.context : config.max_position_embeddings;
  auto kv_options = KvFlagsToOptions(flags.kv, context, loaded->transformer->pool());
  if (!kv_options.ok()) {
    return CommandError("generate", kv_options.status().message());
  }
  auto made = MakeKvCache(loaded->transformer->kv_shape(), *kv_options);
  if (!made.ok()) {
    return CommandError("generate", made.status().message());
  }
  std::unique_ptr<KvCache> cache = std::move(made).value();
  // What the planner predicts for this cache (kvq plan shows the details).
  auto kv_plan = PlanKvType(loaded->transformer->kv_shape(), *kv_options);
  if (!kv_plan.ok()) {
    return CommandError("generate", kv_plan.status().message());
  }

  GenerateOptions options;
  options.max_new_tokens = flags.max_new_tokens;
  options.chat = flags.chat;
  options.sampling.temperature = flags.temperature;
  options.sampling.top_k = flags.top_k;
  options.sampling.top_p = flags.top_p;
  options.sampling.seed = flags.seed;
  options.batch_invariant = flags.batch_invariant;
  options.prefill_chunk = flags.prefill_chunk;
  GenerateStats stats;
  if (!flags.chat) std::fputs(flags.prompt.c_str(), stdout);
  Status status = Generate(
      *loaded, *cache, flags.prompt, options,
      [](std::string_view text) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
      },
      &stats);
  std::fputs("\n", stdout);
  if (!status.ok()) {
    return CommandError("generate", status.message());
  }
  const double decode_steps = static_cast<double>(std::max<int64_t>(stats.generated_tokens - 1, 0));
  const double decode_tps = stats.decode_seconds > 0 ? decode_steps / stats.decode_seconds : 0;
  // Blocks still held at the end (Generate releases its sequence, so the
  // final byte count comes from its stats).
  const KvUsage usage = cache->Usage();
  const double bytes_per_token = stats.weight_bytes_per_token + stats.kv_bytes_per_token;
  std::fprintf(
      stderr,
      "\nkvq generate: %s, %d threads, KV cache %s\n"
      "  prefill: %lld tokens in %.3f s (%.1f tokens/s)\n"
      "  decode:  %lld tokens in %.3f s (%.1f tokens/s), stop: %s\n"
      "  bytes read per decoded token: %.2f MB (weights %.2f MB + KV %.3f MB)"
      " -> %.2f GB/s\n"
      "  KV cache at end: %.3f MB (%lld of %lld blocks of %zu bytes = %lld tokens each,"
      " %.1f bytes/token); peak RSS: %.1f MB\n",
      loaded->path.c_str(), threads, cache->TypeName(), static_cast<long long>(stats.prompt_tokens),
      stats.prefill_seconds,
      stats.prefill_seconds > 0 ? stats.prompt_tokens / stats.prefill_seconds : 0.0,
      static_cast<long long>(stats.generated_tokens), stats.decode_seconds, decode_tps,
      stats.stop_reason.c_str(), bytes_per_token / 1e6, stats.weight_bytes_per_token / 1e6,
      stats.kv_bytes_per_token / 1e6, bytes_per_token * decode_tps / 1e9,
      stats.kv_bytes_final / 1e6, static_cast<long long>(usage.blocks_used),
      static_cast<long long>(usage.blocks_total), usage.block_bytes,
      static_cast<long long>(usage.block_tokens),
      usage.block_tokens > 0 ? static_cast<double>(usage.block_bytes) / usage.block_tokens : 0.0,
      stats.peak_rss_bytes / 1e6);
  std::fprintf(stderr, "  KV plan (kvq plan): %.1f bytes/token exact, nominal %.1f\n",
               kv_plan->layout.BytesPerToken(), kv_plan->nominal_bytes_per_token);
  return 0;
}

}  // namespace

void RegisterGenerateCommand(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a prompt");
  AddModelOption(*cmd, &flags->model);
  cmd->add_option("-p,--prompt", flags->prompt, "Prompt text")->required();
  cmd->add_option("-n,--max-tokens", flags->max_new_tokens, "Tokens to generate (default 64)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--temp", flags->temperature, "Sampling temperature; 0 = greedy (default 0)")
      ->check(FiniteRange(0, 100));
  cmd->add_option("--top-k", flags->top_k, "Keep the k most likely tokens; 0 = all (default 40)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", flags->top_p, "Nucleus probability mass (default 0.95)")
      ->check(FiniteRange(0, 1));
  cmd->add_option("--seed", flags->seed, "Sampling seed (default 0)");
  cmd->add_flag("--chat", flags->chat, "Apply the model's chat template to the prompt");
  cmd->add_option("-t,--threads", flags->threads, "Threads (default: all cores)")
      ->check(ThreadsCheck());
  AddPollFlag(*cmd, &flags->poll_us);
  cmd->add_option("-c,--ctx", flags->context,
                  "Context length in tokens (default: the model's max_position_embeddings)")
      ->check(CLI::NonNegativeNumber);
  CLI::Option* invariant = cmd->add_flag(
      "--batch-invariant", flags->batch_invariant,
      "The arithmetic of kvq serve --batch-invariant (rowwise products, the prompt in chunks "
      "ending at multiples of --prefill-chunk), so the output is that server's");
  cmd->add_option("--prefill-chunk", flags->prefill_chunk,
                  "With --batch-invariant: prompt tokens per chunk (default 256, as kvq serve)")
      ->needs(invariant)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  AddKvCacheFlags(*cmd, &flags->kv);
  cmd->callback([flags, &ctx] { ctx.exit_code = RunGenerate(*flags); });
}

}  // namespace kvq
