// kvq serve: the OpenAI-compatible server (continuous batching over the
// paged, quantized KV cache). Flags follow vLLM's names where they exist.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "base/threads.h"
#include "engine/generate.h"
#include "engine/loaded_model.h"
#include "kv/kv_factory.h"
#include "server/api_key.h"
#include "server/engine_loop.h"
#include "server/http_server.h"
#include "server/scheduler.h"
#include "tools/commands.h"
#include "tools/kv_flags.h"
#include "tools/model_arg.h"

namespace kvq {
namespace {

struct ServeFlags {
  std::string model;
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string api_key_file;
  int64_t max_model_len = 0;
  int64_t max_num_seqs = 16;
  int64_t max_num_batched_tokens = 512;
  int64_t max_waiting = 64;
  int http_threads = 64;
  double shutdown_timeout = 30;
  int threads = 0;
  int poll_us = 0;  // set by AddPollFlag
  // vLLM's default. Costs a hash per full block; cached blocks no request
  // holds count as free and are evicted when needed, and greedy outputs
  // are the same (tests/server/scheduler_test.cc), so only sharing is
  // gained. Caches with f16 windows cannot share; the default then falls
  // back to off with a note, an explicit --enable-prefix-caching fails.
  bool enable_prefix_caching = true;
  bool prefix_caching_explicit = false;
  // Off by default, as in vLLM (VLLM_BATCH_INVARIANT): it costs speed.
  bool batch_invariant = false;
  int64_t prefill_chunk = kDefaultPrefillChunk;
  KvFlags kv;
};

// The drain a load balancer needs (docs/ARCHITECTURE.md, "Shutdown"): at
// once /health answers 503 and every new completion 503 + Connection: close
// (nginx's proxy_next_upstream http_503 sends it to another replica); what
// is running or queued finishes, streams included, for up to `timeout_s`;
// what is left then ends with an error event; every response gets its last
// bytes (up to kAnswerTime), then the listener stops and RunServe returns 0.
constexpr auto kAnswerTime = std::chrono::seconds(5);

void Drain(const char* signal_name, double timeout_s, HttpServer& http, EngineLoop& engine) {
  http.SetShuttingDown();
  engine.StopAccepting();
  std::fprintf(stderr, "kvq serve: %s: draining %lld open requests (up to %.0f s)\n", signal_name,
               static_cast<long long>(http.OpenRequests()), timeout_s);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  if (!engine.WaitIdle(timeout)) {
    std::fprintf(stderr, "kvq serve: timeout: cancelling the requests still running\n");
  }
  engine.Stop();
  if (!http.WaitRequestsAnswered(kAnswerTime)) {
    std::fprintf(stderr, "kvq serve: some responses were not fully sent in %lld s\n",
                 static_cast<long long>(kAnswerTime.count()));
  }
  http.Stop();
}

StatusOr<HttpServerOptions> MakeHttpOptions(const ServeFlags& flags, const std::string& path) {
  HttpServerOptions options;
  options.host = flags.host;
  options.port = flags.port;
  options.api_key = flags.api_key;
  if (!flags.api_key_file.empty()) {
    KVQ_ASSIGN_OR_RETURN(options.api_key, ReadApiKeyFile(flags.api_key_file));
  }
  options.http_threads = flags.http_threads;
  options.model_name = flags.served_model_name;
  if (options.model_name.empty()) {
    options.model_name = std::filesystem::path(path).filename().string();
    if (options.model_name.empty()) {
      options.model_name = std::filesystem::path(path).parent_path().filename();
    }
  }
  return options;
}

// Announces the port and serves until SIGTERM/SIGINT has been drained. The
// signal thread exists before the listening line, so a supervisor that
// signals as soon as it reads the line gets a drain: the signal is pending
// (blocked in every thread since RunServe's start) until sigtimedwait takes
// it, and a drain that ends before Listen starts makes Listen return at
// once. (A signal that arrives before RunServe, while the process starts,
// still has its default action.)
void ServeUntilSignalled(const sigset_t& signals, const ServeFlags& flags, int port,
                         HttpServer& http, EngineLoop& engine) {
  std::atomic<bool> listening_ended{false};
  std::thread signal_thread([&] {
    const timespec tick{0, 200 * 1000 * 1000};
    while (!listening_ended.load()) {
      const int sig = sigtimedwait(&signals, nullptr, &tick);
      if (sig != SIGTERM && sig != SIGINT) continue;
      Drain(sig == SIGTERM ? "SIGTERM" : "SIGINT", flags.shutdown_timeout, http, engine);
      return;
    }
  });
  // Scripts start the server on --port 0 and read the port from this line.
  std::printf("kvq serve: listening on http://%s:%d\n", flags.host.c_str(), port);
  std::fflush(stdout);
  http.Listen();
  listening_ended.store(true);
  signal_thread.join();
}

int RunServe(const ServeFlags& flags) {
  // SIGTERM/SIGINT are taken by one thread with sigwait; block them before
  // any other thread (the model's pool, HTTP, engine) exists so none receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a vanished client is a failed write, not a dead server

  const int threads = flags.threads > 0 ? flags.threads : AvailableThreads();
  auto loaded = LoadModel(flags.model, threads);
  if (!loaded.ok()) return CommandError("serve", loaded.status().message());
  loaded->transformer->pool()->SetPollMicros(flags.poll_us);
  const ModelConfig& config = loaded->transformer->config();
  int64_t max_model_len = config.max_position_embeddings;
  if (flags.max_model_len > 0) {
    if (flags.max_model_len > config.max_position_embeddings) {
      return CommandError("serve", "--max-model-len " + std::to_string(flags.max_model_len) +
                                       " exceeds the model's context of " +
                                       std::to_string(config.max_position_embeddings));
    }
    max_model_len = flags.max_model_len;
  }
  auto kv_options = KvFlagsToOptions(flags.kv, max_model_len, loaded->transformer->pool());
  if (!kv_options.ok()) return CommandError("serve", kv_options.status().message());
  auto cache = MakeKvCache(loaded->transformer->kv_shape(), *kv_options);
  if (!cache.ok()) return CommandError("serve", cache.status().message());

  SchedulerOptions scheduler_options;
  scheduler_options.max_num_seqs = flags.max_num_seqs;
  scheduler_options.max_num_batched_tokens = flags.max_num_batched_tokens;
  scheduler_options.max_model_len = max_model_len;
  scheduler_options.block_tokens = kv_options->block_tokens;
  scheduler_options.enable_prefix_caching = flags.enable_prefix_caching;
  scheduler_options.batch_invariant = flags.batch_invariant;
  scheduler_options.prefill_chunk = flags.prefill_chunk;
  auto scheduler =
      Scheduler::Create(*loaded->transformer, *loaded->tokenizer, **cache, scheduler_options);
  if (!scheduler.ok()) return CommandError("serve", scheduler.status().message());
  if (!(*scheduler)->prefix_caching_note().empty()) {
    if (flags.prefix_caching_explicit) {
      return CommandError("serve",
                          "--enable-prefix-caching: " + (*scheduler)->prefix_caching_note());
    }
    std::fprintf(stderr, "kvq serve: prefix caching off: %s\n",
                 (*scheduler)->prefix_caching_note().c_str());
  }
  const bool prefix_caching = (*scheduler)->prefix_caching();
  const std::string invariance =
      flags.batch_invariant
          ? ", batch-invariant (prefill chunks of " + std::to_string(flags.prefill_chunk) + ")"
          : "";
  EngineLoopOptions loop_options;
  loop_options.max_waiting = flags.max_waiting;
  EngineLoop engine(std::move(scheduler).value(), **cache, loop_options);

  auto http_options = MakeHttpOptions(flags, loaded->path);
  if (!http_options.ok()) return CommandError("serve", http_options.status().message());
  HttpServer http(*loaded, engine, *http_options);
  auto port = http.Bind();
  if (!port.ok()) return CommandError("serve", port.status().message());
  engine.Start();

  const KvUsage usage = (*cache)->Usage();
  std::fprintf(stderr,
               "kvq serve: model '%s' (%s), KV cache %s: %lld blocks of %lld tokens (%.1f MiB), "
               "%lld blocks per sequence for f16 windows, max-model-len %lld, max-num-seqs %lld, "
               "prefix caching %s%s\n",
               http_options->model_name.c_str(), loaded->path.c_str(), (*cache)->TypeName(),
               static_cast<long long>(usage.blocks_total),
               static_cast<long long>(usage.block_tokens),
               static_cast<double>(usage.bytes_reserved) / (1 << 20),
               static_cast<long long>(usage.sequence_blocks), static_cast<long long>(max_model_len),
               static_cast<long long>(flags.max_num_seqs), prefix_caching ? "on" : "off",
               invariance.c_str());
  ServeUntilSignalled(signals, flags, *port, http, engine);
  engine.Stop();
  std::fprintf(stderr, "kvq serve: stopped\n");
  return 0;
}

}  // namespace

void RegisterServeCommand(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* cmd =
      app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  AddModelOption(*cmd, &flags->model);
  cmd->add_option("--served-model-name", flags->served_model_name,
                  "Model id in the API (default: the model's file or folder name)");
  cmd->add_option("--host", flags->host, "Address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", flags->port, "Port; 0 = any free port, printed at start (default 8000)")
      ->check(CLI::Range(0, 65535));
  CLI::Option* key = cmd->add_option("--api-key", flags->api_key,
                                     "Require 'Authorization: Bearer KEY' on /v1/* (default: no "
                                     "key); visible to other users in ps: prefer --api-key-file");
  cmd->add_option("--api-key-file", flags->api_key_file,
                  "Read the API key from this file (one line), so it appears on no command line")
      ->excludes(key);
  cmd->add_option("--max-model-len", flags->max_model_len,
                  "Prompt + generated tokens per request (default: the model's context)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-num-seqs", flags->max_num_seqs,
                  "Sequences decoded together in one batch (default 16)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option(
         "--max-num-batched-tokens", flags->max_num_batched_tokens,
         "Tokens in one forward pass; longer prompts are prefilled in chunks (default 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--max-waiting", flags->max_waiting,
                  "Requests queued for admission before new ones get HTTP 429 (default 64); 0 = "
                  "no queue: a request is taken only when a batch slot is free and none waits")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--http-threads", flags->http_threads,
                  "Connections served at once; each open stream holds one (default 64)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--shutdown-timeout", flags->shutdown_timeout,
                  "Seconds SIGTERM waits for running requests before cancelling them (default 30)")
      ->check(FiniteRange(0, 3600));
  cmd->add_option("-t,--threads", flags->threads, "Threads for the model (default: all cores)")
      ->check(ThreadsCheck());
  AddPollFlag(*cmd, &flags->poll_us);
  CLI::Option* prefix = cmd->add_flag(
      "--enable-prefix-caching,!--no-enable-prefix-caching", flags->enable_prefix_caching,
      "Share the KV blocks of common prompt prefixes copy-on-write, vLLM's automatic prefix "
      "caching (default on; off by itself, with a note, for cache types with f16 windows)");
  CLI::Option* invariant = cmd->add_flag(
      "--batch-invariant", flags->batch_invariant,
      "Make each request's output, logprobs included, independent of the other requests "
      "(vLLM's VLLM_BATCH_INVARIANT): every row computed as it would be alone, prompts cut into "
      "chunks at fixed positions; slower (default off)");
  cmd->add_option("--prefill-chunk", flags->prefill_chunk,
                  "With --batch-invariant: prompt tokens per prefill chunk (default 256; at most "
                  "--max-num-batched-tokens minus --max-num-seqs)")
      ->needs(invariant)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  AddKvCacheFlags(*cmd, &flags->kv);
  cmd->callback([flags, prefix, &ctx] {
    flags->prefix_caching_explicit = prefix->count() > 0 && flags->enable_prefix_caching;
    ctx.exit_code = RunServe(*flags);
  });
}

}  // namespace kvq
