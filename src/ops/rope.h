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

#include <cstddef>
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

// cos/sin of every RoPE angle for positions [0, max_positions), for code
// that rotates many stored rows per step (a cache that keeps K before RoPE
// rotates every cached key at every decode step; Rope's two double-precision
// trig calls per channel pair would cost ~20x the attention itself).
//
// Factored to stay small: position p = c * step + f uses a coarse row for
// c * step and a fine row for f (angle-addition formulas in f32), so the
// table holds ceil(max_positions / step) + step rows of head_dim floats
// instead of max_positions rows. Both rows are Rope's values (HF's f32 angle
// of their position, cos/sin rounded from double), so Apply equals Rope at
// multiples of step, and elsewhere differs from it by the f32 rounding of
// the angle (|f32(p * inv_freq) - (f32(c step inv_freq) + f32(f inv_freq))|
// <= 1.5 ulp of the angle) plus a few f32 ulps of the products.
class RopeTable {
 public:
  // Errors: inv_freq empty or longer than kMaxRopeHeadDim / 2,
  // max_positions or step not positive.
  static StatusOr<RopeTable> Make(RopeLayout layout, const std::vector<float>& inv_freq,
                                  int64_t max_positions, int64_t step);
  // What Make allocates for head_dim = 2 * inv_freq.size(), in bytes.
  static size_t Bytes(int64_t head_dim, int64_t max_positions, int64_t step);

  // Rotates x[n, head_dim] (rows of one head) in place; row i takes
  // position first + i; first + n <= max_positions.
  void Apply(int64_t first, int64_t n, float* x) const;

 private:
  RopeTable() = default;
  RopeLayout layout_ = RopeLayout::kHalves;
  int64_t half_ = 0, step_ = 0;
  std::vector<float> coarse_;  // [ceil(max_positions / step), 2, half]: cos, sin of c * step
  std::vector<float> fine_;    // [step, 2, half]: cos, sin of f
};

}  // namespace kvq::ops
