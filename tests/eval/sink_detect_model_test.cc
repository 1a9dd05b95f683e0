// Detected sinks (-aN) on the real default model: which token positions a
// short prefill of SmolLM2-135M marks as sinks, layer by layer (printed for
// docs/oscar.md). Skipped when set-up has not fetched the model.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/loaded_model.h"
#include "kv/kv_factory.h"
#include "kv/paged_cache.h"

namespace kvq {
namespace {

TEST(SinkDetectionOnSmolLM2, ReportsTheDetectedPositions) {
  const std::string path =
      std::string(KVQ_SOURCE_DIR) + "/.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  auto model = LoadModel(path, 2);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const std::string text =
      "The cache stores keys and values for every token. When the model reads a long "
      "document, a few tokens draw most of the attention: the first one, and often a full "
      "stop or a newline. Quantizing those rows hurts more than any other.";
  const std::vector<int32_t> tokens = model->tokenizer->Encode(text);
  ASSERT_GT(tokens.size(), 16u);
  KvCacheOptions options;
  options.k_type = options.v_type = "f16-a4";
  options.max_tokens = 256;
  options.num_threads = 2;
  const KvShape shape = model->transformer->kv_shape();
  auto cache = PagedKvCache::Create(shape, options);
  ASSERT_TRUE(cache.ok()) << cache.status().message();
  ASSERT_TRUE((*cache)->AddSequence(0).ok());
  std::vector<float> logits;
  ASSERT_TRUE(model->transformer->Forward({{0, tokens, false}}, **cache, &logits).ok());
  std::map<int64_t, int> layers_per_position;
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    const auto sinks = (*cache)->DetectedSinks(0, l);
    ASSERT_LE(sinks.size(), 4u);
    std::printf("layer %2lld:", static_cast<long long>(l));
    for (const auto& [t, mass] : sinks) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, static_cast<int64_t>(tokens.size()));
      ++layers_per_position[t];
      std::printf(" %lld '%s' (%.2f)", static_cast<long long>(t),
                  model->tokenizer->Decode(std::vector<int32_t>{tokens[t]}).c_str(), mass);
    }
    std::printf("\n");
  }
  std::printf("%zu tokens; positions detected in how many of %lld layers:", tokens.size(),
              static_cast<long long>(shape.num_layers));
  for (const auto& [t, count] : layers_per_position) {
    std::printf(" %lld:%d", static_cast<long long>(t), count);
  }
  std::printf("\n");
  // Every layer ranks something: a prefill always gives each token some mass.
  EXPECT_FALSE(layers_per_position.empty());
}

}  // namespace
}  // namespace kvq
