// Transformer::Forward's BatchArith on a decode step shared by more
// sequences than ops::kPackedMinTokens, and on a step mixing decodes with
// prompt chunks (a server's step): kInvariant gives each sequence the logits
// it gets alone, bit for bit; kFastest (the packed GEMM at the step's row
// count) rounds differently, which is why the study's batched answers
// decode under kInvariant.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "kv/dense_cache.h"
#include "ops/matmul.h"
#include "tiny_model.h"

namespace kvq {
namespace {

class BatchArithTest : public test_util::TinyModelTest {
 protected:
  static void SetUpTestSuite() { WriteSuiteModel({.max_positions = 64, .seed = 9}); }
  void SetUp() override {
    TinyModelTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_NO_FATAL_FAILURE(LoadTinyModel(2));
  }

  // A cache holding `prompts.size()` sequences (ids 0..), each prompt
  // prefilled alone, so every cache made from the same prompts is identical.
  std::unique_ptr<KvCache> Prefilled(const std::vector<std::vector<int32_t>>& prompts) {
    auto cache = MakeDenseKvCache(model_.transformer->kv_shape(), DenseKvType::kF16, 64, 1);
    std::vector<float> logits;
    for (size_t s = 0; s < prompts.size(); ++s) {
      const SeqId seq = static_cast<SeqId>(s);
      EXPECT_TRUE(cache->AddSequence(seq).ok());
      EXPECT_TRUE(model_.transformer->Forward({{seq, prompts[s], false}}, *cache, &logits).ok());
    }
    return cache;
  }
  // Each sequence's step alone (kFastest, one sequence per call): its logit
  // rows, in step order.
  std::vector<float> EachAlone(const std::vector<std::vector<int32_t>>& prompts,
                               const std::vector<BatchSequence>& step) {
    auto cache = Prefilled(prompts);
    std::vector<float> logits, alone;
    for (const BatchSequence& one : step) {
      EXPECT_TRUE(model_.transformer->Forward({one}, *cache, &logits).ok());
      alone.insert(alone.end(), logits.begin(), logits.end());
    }
    return alone;
  }
  // The whole step in one call under `arith`.
  std::vector<float> Together(const std::vector<std::vector<int32_t>>& prompts,
                              const std::vector<BatchSequence>& step, BatchArith arith) {
    auto cache = Prefilled(prompts);
    std::vector<float> logits;
    EXPECT_TRUE(model_.transformer->Forward(step, *cache, &logits, nullptr, arith).ok());
    return logits;
  }
};

TEST_F(BatchArithTest, InvariantDecodeStepEqualsEachSequenceAlone) {
  constexpr int kSequences = 40;
  static_assert(kSequences >= ops::kPackedMinTokens, "the fast path must take the packed GEMM");
  std::mt19937 rng(17);
  const int32_t vocab = static_cast<int32_t>(model_.transformer->config().vocab_size);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<BatchSequence> step;  // one new token per sequence
  for (int s = 0; s < kSequences; ++s) {
    std::vector<int32_t> prompt(static_cast<size_t>(3 + s % 7));
    for (int32_t& id : prompt) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    prompts.push_back(prompt);
    step.push_back({static_cast<SeqId>(s), {static_cast<int32_t>(rng() % vocab)}, false});
  }
  const std::vector<float> alone = EachAlone(prompts, step);  // [kSequences, vocab]
  EXPECT_EQ(Together(prompts, step, BatchArith::kInvariant), alone);
  const std::vector<float> fastest = Together(prompts, step, BatchArith::kFastest);
  ASSERT_EQ(fastest.size(), alone.size());
  // Not bit for bit: otherwise this test could not tell the two apart.
  EXPECT_NE(fastest, alone);
}

// A server's step: decodes of some sequences, prompt chunks of others (of
// 40 tokens, where a chunk alone takes the packed GEMM, and of 5, where it
// does not), with all logits for one of them. Each sequence gets what it
// gets alone, whether its rows come first, between or after the others.
TEST_F(BatchArithTest, InvariantMixedStepEqualsEachSequenceAlone) {
  std::mt19937 rng(23);
  const int32_t vocab = static_cast<int32_t>(model_.transformer->config().vocab_size);
  auto tokens = [&](size_t n) {
    std::vector<int32_t> t(n);
    for (int32_t& id : t) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    return t;
  };
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < 8; ++s) prompts.push_back(tokens(4 + s % 3));
  // seq 0-3 decode, 4 and 5 continue with chunks of 40 and 5, 6 decodes, 7
  // continues with 12 tokens and wants every row's logits.
  std::vector<BatchSequence> step = {
      {0, tokens(1), false}, {1, tokens(1), false}, {4, tokens(40), false}, {2, tokens(1), false},
      {3, tokens(1), false}, {5, tokens(5), false}, {6, tokens(1), false},  {7, tokens(12), true}};
  const int64_t vocab_size = vocab;
  const std::vector<float> alone = EachAlone(prompts, step);  // logit rows in batch order
  ASSERT_EQ(static_cast<int64_t>(alone.size()), (7 + 12) * vocab_size);
  EXPECT_EQ(Together(prompts, step, BatchArith::kInvariant), alone);
  const std::vector<float> fastest = Together(prompts, step, BatchArith::kFastest);
  ASSERT_EQ(fastest.size(), alone.size());
  EXPECT_NE(fastest, alone);  // 64 rows take the packed GEMM together
}

}  // namespace
}  // namespace kvq
