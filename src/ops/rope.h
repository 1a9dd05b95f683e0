// Rotary position embedding (RoPE): inverse frequencies computed once per
// model (including Llama-3 rope scaling), then applied in place to q or k.
//
// Angle precision follows Hugging Face transformers, the models' training
// code: inv_freq is f32, the angle is the f32 product f32(pos) * inv_freq[i]
// (as HF's f32 matmul of inv_freq by position_ids), and cos/sin of that f32
// angle are then evaluated accurately (in double, rounded to f32, i.e. within
// torch's f32 cos/sin ulp). llama.cpp differs slightly: it builds
// pos * base^(-2i/d) by repeated f32 multiplication, which drifts by a few
// ulp of the angle for high i. Both twins here use the HF convention, so
// their comparison tests rotation arithmetic, not angle conventions.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"

namespace kvq::ops {

// Largest head_dim supported (the kernel keeps per-token cos/sin tables of
// this size on the stack).
inline constexpr int64_t kMaxRopeHeadDim = 1024;

// How channels of a head pair up for rotation.
enum class RopeLayout {
  kHalves,  // HF rotate_half (Qwen2/Llama in HF layout): pairs (i, i + d/2)
  kPairs,   // llama.cpp LLAMA_ROPE_TYPE_NORM: pairs (2i, 2i + 1)
};

// The rope_scaling block of a HF config.json.
struct RopeScaling {
  enum class Kind { kNone, kLinear, kLlama3 };
  Kind kind = Kind::kNone;
  float factor = 1.0f;                              // kLinear and kLlama3
  float low_freq_factor = 1.0f;                     // kLlama3
  float high_freq_factor = 4.0f;                    // kLlama3
  int64_t original_max_position_embeddings = 8192;  // kLlama3
};

// inv_freq[head_dim / 2] for rope_theta, exactly as HF's
// _compute_default_rope_parameters (+ _compute_linear_scaling... /
// _compute_llama3_parameters) computes it, step by step in f32.
// Errors: odd or non-positive head_dim, theta <= 0, factor <= 0, llama3
// high_freq_factor <= low_freq_factor.
StatusOr<std::vector<float>> RopeInvFreq(int64_t head_dim, float theta, const RopeScaling& scaling);

// Same quantities in double, straight from the formulas (the reference the
// test holds RopeInvFreq to, within f32 rounding).
std::vector<double> RopeInvFreqRef(int64_t head_dim, double theta, const RopeScaling& scaling);

// Rotates x[n_tokens, n_heads, head_dim] in place; token t uses position
// positions[t]. inv_freq has head_dim / 2 entries (from RopeInvFreq);
// head_dim <= kMaxRopeHeadDim.
void Rope(RopeLayout layout, const float* inv_freq, const int32_t* positions, int64_t n_tokens,
          int64_t n_heads, int64_t head_dim, float* x);
void RopeRef(RopeLayout layout, const float* inv_freq, const int32_t* positions, int64_t n_tokens,
             int64_t n_heads, int64_t head_dim, float* x);

}  // namespace kvq::ops
