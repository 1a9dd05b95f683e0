// Format-independent description of a decoder-only transformer. Both GGUF
// metadata and Hugging Face config.json are parsed into this one struct.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "ops/rope.h"

namespace kvq {

enum class Architecture : uint8_t { kQwen2, kLlama };
const char* ArchitectureName(Architecture arch);  // "qwen2" / "llama"

// How RoPE pairs channels. Hugging Face Qwen2 and Llama rotate halves
// (x[i], x[i + d/2]); llama.cpp's converter permutes Llama's q/k weights so a
// Llama GGUF pairs neighbours (x[2i], x[2i+1]). Recording the layout lets
// both load without rewriting weights.
enum class RopeLayout : uint8_t { kHalves, kPairs };

struct RopeScaling {
  enum class Type : uint8_t { kNone, kLlama3 } type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Architecture arch = Architecture::kQwen2;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_heads unless the config says otherwise
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  RopeLayout rope_layout = RopeLayout::kHalves;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 2048;
  bool attention_bias = false;  // q/k/v projections carry a bias (Qwen2)

  // K and V bytes per token across all layers at 2 bytes per value.
  int64_t KvBytesPerTokenF16() const { return 2 * num_layers * num_kv_heads * head_dim * 2; }
};

// The model's RoPE in the kernels' terms: inverse frequencies with its scaling
// applied, and its channel pairing. The transformer and the study's pre-RoPE
// capture both take it from here, so they rotate alike.
struct OpsRope {
  std::vector<float> inv_freq;  // [head_dim / 2]
  ops::RopeLayout layout = ops::RopeLayout::kHalves;
};
StatusOr<OpsRope> MakeOpsRope(const ModelConfig& c);

}  // namespace kvq
