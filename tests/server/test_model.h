// A random-weight tiny Qwen2 with the real Qwen2 vocabulary for the server
// tests: one file per test suite and process (ctest runs test cases as
// parallel processes, and each suite removes its file at the end).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "engine/loaded_model.h"
#include "io/gguf.h"
#include "model/synth.h"

namespace kvq {

// Returns the GGUF path, or "" when the vocabulary (scripts/setup.sh) is missing.
inline std::string WriteTinyServerModel(const std::string& tag) {
  const std::string vocab_path =
      std::string(KVQ_DEPS_DIR) + "/llama.cpp/models/ggml-vocab-qwen2.gguf";
  if (!std::filesystem::exists(vocab_path)) return "";
  auto vocab = GgufFile::Open(vocab_path);
  if (!vocab.ok()) return "";
  auto preset = FindSynthPreset("tiny-qwen2");
  if (!preset.ok()) return "";
  ModelConfig config = preset->config;
  config.max_position_embeddings = 256;
  const std::string path =
      (std::filesystem::path(KVQ_BINARY_DIR) / (tag + "_" + std::to_string(::getpid()) + ".gguf"))
          .string();
  SynthOptions options;
  options.seed = 5;
  if (!WriteSynthGguf(config, vocab->get(), options, path).ok()) return "";
  return path;
}

// Base fixture of the server tests: each suite writes its own tiny model file
// (named after the suite, removed when the suite ends) and a test loads it
// with LoadTinyModel. Tests skip when the vocabulary is missing. Derived
// SetUp()s call TinyServerModelTest::SetUp() first and return if IsSkipped().
class TinyServerModelTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path =
        WriteTinyServerModel(testing::UnitTest::GetInstance()->current_test_suite()->name());
    if (!path.empty()) path_ = new std::string(path);
  }
  static void TearDownTestSuite() {
    if (path_ != nullptr) std::filesystem::remove(*path_);
    delete path_;
    path_ = nullptr;
  }
  void SetUp() override {
    if (path_ == nullptr) GTEST_SKIP() << "vocab GGUF missing: run scripts/setup.sh";
  }
  // model_ = the suite's model on `threads` threads (fatal failure if it
  // does not load: wrap in ASSERT_NO_FATAL_FAILURE).
  void LoadTinyModel(int threads) {
    auto loaded = LoadModel(*path_, threads);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    model_ = std::move(loaded).value();
  }

  LoadedModel model_;

 private:
  static inline std::string* path_ = nullptr;
};

// A sample's value from the server's Prometheus text ("name value" line),
// or -1 when the sample is absent.
inline double Metric(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = ("\n" + text).find(key);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + key.size() - 1));
}

}  // namespace kvq
