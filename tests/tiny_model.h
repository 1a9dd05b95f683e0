// A random-weight tiny Qwen2 written once per test suite and process (ctest
// runs test cases as parallel processes; each suite removes its file at the
// end), and the base fixture the model-level test suites derive from.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "engine/loaded_model.h"
#include "io/gguf.h"
#include "model/synth.h"
#include "test_util.h"

namespace kvq::test_util {

struct TinyModelSpec {
  int64_t max_positions = 256;
  uint64_t seed = 5;
  // The real Qwen2 vocabulary from llama.cpp's models (scripts/setup.sh);
  // otherwise the synthetic byte vocabulary (one byte = one token).
  bool qwen2_vocab = false;
  // head_dim 64 with 2 query heads on 1 KV head (int2 needs a 32-wide group,
  // rotation a power of two); otherwise the tiny-qwen2 preset's shape.
  bool head_dim_64 = false;
};

// The Qwen2 vocabulary llama.cpp ships in its models folder (scripts/setup.sh).
inline std::string Qwen2VocabPath() {
  return std::string(KVQ_DEPS_DIR) + "/llama.cpp/models/ggml-vocab-qwen2.gguf";
}

// Writes the model to `path`; "" on success, else why not. A missing Qwen2
// vocabulary returns kTinyVocabMissing.
inline constexpr const char* kTinyVocabMissing = "vocab GGUF missing: run scripts/setup.sh";
inline std::string WriteTinyQwen2(const TinyModelSpec& spec, const std::string& path) {
  auto preset = FindSynthPreset("tiny-qwen2");
  if (!preset.ok()) return preset.status().message();
  ModelConfig config = preset->config;
  config.max_position_embeddings = spec.max_positions;
  if (spec.head_dim_64) {
    config.hidden_size = 128;
    config.num_heads = 2;
    config.num_kv_heads = 1;
    config.head_dim = 64;
  }
  SynthOptions options;
  options.seed = spec.seed;
  if (!spec.qwen2_vocab) {
    Status s = WriteSynthGguf(config, nullptr, options, path);
    return s.ok() ? "" : s.message();
  }
  const std::string vocab_path = Qwen2VocabPath();
  if (!std::filesystem::exists(vocab_path)) return kTinyVocabMissing;
  auto vocab = GgufFile::Open(vocab_path);
  if (!vocab.ok()) return vocab.status().message();
  Status s = WriteSynthGguf(config, vocab->get(), options, path);
  return s.ok() ? "" : s.message();
}

// Base fixture: a derived suite's SetUpTestSuite calls WriteSuiteModel(spec)
// and its tests call LoadTinyModel. SetUp skips when the Qwen2 vocabulary is
// missing; a derived SetUp() that needs that vocabulary calls
// TinyModelTest::SetUp() first and returns if IsSkipped().
class TinyModelTest : public testing::Test {
 protected:
  static void WriteSuiteModel(const TinyModelSpec& spec) {
    const std::string suite = testing::UnitTest::GetInstance()->current_test_suite()->name();
    path_ = TestPath(suite, "tiny.gguf");
    write_error_ = WriteTinyQwen2(spec, path_);
  }
  static void TearDownTestSuite() {
    if (!path_.empty()) std::filesystem::remove(path_);
    path_.clear();
  }
  void SetUp() override {
    if (write_error_ == kTinyVocabMissing) GTEST_SKIP() << write_error_;
  }
  // model_ = the suite's model on `threads` threads (fatal failure if it was
  // not written or does not load: wrap in ASSERT_NO_FATAL_FAILURE).
  void LoadTinyModel(int threads) {
    ASSERT_EQ(write_error_, "") << "the tiny model was not written";
    auto loaded = LoadModel(path_, threads);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    model_ = std::move(loaded).value();
  }

  LoadedModel model_;

 private:
  static inline std::string path_;
  static inline std::string write_error_;
};

}  // namespace kvq::test_util
