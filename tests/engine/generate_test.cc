#include "engine/generate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "kv/dense_cache.h"
#include "model/synth.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

// A tiny random-weight Qwen2 with the real Qwen2 vocabulary, written once.
class GenerateTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string vocab_path =
        std::string(KVQ_DEPS_DIR) + "/llama.cpp/models/ggml-vocab-qwen2.gguf";
    if (!fs::exists(vocab_path)) return;
    auto vocab = GgufFile::Open(vocab_path);
    ASSERT_TRUE(vocab.ok()) << vocab.status().message();
    auto preset = FindSynthPreset("tiny-qwen2");
    ASSERT_TRUE(preset.ok());
    ModelConfig config = preset->config;
    config.max_position_embeddings = 64;  // small, so overflow is cheap to provoke
    // One file per process: ctest runs each test case as its own process,
    // in parallel, and each suite removes its file at the end.
    path_ = new std::string((fs::path(KVQ_BINARY_DIR) /
                             ("generate_test_tiny_qwen2_" + std::to_string(::getpid()) + ".gguf"))
                                .string());
    SynthOptions options;
    options.seed = 3;
    ASSERT_TRUE(WriteSynthGguf(config, vocab->get(), options, *path_).ok());
  }
  static void TearDownTestSuite() {
    if (path_ != nullptr) fs::remove(*path_);
    delete path_;
    path_ = nullptr;
  }
  void SetUp() override {
    if (path_ == nullptr) GTEST_SKIP() << "vocab GGUF missing: run scripts/setup.sh";
    auto loaded = LoadModel(*path_, 2);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    model_ = std::move(loaded).value();
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

  static std::string* path_;
  LoadedModel model_;
};
std::string* GenerateTest::path_ = nullptr;

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

TEST(LoadModel, MissingPathAndVocabOnlyFilesAreClearErrors) {
  auto missing = LoadModel("/nonexistent/model.gguf", 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model.gguf"), std::string::npos);
  const std::string vocab = std::string(KVQ_DEPS_DIR) + "/llama.cpp/models/ggml-vocab-qwen2.gguf";
  if (!fs::exists(vocab)) GTEST_SKIP() << "vocab GGUF missing";
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
