// A random-weight tiny Qwen2 written once per test suite and process (ctest
// runs test cases as parallel processes; each suite removes its file at the
// end), and the base fixture the model-level test suites derive from.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "base/status.h"
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

// True when the Qwen2 vocabulary WriteTinyQwen2 needs for qwen2_vocab is present.
inline bool Qwen2VocabPresent() { return std::filesystem::exists(Qwen2VocabPath()); }

// Writes the model to `path`.
inline Status WriteTinyQwen2(const TinyModelSpec& spec, const std::string& path) {
  KVQ_ASSIGN_OR_RETURN(SynthPreset preset, FindSynthPreset("tiny-qwen2"));
  ModelConfig config = preset.config;
  config.max_position_embeddings = spec.max_positions;
  if (spec.head_dim_64) {
    config.hidden_size = 128;
    config.num_heads = 2;
    config.num_kv_heads = 1;
    config.head_dim = 64;
  }
  SynthOptions options;
  options.seed = spec.seed;
  if (!spec.qwen2_vocab) return WriteSynthGguf(config, nullptr, options, path);
  if (!Qwen2VocabPresent()) {
    return Status::Error(Qwen2VocabPath() + " missing: run scripts/setup.sh");
  }
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> vocab, GgufFile::Open(Qwen2VocabPath()));
  return WriteSynthGguf(config, vocab.get(), options, path);
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
    vocab_missing_ = spec.qwen2_vocab && !Qwen2VocabPresent();
    write_status_ = WriteTinyQwen2(spec, path_);
  }
  static void TearDownTestSuite() {
    if (!path_.empty()) std::filesystem::remove(path_);
    path_.clear();
  }
  void SetUp() override {
    if (vocab_missing_) GTEST_SKIP() << write_status_.message();
  }
  // model_ = the suite's model on `threads` threads (fatal failure if it was
  // not written or does not load: wrap in ASSERT_NO_FATAL_FAILURE).
  void LoadTinyModel(int threads) {
    ASSERT_TRUE(write_status_.ok())
        << "the tiny model was not written: " << write_status_.message();
    auto loaded = LoadModel(path_, threads);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    model_ = std::move(loaded).value();
  }

  LoadedModel model_;

 private:
  static inline std::string path_;
  static inline Status write_status_ = Status::Ok();
  static inline bool vocab_missing_ = false;
};

}  // namespace kvq::test_util
