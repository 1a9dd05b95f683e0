// Throughput tests in llama-bench's vocabulary: ppN (prefill N tokens in one
// batch) and tgN (generate N tokens one at a time), each after `depth`
// tokens already in the cache, repeated to give mean ± sd tokens/s.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "kv/kv_cache.h"
#include "model/transformer.h"

namespace kvq {

struct BenchTest {
  enum class Kind { kPrefill, kGenerate } kind = Kind::kPrefill;
  int64_t tokens = 0;
  int64_t depth = 0;
  std::string Name() const;  // "pp512", "tg128", "pp512 @ d4096"
};

struct BenchResult {
  BenchTest test;
  std::vector<double> tokens_per_second;  // one per repetition
  double Mean() const;
  double StdDev() const;
};

using CacheFactory = std::function<std::unique_ptr<KvCache>()>;

// Runs `test` `repetitions` times (after one untimed warm-up run) on fresh
// caches from `make_cache`, with seeded random ordinary token ids.
StatusOr<BenchResult> RunBench(Transformer& model, const CacheFactory& make_cache,
                               const BenchTest& test, int repetitions);

}  // namespace kvq
