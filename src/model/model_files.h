// Opening a model: a .gguf file or a Hugging Face folder becomes one
// format-independent ModelFiles (config, tensors under canonical names,
// tokenizer spec), with every expected tensor present and shape-checked.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "io/tensor.h"
#include "model/model_config.h"
#include "model/tokenizer_spec.h"

namespace kvq {

enum class ModelFormat : uint8_t { kGguf, kHuggingFace };
const char* ModelFormatName(ModelFormat format);  // "GGUF" / "Hugging Face"

struct ModelFiles {
  ModelConfig config;
  // Canonical (GGUF) names, in ExpectedTensors order; data points into maps
  // owned below, so a ModelFiles may be moved but the TensorRefs stay valid.
  std::vector<TensorRef> tensors;
  const TensorRef* Find(std::string_view name) const;  // nullptr if absent
  TokenizerSpec tokenizer;
  std::string source;  // the path given to OpenModel
  ModelFormat format = ModelFormat::kGguf;

  // Owned storage (one of the two is used).
  std::unique_ptr<GgufFile> gguf;
  SafetensorsSet safetensors;
};

// `path` is a .gguf file or a folder with config.json, model.safetensors (or
// model.safetensors.index.json + shards), tokenizer.json and
// tokenizer_config.json. Errors name the file and the problem.
StatusOr<ModelFiles> OpenModel(const std::string& path);

// Checks `tensors` (canonical names) against what `config` implies: every
// required tensor present with the right shape, no unknown tensors. Returns
// them in ExpectedTensors order. `source` prefixes errors.
StatusOr<std::vector<TensorRef>> CheckModelTensors(const ModelConfig& config,
                                                   const std::vector<TensorRef>& tensors,
                                                   const std::string& source);

// Total element count of `tensors` (the parameter count, tied embeddings
// counted once).
int64_t CountParameters(const std::vector<TensorRef>& tensors);

}  // namespace kvq
