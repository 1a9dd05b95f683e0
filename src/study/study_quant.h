// kvq study, part 3: fake quantization of captured K/V and what it does to
// attention (SCHEMES.md's experiment, with correct b-bit quantizers).
//
// Quantizers (reference code, not kernels; the real caches are in src/kv):
// - kAsymmetric: b-bit min/max over a group, exactly 2^b levels
//   min + i * step, i = 0 .. 2^b - 1, step = (max - min) / (2^b - 1); round to
//   nearest, so |x - x^| <= step / 2. A constant group is reproduced exactly.
// - kLiteralWriteup: the shared write-up's formula, kept only to reproduce
//   its table: symmetric, qmax = 2^b - 1, scale = absmax / qmax,
//   q = clamp(round(x / scale), -qmax - 1, qmax), i.e. 2^(b+1) levels (its
//   "2-bit" grid has 8 levels: a 3-bit symmetric quantizer).
// Axes, for a [tokens, heads, head_dim] tensor:
// - per-token: one group = the head_dim channels of one (token, head) (the
//   whole head vector, 64 or 128 values: like a cache's per-token row), or
//   consecutive blocks of `channel_group` of them (KIVI's V groups of 32);
// - per-channel: one group = one channel of one head over a block of
//   `token_group` consecutive tokens (KIVI's G, default 32; the last block
//   may be shorter), or over the WHOLE sequence when token_group is 0 (what
//   the write-up's fake_quant does: its per-channel scale is the absmax of a
//   channel over every captured token).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "study/study_capture.h"

namespace kvq {

enum class QuantFormula { kAsymmetric, kLiteralWriteup };
enum class QuantAxis { kToken, kChannel };

// Quantize-dequantize n values x[i * stride] into out[i * stride].
void FakeQuantGroup(const float* x, int64_t n, int64_t stride, int bits, QuantFormula formula,
                    float* out);

struct QuantSpec {
  QuantAxis axis = QuantAxis::kToken;
  int bits = 4;
  QuantFormula formula = QuantFormula::kAsymmetric;
  int64_t token_group = 32;   // per-channel: tokens per statistics block (0 = all tokens)
  int64_t channel_group = 0;  // per-token: channels per block (0 = the whole head vector)
};

// x, out: [tokens, heads, head_dim]; out may not alias x.
void FakeQuantize(const float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                  const QuantSpec& spec, float* out);

// Causal attention of one head, plain scalar code in the model's convention:
// scores[i][j] = scale * q_i . k_j for j <= i.
// q: [T, d], k: [T, d], scores: [T, T] (row i valid for j <= i).
void CausalScores(const float* q, const float* k, int64_t tokens, int64_t head_dim, float scale,
                  float* scores);
// Row-wise softmax over j <= i, in place (double accumulation).
void CausalSoftmax(int64_t tokens, float* probs);
// out[i] = sum_j<=i p[i][j] v_j.  probs: [T, T], v: [T, d], out: [T, d].
void CausalOutput(const float* probs, const float* v, int64_t tokens, int64_t head_dim, float* out);

struct FakeQuantMetrics {
  double score_rel_error = 0;   // ||S^ - S||_F / ||S||_F over causal entries
  double prob_kl = 0;           // mean over query rows of KL(P || P^), nats
  double output_rel_error = 0;  // ||O^ - O||_F / ||O||_F
};

// Which experiment a row belongs to: the write-up's fake_quant as written
// (its formula, per-channel over the whole sequence, post-RoPE K), the same
// four groupings with correct b-bit quantizers and KIVI's 32-token groups,
// or KVQuant's pre-RoPE per-channel K.
enum class FakeQuantFamily { kWriteup, kCorrected, kKvQuant };
const char* FakeQuantFamilyName(FakeQuantFamily family);  // "writeup" / "corrected" / "kvquant"

struct FakeQuantRow {
  std::string name;
  FakeQuantFamily family = FakeQuantFamily::kCorrected;
  QuantAxis k_axis = QuantAxis::kToken, v_axis = QuantAxis::kToken;
  QuantFormula formula = QuantFormula::kAsymmetric;
  bool k_pre_rope = false;  // K quantized before RoPE, RoPE applied after dequantization
  int bits = 4;
  int64_t token_group = 32;   // per-channel statistics block, tokens (0 = the whole sequence)
  int64_t channel_group = 0;  // per-token statistics block, channels (0 = the head vector)
  FakeQuantMetrics overall;
  std::vector<FakeQuantMetrics> per_layer;  // [num_layers]
};

// The rows the study reports, at every bit width: the write-up's four rows
// as written (literal formula, per-channel over the whole sequence, per-token
// over the head vector), the same four with correct b-bit quantizers and
// KIVI's groups (per-channel over `kivi_group` tokens, per-token over
// `kivi_group` channels), and KVQuant's pre-RoPE per-channel K with per-token
// V (KIVI's groups too).
std::vector<FakeQuantRow> StudyFakeQuantRows(const std::vector<int>& bits, int64_t kivi_group = 32);

// The four groupings of the write-up's table, in its order; the row names
// of both the writeup and corrected families are "<prefix><grouping>".
inline constexpr const char* kWriteupGroupings[4] = {"K,V per-token", "K,V per-channel",
                                                     "K per-channel, V per-token (KIVI)",
                                                     "K per-token, V per-channel"};
inline constexpr const char* kWriteupPrefix = "as written: ";
inline constexpr const char* kCorrectedPrefix = "corrected: ";
// The score errors the write-up reported for Qwen2.5-0.5B (SCHEMES.md), per
// grouping, at 2 and 4 bits: quoted figures, not measurements.
inline constexpr double kWriteupReported[4][2] = {
    {0.786, 0.401}, {0.623, 0.215}, {0.623, 0.215}, {0.786, 0.401}};

struct FakeQuantOptions {
  int threads = 1;  // query heads in parallel (the result does not depend on it)
  // The model's RoPE (MakeRopeApplier); needed only by k_pre_rope rows.
  RopeApplier rope;
};

// Fills overall and per_layer of every row. Cost: O(layers * heads * T^2 *
// head_dim) per distinct K choice and per row. on_layer(done, total).
Status RunFakeQuant(const StudyCapture& capture, const FakeQuantOptions& options,
                    std::vector<FakeQuantRow>* rows,
                    const std::function<void(int64_t, int64_t)>& on_layer = nullptr);

const char* QuantAxisName(QuantAxis axis);  // "token" / "channel"

}  // namespace kvq
