// kvq study, part 1: capture the real q, K (before and after RoPE) and V of a
// forward pass over a text, and write them as safetensors for other tools.
//
// Dump format (--dump FILE, one safetensors file, every tensor F32):
//   layers.{L}.q           [tokens, num_heads, head_dim]     RoPE applied, unscaled
//   layers.{L}.k_pre_rope  [tokens, num_kv_heads, head_dim]  k_proj(x) + bias
//   layers.{L}.k_post_rope [tokens, num_kv_heads, head_dim]  RoPE(k_pre_rope) at positions 0..
//   layers.{L}.v           [tokens, num_kv_heads, head_dim]
//   token_ids              [tokens] stored as F32 (ids < 2^24 are exact)
// __metadata__: "format" = "kvq-study-capture-v1", "num_layers", "num_heads",
// "num_kv_heads", "head_dim", "tokens", "rope_theta", "rope_layout" ("halves"
// = HF rotate_half pairs (i, i + d/2), "pairs" = (2i, 2i + 1)), "model".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/loaded_model.h"
#include "kv/kv_cache.h"

namespace kvq {

struct LayerCapture {
  std::vector<float> q;           // [tokens, num_heads, head_dim], RoPE applied
  std::vector<float> k_pre_rope;  // [tokens, num_kv_heads, head_dim]
  std::vector<float> k;           // [tokens, num_kv_heads, head_dim], RoPE applied
  std::vector<float> v;           // [tokens, num_kv_heads, head_dim]
};

struct StudyCapture {
  KvShape shape;
  int64_t tokens = 0;
  std::vector<int32_t> token_ids;    // [tokens]
  std::vector<LayerCapture> layers;  // [num_layers]

  // Element (t, h, c) of a [tokens, heads, head_dim] buffer.
  static int64_t Index(int64_t t, int64_t h, int64_t c, int64_t heads, int64_t head_dim) {
    return (t * heads + h) * head_dim + c;
  }
};

// Runs `tokens` (positions 0..n-1, one sequence) through the model with an
// f32 cache, `batch` tokens per forward call, and records every layer.
// `on_chunk(done, total)` reports progress after each forward call.
StatusOr<StudyCapture> CaptureKv(LoadedModel& model, const std::vector<int32_t>& tokens,
                                 int64_t batch,
                                 const std::function<void(int64_t, int64_t)>& on_chunk = nullptr);

// RoPE exactly as the model applies it (ops::Rope with the model's inv_freq,
// scaling and pair layout): rotates x[tokens, heads, head_dim] in place at
// positions 0..tokens-1. Used for pre-RoPE fake quantization and to check a
// dump (k_post_rope == RoPE(k_pre_rope)).
using RopeApplier = std::function<void(float* x, int64_t tokens, int64_t heads)>;
StatusOr<RopeApplier> MakeRopeApplier(const ModelConfig& config);

// Writes the capture in the format documented above. `model_name` goes to
// the metadata.
Status WriteCaptureSafetensors(const StudyCapture& capture, const ModelConfig& config,
                               const std::string& model_name, const std::string& path);

}  // namespace kvq
