// Throughput tests in llama-bench's vocabulary: ppN (prefill N tokens in one
// batch) and tgN (generate N tokens one at a time), each after `depth`
// tokens already in the cache, repeated to give mean ± sd tokens/s.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "kv/kv_cache.h"
#include "kv/kv_factory.h"
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

// The KV budget a bench needs: side data for sequences of max_tokens, the
// depth sequence, and one fork of it that adds test_tokens (plus its own
// staging, and the copy of the depth's last block when it is partial).
size_t BenchKvBytes(const KvLayout& layout, int64_t max_tokens, int64_t depth, int64_t test_tokens);

// Starts `seq` in `cache` and fills it with `depth` seeded random ordinary
// token ids, the state every test at that depth starts from.
Status FillDepth(Transformer& model, KvCache& cache, SeqId seq, int64_t depth);

// Runs `test` `repetitions` times (after one untimed warm-up run), each on a
// copy-on-write fork of `depth_seq` (which must hold test.depth tokens), as
// llama-bench restores its saved depth state: the depth is filled once, every
// run sees the same tokens, and only the fork's own blocks are written.
StatusOr<BenchResult> RunBench(Transformer& model, KvCache& cache, SeqId depth_seq,
                               const BenchTest& test, int repetitions);

}  // namespace kvq
