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
  SamplingParams params{.temperature = 1.0f, .seed = 42};
  Sampler a(params), b(params);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.Sample(logits.data(), 5), b.Sample(logits.data(), 5));
}

TEST(Sampler, TopKRestrictsToHighestLogits) {
  std::vector<float> logits = {5.0f, 4.9f, 4.8f, 0.0f, -2.0f};
  Sampler s(SamplingParams{.temperature = 5.0f, .top_k = 2, .seed = 1});
  for (int i = 0; i < 200; ++i) EXPECT_LT(s.Sample(logits.data(), 5), 2);
}

TEST(Sampler, TopPKeepsSmallestNucleus) {
  // Probabilities ~ {0.7, 0.2, 0.1 spread}: top_p 0.6 keeps only id 0.
  std::vector<float> logits = {std::log(0.7f), std::log(0.2f), std::log(0.05f), std::log(0.05f)};
  Sampler s(SamplingParams{.temperature = 1.0f, .top_p = 0.6f, .seed = 3});
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.Sample(logits.data(), 4), 0);
}

// With temperature 1 the empirical frequencies follow softmax(logits): with
// 20000 draws the standard error of a frequency near 0.5 is ~0.0035, so a
// tolerance of 0.02 (> 5 sigma) cannot fail by chance yet catches a wrong
// temperature or normalization (which shifts frequencies by > 0.1).
TEST(Sampler, FrequenciesFollowSoftmax) {
  std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = {0.25, 0.75}
  Sampler s(SamplingParams{.temperature = 1.0f, .seed = 7});
  int ones = 0;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) ones += s.Sample(logits.data(), 2);
  EXPECT_NEAR(static_cast<double>(ones) / draws, 0.75, 0.02);
}

}  // namespace
}  // namespace kvq
