#include "engine/bench.h"

#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

namespace kvq {

std::string BenchTest::Name() const {
  std::string name = (kind == Kind::kPrefill ? "pp" : "tg") + std::to_string(tokens);
  if (depth > 0) name += " @ d" + std::to_string(depth);
  return name;
}

double BenchResult::Mean() const {
  if (tokens_per_second.empty()) return 0;
  return std::accumulate(tokens_per_second.begin(), tokens_per_second.end(), 0.0) /
         static_cast<double>(tokens_per_second.size());
}

double BenchResult::StdDev() const {
  const size_t n = tokens_per_second.size();
  if (n < 2) return 0;
  const double mean = Mean();
  double sum = 0;
  for (double x : tokens_per_second) sum += (x - mean) * (x - mean);
  return std::sqrt(sum / static_cast<double>(n - 1));
}

namespace {

// Fills the cache with `depth` tokens, then times the test itself.
StatusOr<double> RunOnce(Transformer& model, KvCache& cache, const BenchTest& test,
                         std::mt19937& rng) {
  // Ordinary token ids; the upper part of large vocabularies holds specials.
  const int32_t max_id = static_cast<int32_t>(std::min<int64_t>(model.config().vocab_size, 32000));
  std::uniform_int_distribution<int32_t> id(0, max_id - 1);
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int32_t& t : tokens) t = id(rng);
    return tokens;
  };
  const SeqId seq = 0;
  KVQ_RETURN_IF_ERROR(cache.AddSequence(seq));
  std::vector<float> logits;
  // Depth is filled in chunks of 512 so a deep test doesn't need a huge batch.
  for (int64_t filled = 0; filled < test.depth; filled += 512) {
    const int64_t n = std::min<int64_t>(512, test.depth - filled);
    KVQ_RETURN_IF_ERROR(model.Forward({{seq, random_tokens(n), false}}, cache, &logits));
  }
  const auto start = std::chrono::steady_clock::now();
  if (test.kind == BenchTest::Kind::kPrefill) {
    KVQ_RETURN_IF_ERROR(model.Forward({{seq, random_tokens(test.tokens), false}}, cache, &logits));
  } else {
    for (int64_t i = 0; i < test.tokens; ++i) {
      KVQ_RETURN_IF_ERROR(model.Forward({{seq, random_tokens(1), false}}, cache, &logits));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  cache.ReleaseSequence(seq);
  return static_cast<double>(test.tokens) / seconds;
}

}  // namespace

StatusOr<BenchResult> RunBench(Transformer& model, const CacheFactory& make_cache,
                               const BenchTest& test, int repetitions) {
  BenchResult result;
  result.test = test;
  std::mt19937 rng(1234);
  for (int r = -1; r < repetitions; ++r) {  // r == -1: warm-up, not recorded
    std::unique_ptr<KvCache> cache = make_cache();
    if (cache == nullptr) return Status::Error("KV cache could not be created");
    KVQ_ASSIGN_OR_RETURN(double tps, RunOnce(model, *cache, test, rng));
    if (r >= 0) result.tokens_per_second.push_back(tps);
  }
  return result;
}

}  // namespace kvq
