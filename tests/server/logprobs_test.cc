#include "server/logprobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include "engine/generate.h"
#include "engine/loaded_model.h"
#include "engine/sampler.h"
#include "kv/kv_factory.h"
#include "server/scheduler.h"
#include "server/test_model.h"

namespace kvq {
namespace {

// The scalar truth: log-softmax in long double, every token ranked by a full
// sort (descending, lowest id first among equals).
struct RefLogprobs {
  std::vector<double> logprob;  // [vocab]
  std::vector<int32_t> order;   // [vocab] ids, most likely first
};
RefLogprobs LogSoftmaxRef(const std::vector<float>& logits) {
  const long double max = *std::max_element(logits.begin(), logits.end());
  long double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<long double>(x) - max);
  RefLogprobs ref;
  for (float x : logits) ref.logprob.push_back(static_cast<double>(x - max - std::log(sum)));
  ref.order.resize(logits.size());
  std::iota(ref.order.begin(), ref.order.end(), 0);
  std::stable_sort(ref.order.begin(), ref.order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  return ref;
}

// The result is stored as float: rounding to nearest costs at most 2^-24 of
// |logprob|, and the double normalizer adds ~vocab * 2^-53 (< 1e-10 here).
// 2e-7 * max(1, |logprob|) bounds both with a margin, while a normalizer
// summed in float (error ~vocab * 2^-24, ~1e-4 at vocab 2000) or a missing
// term would fail it.
double Tolerance(double logprob) { return 2e-7 * std::max(1.0, std::abs(logprob)); }

void ExpectMatchesRef(const std::vector<float>& logits, int32_t token, int32_t top_n) {
  const TokenLogprob got =
      ComputeTokenLogprob(logits.data(), static_cast<int64_t>(logits.size()), token, top_n);
  const RefLogprobs ref = LogSoftmaxRef(logits);
  EXPECT_EQ(got.token, token);
  EXPECT_NEAR(got.logprob, ref.logprob[token], Tolerance(ref.logprob[token]));
  const size_t n = std::min<size_t>(static_cast<size_t>(top_n), logits.size());
  ASSERT_EQ(got.top.size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(got.top[i].first, ref.order[i]) << "rank " << i;
    EXPECT_NEAR(got.top[i].second, ref.logprob[ref.order[i]], Tolerance(ref.logprob[ref.order[i]]));
  }
}

TEST(LogprobsTest, MatchesLogSoftmaxRefOnRandomLogits) {
  std::mt19937 rng(11);
  for (int64_t vocab : {1, 2, 7, 33, 1000, 2049}) {
    for (float scale : {0.01f, 1.0f, 30.0f}) {
      std::normal_distribution<float> normal(0.0f, scale);
      std::vector<float> logits(static_cast<size_t>(vocab));
      for (float& x : logits) x = normal(rng) + 5.0f;
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab - 1));
      for (int32_t top_n : {0, 1, 5, 20}) ExpectMatchesRef(logits, pick(rng), top_n);
    }
  }
}

// Ties: equal logits rank by id, as the sampler's greedy choice does.
TEST(LogprobsTest, TiesRankLowestIdFirst) {
  std::vector<float> logits = {1, 3, 2, 3, 3, 0, 2};
  ExpectMatchesRef(logits, 4, 7);
  const TokenLogprob got = ComputeTokenLogprob(logits.data(), 7, 1, 3);
  EXPECT_EQ(got.top[0].first, 1);
  EXPECT_EQ(got.top[1].first, 3);
  EXPECT_EQ(got.top[2].first, 4);
  EXPECT_EQ(got.top[0].first, ArgMax(logits.data(), 7));
}

// Logits far beyond exp's range (float exp overflows past ~88) stay finite.
TEST(LogprobsTest, HugeLogitsStayFinite) {
  std::vector<float> logits = {1e4f, -1e4f, 9990.0f, 0.0f};
  const TokenLogprob got = ComputeTokenLogprob(logits.data(), 4, 2, 4);
  // p(2) / p(0) = e^-10 and the others are negligible (e^-1e4).
  EXPECT_NEAR(got.logprob, -10.0 - std::log1p(std::exp(-10.0)), 1e-5);
  EXPECT_NEAR(got.top[0].second, -std::log1p(std::exp(-10.0)), 1e-5);
  EXPECT_EQ(got.top[3].first, 1);
  EXPECT_TRUE(std::isfinite(got.top[3].second));
  ExpectMatchesRef(logits, 1, 4);
}

// A distribution: exp(logprob) over the whole vocabulary sums to 1, each
// term is <= 1, the list is sorted, and the greedy token is the top one.
TEST(LogprobsTest, IsADistributionSortedWithGreedyOnTop) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> logits(3001);
  for (float& x : logits) x = normal(rng);
  const int32_t greedy = ArgMax(logits.data(), 3001);
  const TokenLogprob all = ComputeTokenLogprob(logits.data(), 3001, greedy, 3001);
  double sum = 0;
  for (size_t i = 0; i < all.top.size(); ++i) {
    EXPECT_LE(all.top[i].second, 0.0f);
    if (i > 0) {
      EXPECT_GE(all.top[i - 1].second, all.top[i].second);
    }
    sum += std::exp(static_cast<double>(all.top[i].second));
  }
  // Each term carries the float rounding of its logprob (relative error of
  // p <= 2^-24 |logprob|, |logprob| < 40 here), so the sum is 1 within
  // 40 * 2^-24 ~ 2.4e-6.
  EXPECT_NEAR(sum, 1.0, 3e-6);
  EXPECT_EQ(all.top[0].first, greedy);
  EXPECT_EQ(all.logprob, all.top[0].second);
}

// The scheduler's entries against the model itself: replay the request's
// tokens through Transformer::Forward in the same calls the scheduler makes
// for a lone sequence (the whole prompt, then one token per step) and take
// the log-softmax of those logits. Sampling at temperature 1.5 still reports
// the raw model distribution (vLLM's raw_logprobs), not the tempered one.
class SchedulerLogprobsTest : public TinyServerModelTest {
 protected:
  void SetUp() override {
    TinyServerModelTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_NO_FATAL_FAILURE(LoadTinyModel(2));
  }
  std::unique_ptr<KvCache> NewCache() {
    KvCacheOptions options;
    options.max_tokens = 256;
    auto cache = MakeKvCache(model_.transformer->kv_shape(), options);
    EXPECT_TRUE(cache.ok()) << cache.status().message();
    return std::move(cache).value();
  }

  // Runs `request` alone; returns its entries and the final event.
  std::pair<std::vector<TokenLogprob>, RequestEvent> Serve(const ServeRequest& request) {
    auto cache = NewCache();
    SchedulerOptions options;
    options.max_model_len = 256;
    auto scheduler = Scheduler::Create(*model_.transformer, *model_.tokenizer, *cache, options);
    EXPECT_TRUE(scheduler.ok());
    auto channel = std::make_shared<RequestChannel>();
    EXPECT_TRUE((*scheduler)->Validate(request).ok());
    (*scheduler)->Add(request, channel, Clock::now());
    StepReport report;
    while ((*scheduler)->HasWork()) EXPECT_TRUE((*scheduler)->Step(&report).ok());
    std::vector<RequestEvent> events;
    channel->Pop(&events, std::chrono::milliseconds(0));
    std::vector<TokenLogprob> entries;
    for (RequestEvent& e : events) {
      for (TokenLogprob& t : e.logprobs) entries.push_back(std::move(t));
    }
    EXPECT_FALSE(events.empty());
    EXPECT_EQ(cache->Usage().blocks_used, 0);
    return {std::move(entries), events.empty() ? RequestEvent{} : events.back()};
  }

  void ExpectModelLogSoftmax(const ServeRequest& request, const std::vector<TokenLogprob>& got) {
    auto cache = NewCache();
    ASSERT_TRUE(cache->AddSequence(1).ok());
    const int64_t vocab = model_.transformer->config().vocab_size;
    std::vector<float> logits;
    std::vector<int32_t> next = request.prompt;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(model_.transformer->Forward({{1, next, false}}, *cache, &logits).ok());
      ASSERT_EQ(logits.size(), static_cast<size_t>(vocab));
      const RefLogprobs ref = LogSoftmaxRef(logits);
      // Same calls, same kernels, same threads: the same logits, so only
      // the float rounding of the result separates the two.
      EXPECT_NEAR(got[i].logprob, ref.logprob[got[i].token], Tolerance(ref.logprob[got[i].token]))
          << "token " << i;
      ASSERT_EQ(got[i].top.size(), static_cast<size_t>(request.logprobs));
      for (size_t r = 0; r < got[i].top.size(); ++r) {
        EXPECT_EQ(got[i].top[r].first, ref.order[r]) << "token " << i << " rank " << r;
      }
      next = {got[i].token};
    }
  }
};

TEST_F(SchedulerLogprobsTest, GreedyReportsTheLargestLogprob) {
  ServeRequest request;
  request.prompt = *BuildPrompt(model_, "The quick brown fox", false);
  request.max_tokens = 12;
  request.stop_at_eos = false;
  request.logprobs = 5;
  auto [entries, final] = Serve(request);
  EXPECT_EQ(final.finish_reason, "length");
  ASSERT_EQ(static_cast<int64_t>(entries.size()), final.completion_tokens);
  for (const TokenLogprob& e : entries) {
    ASSERT_EQ(e.top.size(), 5u);
    EXPECT_EQ(e.token, e.top[0].first);
    EXPECT_EQ(e.logprob, e.top[0].second);
    EXPECT_LE(std::exp(e.top[0].second), 1.0f);
    for (size_t r = 1; r < e.top.size(); ++r) EXPECT_GE(e.top[r - 1].second, e.top[r].second);
  }
  ExpectModelLogSoftmax(request, entries);
}

TEST_F(SchedulerLogprobsTest, SampledTokensReportTheRawDistribution) {
  ServeRequest request;
  request.prompt = *BuildPrompt(model_, "Once upon a time", false);
  request.max_tokens = 10;
  request.stop_at_eos = false;
  request.sampling.temperature = 1.5f;
  request.sampling.seed = 42;
  request.logprobs = 3;
  auto [entries, final] = Serve(request);
  ASSERT_EQ(static_cast<int64_t>(entries.size()), final.completion_tokens);
  ExpectModelLogSoftmax(request, entries);
  // Without logprobs, no entries travel.
  request.logprobs = -1;
  EXPECT_TRUE(Serve(request).first.empty());
}

}  // namespace
}  // namespace kvq
