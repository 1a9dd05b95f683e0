// Hugging Face config.json <-> ModelConfig, for Qwen2ForCausalLM and
// LlamaForCausalLM.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "model/model_config.h"

namespace kvq {

// Parses config.json text; `name` (normally the path) prefixes errors.
// The result has rope_layout kHalves (Hugging Face rotates halves) and is
// checked with ValidateModelConfig.
StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, const std::string& name);
StatusOr<ModelConfig> LoadHfConfig(const std::string& path);

// config.json text describing `config` (as transformers would write it).
std::string HfConfigJson(const ModelConfig& config);

// Sanity limits shared by both formats: positive sizes, heads dividing
// evenly, even head_dim, sizes small enough that shape arithmetic cannot
// overflow. Errors name the offending field.
Status ValidateModelConfig(const ModelConfig& config);

}  // namespace kvq
