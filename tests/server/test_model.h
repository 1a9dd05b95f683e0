// The server tests' tiny model: a random-weight Qwen2 with the real Qwen2
// vocabulary (tests skip when scripts/setup.sh has not fetched it).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "kv/kv_factory.h"
#include "tiny_model.h"

namespace kvq {

// Derived SetUp()s call TinyServerModelTest::SetUp() first, return if
// IsSkipped(), then load with LoadTinyModel.
class TinyServerModelTest : public test_util::TinyModelTest {
 protected:
  static void SetUpTestSuite() {
    WriteSuiteModel({.max_positions = 256, .seed = 5, .qwen2_vocab = true});
  }
  // cache_ = a dense f16 cache of the model's whole 256-token context (after
  // LoadTinyModel; wrap in ASSERT_NO_FATAL_FAILURE).
  void NewDenseCache() {
    KvCacheOptions kv;
    kv.max_tokens = 256;
    auto cache = MakeKvCache(model_.transformer->kv_shape(), kv);
    ASSERT_TRUE(cache.ok()) << cache.status().message();
    cache_ = std::move(cache).value();
  }

  std::unique_ptr<KvCache> cache_;
};

// `n` token ids of a fixture text ("word<offset*1000 + i> and more, ..."):
// distinct offsets give prompts that differ from their first token.
inline std::vector<int32_t> FixtureTokens(const LoadedModel& model, size_t n, int offset) {
  std::string text;
  for (int i = 0; text.size() < 8 * n; ++i) {
    text += "word" + std::to_string(offset * 1000 + i) + " and more, ";
  }
  auto ids = BuildPrompt(model, text, false);
  EXPECT_TRUE(ids.ok());
  if (!ids.ok()) return {};
  EXPECT_GE(ids->size(), n);
  ids->resize(n);
  return *ids;
}

// A sample's value from the server's Prometheus text ("name value" line),
// or -1 when the sample is absent.
inline double Metric(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = ("\n" + text).find(key);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + key.size() - 1));
}

}  // namespace kvq
