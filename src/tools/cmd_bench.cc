// kvq bench: llama-bench-style throughput table (pp = prefill, tg = decode).
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "base/threads.h"
#include "engine/bench.h"
#include "engine/loaded_model.h"
#include "kv/kv_factory.h"
#include "model/model_files.h"
#include "tools/commands.h"
#include "tools/kv_flags.h"
#include "tools/model_arg.h"

namespace kvq {
namespace {

struct BenchFlags {
  std::string model;
  std::vector<int64_t> prompt_tokens{512};
  std::vector<int64_t> gen_tokens{128};
  std::vector<int64_t> depths{0};
  int repetitions = 5;
  int threads = 0;
  int poll_us = 0;  // set by AddPollFlag
  bool exact_matvec = false;
  KvFlags kv;
};

int RunBenchCommand(const BenchFlags& flags) {
  const int threads = flags.threads > 0 ? flags.threads : AvailableThreads();
  auto loaded =
      LoadModel(flags.model, threads,
                flags.exact_matvec ? ops::DecodeArith::kExactF32 : ops::DecodeArith::kInt8Dot);
  if (!loaded.ok()) {
    return CommandError("bench", loaded.status().message());
  }
  Transformer& model = *loaded->transformer;
  model.pool()->SetPollMicros(flags.poll_us);
  // Every test size runs at every depth, so the longest sequence is the
  // deepest depth plus the largest test.
  int64_t max_depth = 0, max_test = 0;
  for (int64_t d : flags.depths) max_depth = std::max(max_depth, d);
  for (int64_t n : flags.prompt_tokens) max_test = std::max(max_test, n);
  for (int64_t n : flags.gen_tokens) max_test = std::max(max_test, n);
  const int64_t max_context = max_depth + max_test;
  const KvShape shape = model.kv_shape();
  auto kv_options = KvFlagsToOptions(flags.kv, max_context, model.pool());
  if (!kv_options.ok()) {
    return CommandError("bench", kv_options.status().message());
  }
  if (kv_options->memory_bytes == 0) {  // no --kv-memory: the depth plus one run's fork
    auto layout = ComputeKvLayout(shape, *kv_options);
    if (!layout.ok()) {
      return CommandError("bench", layout.status().message());
    }
    kv_options->memory_bytes = BenchKvBytes(*layout, max_context, max_depth, max_test);
  }
  // Fail on a bad type or budget before the first test, not inside it.
  auto probe = MakeKvCache(shape, *kv_options);
  if (!probe.ok()) {
    return CommandError("bench", probe.status().message());
  }
  const std::string type_kv = (*probe)->TypeName();
  probe = Status::Error("released");

  const double size_gib = static_cast<double>(model.WeightBytesPerToken()) / (1 << 30);
  const double params_b = static_cast<double>(CountParameters(model.files().tensors)) / 1e9;
  std::printf("| model | size | params | backend | threads | type_kv | test | t/s |\n");
  std::printf("| --- | ---: | ---: | --- | ---: | --- | ---: | ---: |\n");
  for (int64_t d : flags.depths) {
    std::vector<BenchTest> tests;
    for (int64_t n : flags.prompt_tokens) {
      if (n > 0) tests.push_back({BenchTest::Kind::kPrefill, n, d});
    }
    for (int64_t n : flags.gen_tokens) {
      if (n > 0) tests.push_back({BenchTest::Kind::kGenerate, n, d});
    }
    // One cache per depth: its depth sequence is filled once and forked per run.
    auto cache = MakeKvCache(shape, *kv_options);
    if (!cache.ok()) {
      return CommandError("bench", cache.status().message());
    }
    const SeqId depth_seq = 0;
    if (Status filled = FillDepth(model, **cache, depth_seq, d); !filled.ok()) {
      std::fprintf(stderr, "kvq bench: filling depth %lld: %s\n", static_cast<long long>(d),
                   filled.message().c_str());
      return 1;
    }
    for (const BenchTest& test : tests) {
      auto result = RunBench(model, **cache, depth_seq, test, flags.repetitions);
      if (!result.ok()) {
        std::fprintf(stderr, "kvq bench: %s: %s\n", test.Name().c_str(),
                     result.status().message().c_str());
        return 1;
      }
      std::printf("| %s %s | %.2f GiB | %.2f B | kvq CPU | %d | %s | %s | %.2f ± %.2f |\n",
                  ArchitectureName(model.config().arch), model.files().source.c_str(), size_gib,
                  params_b, threads, type_kv.c_str(), test.Name().c_str(), result->Mean(),
                  result->StdDev());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

void RegisterBenchCommand(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench", "Prefill/decode throughput, llama-bench style");
  AddModelOption(*cmd, &flags->model);
  cmd->add_option("-p,--n-prompt", flags->prompt_tokens,
                  "Prefill test sizes in tokens, comma-separated (default 512)")
      ->delimiter(',');
  cmd->add_option("-n,--n-gen", flags->gen_tokens,
                  "Decode test sizes in tokens, comma-separated (default 128)")
      ->delimiter(',');
  cmd->add_option("-d,--depth", flags->depths,
                  "Tokens already in the cache before each test, comma-separated (default 0)")
      ->delimiter(',');
  cmd->add_option("-r,--repetitions", flags->repetitions, "Timed runs per test (default 5)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("-t,--threads", flags->threads, "Threads (default: all cores)")
      ->check(ThreadsCheck());
  AddPollFlag(*cmd, &flags->poll_us);
  cmd->add_flag("--exact-matvec", flags->exact_matvec,
                "Decode block-quantized weights against f32 activations (exact) instead of "
                "llama.cpp's 8-bit activations and integer dot products");
  AddKvCacheFlags(*cmd, &flags->kv);
  cmd->callback([flags, &ctx] { ctx.exit_code = RunBenchCommand(*flags); });
}

}  // namespace kvq
