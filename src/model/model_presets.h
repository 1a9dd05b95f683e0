// Shapes of well-known models, for planning memory without their weights
// (`kvq plan -m Llama-3-8B`). Only what the planner needs: the transformer
// shape and enough architecture detail to count parameters exactly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/model_config.h"

namespace kvq {

struct ModelPreset {
  const char* name;
  const char* source;  // where the numbers come from (the model's config.json)
  ModelConfig config;
  // Llama/Qwen: SwiGLU (gate, up, down) and RMSNorm (weight only) before
  // attention and before the MLP. Falcon-7B: a plain GELU MLP (up, down), one
  // LayerNorm (weight and bias) per layer feeding attention and MLP in parallel.
  bool gated_ffn = true;
  int64_t norm_params_per_layer = 0;  // every norm's weights (and biases) in one layer
  int64_t final_norm_params = 0;
};

const std::vector<ModelPreset>& ModelPresets();
// Case-insensitive; the error lists the names.
StatusOr<ModelPreset> FindModelPreset(std::string_view name);

// Exact parameter count (tied embeddings counted once).
int64_t PresetParameterCount(const ModelPreset& preset);

}  // namespace kvq
