#include "engine/generate.h"

#include <gtest/gtest.h>

#include <string>

#include "kv/dense_cache.h"
#include "kv/kv_factory.h"
#include "tiny_model.h"

namespace kvq {
namespace {

// A tiny random-weight Qwen2 with the real Qwen2 vocabulary, written once.
class GenerateTest : public test_util::TinyModelTest {
 protected:
  static void SetUpTestSuite() {
    // max_positions 64: small, so overflow is cheap to provoke.
    WriteSuiteModel({.max_positions = 64, .seed = 3, .qwen2_vocab = true});
  }
  void SetUp() override {
    TinyModelTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_NO_FATAL_FAILURE(LoadTinyModel(2));
  }
  std::unique_ptr<KvCache> NewCache(DenseKvType type = DenseKvType::kF16) {
    return MakeDenseKvCache(model_.transformer->kv_shape(), type,
                            model_.transformer->config().max_position_embeddings);
  }
  StatusOr<std::string> Run(const std::string& prompt, const GenerateOptions& options,
                            KvCache& cache, GenerateStats* stats = nullptr) {
    std::string text;
    Status s = Generate(
        model_, cache, prompt, options, [&text](std::string_view piece) { text += piece; }, stats);
    if (!s.ok()) return s;
    return text;
  }
};

TEST_F(GenerateTest, GreedyIsDeterministicAndReleasesTheSequence) {
  auto cache = NewCache();
  GenerateOptions options;
  options.max_new_tokens = 8;
  options.stop_at_eos = false;
  GenerateStats stats;
  auto first = Run("Hello world", options, *cache, &stats);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(stats.generated_tokens, 8);
  EXPECT_EQ(stats.stop_reason, "length");
  EXPECT_EQ(cache->BytesUsed(), 0u);  // released at the end
  auto second = Run("Hello world", options, *cache);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*first, *second);
}

TEST_F(GenerateTest, EmptyPromptIsAnError) {
  auto cache = NewCache();
  auto result = Run("", GenerateOptions{}, *cache);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("empty"), std::string::npos);
}

TEST_F(GenerateTest, PromptLongerThanContextIsAnError) {
  auto cache = NewCache();
  std::string prompt;
  for (int i = 0; i < 100; ++i) prompt += " word";
  auto result = Run(prompt, GenerateOptions{}, *cache);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("more than the context of 64"), std::string::npos)
      << result.status().message();
}

TEST_F(GenerateTest, StopsWhenTheContextIsFull) {
  auto cache = NewCache();
  GenerateOptions options;
  options.max_new_tokens = 1000;
  options.stop_at_eos = false;
  GenerateStats stats;
  auto result = Run("Hello", options, *cache, &stats);
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(stats.stop_reason, "context");
  EXPECT_EQ(stats.prompt_tokens + stats.generated_tokens, 65);  // 64 cached + the last sampled
}

double LogitsNmse(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    ref += static_cast<double>(b[i]) * b[i];
  }
  return err / ref;
}

// The paged cache through the real forward pass: a prompt, a fork, and two
// diverging continuations decoded in one batch (copy-on-write inside a
// partially filled block) must give the logits a dense cache gives when each
// continuation runs on its own. f32 storage on both sides, so only the order
// of f32 sums inside attention differs (relative ~1e-7 per layer): NMSE of
// the logits ~1e-13; 1e-9 still fails on any wrong token, position or block.
TEST_F(GenerateTest, PagedCacheForkMatchesDenseCacheInTheForwardPass) {
  Transformer& model = *model_.transformer;
  const KvShape shape = model.kv_shape();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 21; ++i) prompt.push_back(100 + 37 * i);  // 21 tokens: 1 block + 5
  const std::vector<int32_t> next_a = {4000, 4100, 4200}, next_b = {900, 901};
  for (const bool rotate : {false, true}) {
    KvCacheOptions options;
    options.k_type = options.v_type = "f32";
    options.block_tokens = 16;
    options.rotate = rotate;
    options.max_tokens = 64;
    options.memory_bytes = 0;
    auto layout = ComputeKvLayout(shape, options);
    ASSERT_TRUE(layout.ok());
    options.memory_bytes = layout->block_bytes * 8;
    auto paged = MakeKvCache(shape, options);
    ASSERT_TRUE(paged.ok()) << paged.status().message();
    KvCache& cache = **paged;
    std::vector<float> logits;
    ASSERT_TRUE(cache.AddSequence(0).ok());
    ASSERT_TRUE(model.Forward({{0, prompt, false}}, cache, &logits).ok());
    ASSERT_TRUE(cache.Fork(0, 1).ok());
    EXPECT_EQ(cache.Usage().blocks_used, 2);
    std::vector<float> paged_logits;
    ASSERT_TRUE(model.Forward({{0, next_a, true}, {1, next_b, true}}, cache, &paged_logits).ok());
    EXPECT_EQ(cache.Usage().blocks_used, 3);  // the shared partial block was copied once

    std::vector<float> dense_logits, part;
    for (const auto& next : {next_a, next_b}) {
      auto dense = MakeDenseKvCache(shape, DenseKvType::kF32, 64);
      ASSERT_TRUE(dense->AddSequence(0).ok());
      ASSERT_TRUE(model.Forward({{0, prompt, false}}, *dense, &logits).ok());
      ASSERT_TRUE(model.Forward({{0, next, true}}, *dense, &part).ok());
      dense_logits.insert(dense_logits.end(), part.begin(), part.end());
    }
    ASSERT_EQ(paged_logits.size(), dense_logits.size());
    EXPECT_LE(LogitsNmse(paged_logits, dense_logits), 1e-9) << "rotate " << rotate;
    cache.ReleaseSequence(0);
    cache.ReleaseSequence(1);
    EXPECT_EQ(cache.Usage().blocks_used, 0);
  }
}

// This model's head_dim is 16, below every integer codec's smallest group
// (32), so only the float codecs run here; kv_tests cover the rest.
TEST_F(GenerateTest, GeneratesWithPagedFloatCodecsAndReleasesItsBlocks) {
  for (const char* type : {"f16", "bf16", "fp8_e4m3", "fp8_e5m2"}) {
    KvCacheOptions options;
    options.k_type = options.v_type = type;
    options.rotate = std::string(type).rfind("fp8", 0) == 0;
    options.max_tokens = 64;
    auto cache = MakeKvCache(model_.transformer->kv_shape(), options);
    ASSERT_TRUE(cache.ok()) << type << ": " << cache.status().message();
    GenerateOptions generate;
    generate.max_new_tokens = 6;
    generate.stop_at_eos = false;
    GenerateStats stats;
    auto text = Run("Hello world", generate, **cache, &stats);
    ASSERT_TRUE(text.ok()) << type << ": " << text.status().message();
    EXPECT_EQ(stats.generated_tokens, 6) << type;
    EXPECT_EQ((*cache)->Usage().blocks_used, 0) << type;
  }
}

TEST(LoadModel, MissingPathAndVocabOnlyFilesAreClearErrors) {
  auto missing = LoadModel("/nonexistent/model.gguf", 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model.gguf"), std::string::npos);
  const std::string vocab = test_util::Qwen2VocabPath();
  if (!test_util::Qwen2VocabPresent()) GTEST_SKIP() << "vocab GGUF missing";
  auto vocab_only = LoadModel(vocab, 1);
  ASSERT_FALSE(vocab_only.ok());
  EXPECT_NE(vocab_only.status().message().find("ggml-vocab-qwen2.gguf"), std::string::npos)
      << vocab_only.status().message();
}

TEST(CompleteUtf8Prefix, HoldsBackIncompleteCharacters) {
  EXPECT_EQ(CompleteUtf8Prefix("abc"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xE2\x82"), 1u);      // € missing its last byte
  EXPECT_EQ(CompleteUtf8Prefix("a\xE2\x82\xAC"), 4u);  // complete €
  EXPECT_EQ(CompleteUtf8Prefix("\xF0\x9F\x98"), 0u);   // emoji, 3 of 4 bytes
  EXPECT_EQ(CompleteUtf8Prefix("\xF0\x9F\x98\x80"), 4u);
  EXPECT_EQ(CompleteUtf8Prefix("\x80\x80"), 2u);  // stray continuation bytes pass
  EXPECT_EQ(CompleteUtf8Prefix("a\xFF"), 2u);     // invalid lead byte passes
  EXPECT_EQ(CompleteUtf8Prefix(""), 0u);
}

}  // namespace
}  // namespace kvq
