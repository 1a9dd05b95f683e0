// A random-weight tiny Qwen2 with the real Qwen2 vocabulary for the server
// tests: one file per test suite and process (ctest runs test cases as
// parallel processes, and each suite removes its file at the end).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

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

// A sample's value from the server's Prometheus text ("name value" line),
// or -1 when the sample is absent.
inline double Metric(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = ("\n" + text).find(key);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + key.size() - 1));
}

}  // namespace kvq
