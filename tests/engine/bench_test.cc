// kvq bench's engine: the depth is filled once and every run forks it, so the
// runs leave the depth sequence and the cache's memory exactly as they found
// them, for every cache kind (plain paged, KIVI's f16 window, GEAR's per-tile corrections).
#include "engine/bench.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "engine/loaded_model.h"
#include "kv/kv_factory.h"
#include "model/synth.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

class BenchTestSuite : public testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::path(KVQ_BINARY_DIR) / ("bench_test_" + std::to_string(::getpid()) + ".gguf"))
                .string();
    auto preset = FindSynthPreset("tiny-qwen2");
    ASSERT_TRUE(preset.ok());
    ModelConfig config = preset->config;
    config.max_position_embeddings = 512;
    config.num_layers = 2;
    config.head_dim = 32;  // NUQ codecs need a multiple of 32 (the preset has 16)
    SynthOptions options;
    options.seed = 11;
    ASSERT_TRUE(WriteSynthGguf(config, nullptr, options, path_).ok());
    auto loaded = LoadModel(path_, 2);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    model_ = std::move(loaded).value();
  }
  void TearDown() override { fs::remove(path_); }

  std::string path_;
  LoadedModel model_;
};

TEST_F(BenchTestSuite, RunsForkTheDepthAndLeaveItUnchanged) {
  Transformer& model = *model_.transformer;
  // 37 and 200 are not multiples of the 16-token block, so the forks share a
  // partial last block and the first write must copy it.
  for (const char* type : {"f16", "int4", "kivi2", "gear2"}) {
    for (int64_t depth : {int64_t{0}, int64_t{37}, int64_t{200}}) {
      SCOPED_TRACE(std::string(type) + " depth " + std::to_string(depth));
      KvCacheOptions options;
      options.k_type = options.v_type = type;
      options.max_tokens = depth + 24;
      auto layout = ComputeKvLayout(model.kv_shape(), options);
      ASSERT_TRUE(layout.ok()) << layout.status().message();
      options.memory_bytes = BenchKvBytes(*layout, options.max_tokens, depth, 24);
      auto cache = MakeKvCache(model.kv_shape(), options);
      ASSERT_TRUE(cache.ok()) << cache.status().message();
      ASSERT_TRUE(FillDepth(model, **cache, 0, depth).ok());
      ASSERT_EQ((*cache)->Length(0, 0), depth);
      const size_t filled_bytes = (*cache)->BytesUsed();
      for (const BenchTest& test : {BenchTest{BenchTest::Kind::kPrefill, 24, depth},
                                    BenchTest{BenchTest::Kind::kGenerate, 5, depth}}) {
        auto result = RunBench(model, **cache, 0, test, 2);
        ASSERT_TRUE(result.ok()) << result.status().message();
        ASSERT_EQ(result->tokens_per_second.size(), 2u);
        for (double tps : result->tokens_per_second) EXPECT_GT(tps, 0);
        EXPECT_EQ((*cache)->Length(0, model.config().num_layers - 1), depth);
        EXPECT_EQ((*cache)->Usage().sequences, 1);
        EXPECT_EQ((*cache)->BytesUsed(), filled_bytes);
      }
    }
  }
}

TEST_F(BenchTestSuite, ATestAtAnotherDepthIsAnError) {
  Transformer& model = *model_.transformer;
  KvCacheOptions options;
  options.max_tokens = 64;
  auto cache = MakeKvCache(model.kv_shape(), options);
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE(FillDepth(model, **cache, 0, 10).ok());
  auto result = RunBench(model, **cache, 0, BenchTest{BenchTest::Kind::kPrefill, 4, 20}, 1);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("holds 10 tokens"), std::string::npos)
      << result.status().message();
}

}  // namespace
}  // namespace kvq
