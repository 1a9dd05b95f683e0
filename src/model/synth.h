// Synthetic models: seeded random weights with the exact shapes of real
// models, for tests and benchmarks when real weights are not available.
// The same (config, seed) gives the same model in GGUF and in Hugging Face
// layout (the GGUF copy carries llama.cpp's q/k row permutation for Llama).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "io/gguf.h"
#include "io/tensor.h"
#include "model/model_config.h"

namespace kvq {

struct SynthPreset {
  const char* name;
  const char* description;
  ModelConfig config;  // vocab_size is the real model's; synth uses the vocab file's
};
// The one presets table.
const std::vector<SynthPreset>& SynthPresets();
StatusOr<SynthPreset> FindSynthPreset(std::string_view name);  // error lists the names

struct SynthOptions {
  uint64_t seed = 0;
  // Storage type of 2-D weights. Norms, biases and rope factors stay F32;
  // Q8_0 falls back to F16 for rows whose length is not a multiple of 32.
  DType dtype = DType::kF32;
  std::string name = "kvq-synth";  // general.name
};

// Writes a GGUF llama.cpp can load. config.vocab_size is replaced by the
// vocabulary's token count and every tokenizer.* key of `vocab` is copied.
// With vocab == nullptr a 256-token byte-level vocabulary (plus
// <|endoftext|>) is generated, so tests need no external files.
Status WriteSynthGguf(ModelConfig config, const GgufFile* vocab, const SynthOptions& options,
                      const std::string& out_path);

// Writes config.json and model.safetensors (F32/F16/BF16) to `out_dir`
// (created if needed), with the same weights WriteSynthGguf would write for
// the same config and seed. Tokenizer files are not written: copy them in.
Status WriteSynthHfFolder(const ModelConfig& config, const SynthOptions& options,
                          const std::string& out_dir);

// The float values of one synthetic tensor (canonical name, Hugging Face row
// order), for tests that compare against the files.
std::vector<float> SynthTensorValues(const ModelConfig& config, uint64_t seed,
                                     const std::string& name, const std::vector<int64_t>& shape);

}  // namespace kvq
