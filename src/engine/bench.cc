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

std::vector<int32_t> RandomTokens(const Transformer& model, int64_t n, std::mt19937& rng) {
  // Ordinary token ids; the upper part of large vocabularies holds specials.
  const int32_t max_id = static_cast<int32_t>(std::min<int64_t>(model.config().vocab_size, 32000));
  std::uniform_int_distribution<int32_t> id(0, max_id - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t& t : tokens) t = id(rng);
  return tokens;
}

// Times the test on `seq`, which already holds the test's depth.
StatusOr<double> TimeTest(Transformer& model, KvCache& cache, SeqId seq, const BenchTest& test,
                          std::mt19937& rng) {
  std::vector<float> logits;
  const auto start = std::chrono::steady_clock::now();
  if (test.kind == BenchTest::Kind::kPrefill) {
    KVQ_RETURN_IF_ERROR(
        model.Forward({{seq, RandomTokens(model, test.tokens, rng), false}}, cache, &logits));
  } else {
    for (int64_t i = 0; i < test.tokens; ++i) {
      KVQ_RETURN_IF_ERROR(
          model.Forward({{seq, RandomTokens(model, 1, rng), false}}, cache, &logits));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(test.tokens) / seconds;
}

}  // namespace

size_t BenchKvBytes(const KvLayout& layout, int64_t max_tokens, int64_t depth,
                    int64_t test_tokens) {
  return layout.SideBytesFor(max_tokens) + layout.SequenceBytes(depth) +
         layout.SequenceBytes(test_tokens + layout.block_tokens);
}

Status FillDepth(Transformer& model, KvCache& cache, SeqId seq, int64_t depth) {
  std::mt19937 rng(4321);
  std::vector<float> logits;
  KVQ_RETURN_IF_ERROR(cache.AddSequence(seq));
  // In chunks of 512 so a deep test doesn't need a huge batch.
  for (int64_t filled = 0; filled < depth; filled += 512) {
    const int64_t n = std::min<int64_t>(512, depth - filled);
    KVQ_RETURN_IF_ERROR(model.Forward({{seq, RandomTokens(model, n, rng), false}}, cache, &logits));
  }
  return Status::Ok();
}

StatusOr<BenchResult> RunBench(Transformer& model, KvCache& cache, SeqId depth_seq,
                               const BenchTest& test, int repetitions) {
  if (cache.Length(depth_seq, 0) != test.depth) {
    return Status::Error("the depth sequence holds " + std::to_string(cache.Length(depth_seq, 0)) +
                         " tokens, the test needs " + std::to_string(test.depth));
  }
  BenchResult result;
  result.test = test;
  std::mt19937 rng(1234);
  const SeqId run_seq = depth_seq + 1;
  for (int r = -1; r < repetitions; ++r) {  // r == -1: warm-up, not recorded
    KVQ_RETURN_IF_ERROR(cache.Fork(depth_seq, run_seq));
    auto tps = TimeTest(model, cache, run_seq, test, rng);
    cache.ReleaseSequence(run_seq);
    if (!tps.ok()) return tps.status();
    if (r >= 0) result.tokens_per_second.push_back(*tps);
  }
  return result;
}

}  // namespace kvq
