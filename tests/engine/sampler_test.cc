#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace kvq {
namespace {

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  const std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f};
  Sampler greedy(SamplingParams{});
  EXPECT_EQ(greedy.Sample(logits.data(), 4), 1);
}

TEST(Sampler, SameSeedSameSequence) {
  std::vector<float> logits = {1.0f, 1.1f, 0.9f, 1.05f, 0.2f};
  SamplingParams params{.temperature = 1.0f, .seed = 42, .logit_bias = {}};
  Sampler a(params), b(params);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.Sample(logits.data(), 5), b.Sample(logits.data(), 5));
}

TEST(Sampler, TopKRestrictsToHighestLogits) {
  std::vector<float> logits = {5.0f, 4.9f, 4.8f, 0.0f, -2.0f};
  Sampler s(SamplingParams{.temperature = 5.0f, .top_k = 2, .seed = 1, .logit_bias = {}});
  for (int i = 0; i < 200; ++i) EXPECT_LT(s.Sample(logits.data(), 5), 2);
}

TEST(Sampler, TopPKeepsSmallestNucleus) {
  // Probabilities ~ {0.7, 0.2, 0.1 spread}: top_p 0.6 keeps only id 0.
  std::vector<float> logits = {std::log(0.7f), std::log(0.2f), std::log(0.05f), std::log(0.05f)};
  Sampler s(SamplingParams{.temperature = 1.0f, .top_p = 0.6f, .seed = 3, .logit_bias = {}});
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.Sample(logits.data(), 4), 0);
}

// With temperature 1 the empirical frequencies follow softmax(logits): with
// 20000 draws the standard error of a frequency near 0.5 is ~0.0035, so a
// tolerance of 0.02 (> 5 sigma) cannot fail by chance yet catches a wrong
// temperature or normalization (which shifts frequencies by > 0.1).
TEST(Sampler, FrequenciesFollowSoftmax) {
  std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = {0.25, 0.75}
  Sampler s(SamplingParams{.temperature = 1.0f, .seed = 7, .logit_bias = {}});
  int ones = 0;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) ones += s.Sample(logits.data(), 2);
  EXPECT_NEAR(static_cast<double>(ones) / draws, 0.75, 0.02);
}

// OpenAI's logit processing (issue 21, failure 7): logit_bias is added to
// the logits; a token in the output so far loses
// count * frequency_penalty + presence_penalty.
TEST(Sampler, LogitBiasMovesTheArgmax) {
  const std::vector<float> logits = {3.0f, 1.0f, 2.0f};
  SamplingParams params;
  params.logit_bias = {{1, 2.5f}};
  Sampler s(params);
  EXPECT_EQ(s.Sample(logits.data(), 3), 1);  // 1 + 2.5 > 3
  params.logit_bias = {{0, -100.0f}};
  Sampler banned(params);
  EXPECT_EQ(banned.Sample(logits.data(), 3), 2);
}

TEST(Sampler, PresencePenaltyOncePerToken) {
  // Greedy: token 0 leads by 0.5; a presence penalty of 0.6 hands the next
  // step to token 1, then token 0 again (both penalized once: 0 leads).
  const std::vector<float> logits = {2.0f, 1.5f, 0.0f};
  SamplingParams params;
  params.presence_penalty = 0.6f;
  Sampler s(params);
  EXPECT_EQ(s.Sample(logits.data(), 3), 0);
  EXPECT_EQ(s.Sample(logits.data(), 3), 1);
  EXPECT_EQ(s.Sample(logits.data(), 3), 0);  // 2 - 0.6 > 1.5 - 0.6
  EXPECT_EQ(s.Sample(logits.data(), 3), 0);  // presence does not grow with count
}

TEST(Sampler, FrequencyPenaltyGrowsWithCount) {
  // Token 0 leads by 1.0; with frequency 0.4 it wins while 0.4 * count < 1:
  // after 3 uses (1.2) token 1 takes over.
  const std::vector<float> logits = {2.0f, 1.0f, -5.0f};
  SamplingParams params;
  params.frequency_penalty = 0.4f;
  Sampler s(params);
  std::vector<int32_t> out;
  for (int i = 0; i < 4; ++i) out.push_back(s.Sample(logits.data(), 3));
  EXPECT_EQ(out, (std::vector<int32_t>{0, 0, 0, 1}));
  // A negative penalty encourages repetition.
  params.frequency_penalty = -2.0f;
  const std::vector<float> close = {1.0f, 1.1f};
  Sampler repeat(params);
  EXPECT_EQ(repeat.Sample(close.data(), 2), 1);
  EXPECT_EQ(repeat.Sample(close.data(), 2), 1);
}

TEST(Sampler, BiasOutsideTheVocabularyIsIgnoredNotACrash) {
  const std::vector<float> logits = {0.0f, 1.0f};
  SamplingParams params;
  params.logit_bias = {{7, 100.0f}, {-3, 100.0f}};
  Sampler s(params);
  EXPECT_EQ(s.Sample(logits.data(), 2), 1);
}

}  // namespace
}  // namespace kvq
