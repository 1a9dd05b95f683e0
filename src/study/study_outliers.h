// kvq study, part 2: the outlier structure of captured K and V (per layer and
// KV head), and how much attention the first token (the "sink") receives.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "study/study_capture.h"

namespace kvq {

// A channel is an outlier when its mean |x| over tokens exceeds this many
// times the median channel's mean |x| in the same head. Why the median and 4x:
// the median of 64-128 channel magnitudes is unmoved by a handful of outlier
// channels (a mean or max would be dragged by them), and for a head whose
// channels have similar scale (what RoPE's mixing and V produce) the ratio of
// any channel to the median stays within ~2-3x, so 4x flags only channels
// that stand clearly apart -- the few-channels-tens-of-times-larger pattern
// the KIVI/KVQuant papers describe.
inline constexpr double kOutlierRatio = 4.0;

// mean_abs: [head_dim] -> indices (ascending) with mean_abs > ratio * median.
std::vector<int> OutlierChannels(const std::vector<double>& mean_abs, double ratio);

// Fraction of tokens whose m largest-|x| channels (m = |outliers|) are exactly
// the outlier set, for head h of x[tokens, heads, head_dim]: 1.0 means the
// same channels dominate every token (fixed outliers, what per-channel
// quantization exploits). NaN when the set is empty.
double OutlierConsistency(const float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                          int64_t h, const std::vector<int>& outliers);

// Attention sinks (KVSink-style: any token, not only the first, can draw
// attention like a sink). For one (layer, query head) and key position j, let
// R_j be the query rows i with i >= j + kSinkWindow (for j = 0: every row
// i >= 1), m_j the mean over R_j of the causal softmax probability P[i][j],
// and u_j the mean over R_j of 1 / (i + 1) (what uniform attention would give
// j). Token j is a sink when |R_j| >= kSinkWindow, m_j >= kSinkMinMass and
// m_j >= kSinkUniformRatio * u_j. Why these values: the window leaves out
// the local attention every token receives from its next few neighbours
// (which would otherwise make most tokens "sinks" of the rows just after
// them); 0.1 of every later query's attention is two orders of magnitude
// above uniform attention over 1K tokens, and the 10x-uniform condition
// keeps short captures (where 1/(i+1) itself is large) from flagging
// ordinary tokens.
inline constexpr int64_t kSinkWindow = 16;
inline constexpr double kSinkMinMass = 0.1;
inline constexpr double kSinkUniformRatio = 10.0;

struct AttentionSink {
  int64_t head = 0;      // query head
  int64_t position = 0;  // key position j
  double mass = 0;       // m_j
  double uniform = 0;    // u_j
};

// Distribution of a tensor's values in one KV head over every token and channel.
struct TensorStats {
  double mean_abs = 0, rms = 0, absmax = 0;
  double kurtosis = 0;       // E[(x - mean)^4] / var^2 (3 for a Gaussian); NaN if constant
  double token_norm_cv = 0;  // std / mean of the per-token L2 norms of the head vector
};
TensorStats ComputeTensorStats(const float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                               int64_t h);

// probs: [T, T] causal softmax of one head (row i valid for j <= i). Appends
// the sinks of that head to *sinks; returns m_0 (mean over rows 1..T-1 of
// P[i][0]; 0 when T < 2).
double FindAttentionSinks(const float* probs, int64_t tokens, int64_t head,
                          std::vector<AttentionSink>* sinks);

struct LayerOutliers {
  int64_t layer = 0;
  std::vector<std::vector<double>> k_pre_mean_abs;   // [kv_heads][head_dim], mean over tokens
  std::vector<std::vector<double>> k_post_mean_abs;  // [kv_heads][head_dim]
  std::vector<std::vector<double>> v_mean_abs;       // [kv_heads][head_dim]
  std::vector<std::vector<int>> k_pre_outliers;      // [kv_heads][...]
  std::vector<std::vector<int>> k_post_outliers;     // [kv_heads][...]
  std::vector<std::vector<int>> v_outliers;          // [kv_heads][...]
  std::vector<double> k_pre_consistency;             // [kv_heads], NaN without outliers
  std::vector<double> k_post_consistency;            // [kv_heads], NaN without outliers
  // Mean over query heads and query rows 1..T-1 of the causal attention
  // probability on token 0 (row 0 is excluded: it can only attend to itself).
  double sink_mass = 0;
  std::vector<double> sink_mass_heads;  // [num_heads]: the same per query head
  std::vector<AttentionSink> sinks;     // every (head, token) passing the sink rule
  std::vector<TensorStats> k_pre_stats, k_post_stats, v_stats;  // [kv_heads]
};

// k_proj bias norms per layer (Qwen2's first/last-layer spike, SCHEMES.md).
// A layer is a spike when the L2 norm of its whole k_proj bias (every KV
// head) exceeds kBiasSpikeRatio times the median layer's: the median of the
// layers is unmoved by the two boundary layers, and the reported Qwen2 spike
// is 25-40x (605 and 921 vs ~22 on the 7B), so 4x (the outlier-channel
// ratio) flags it with room to spare while ordinary layer-to-layer variation
// (within ~2x) stays unflagged.
inline constexpr double kBiasSpikeRatio = 4.0;
struct KBiasSummary {
  std::vector<double> layer_norms;  // [layers]
  double median = 0;
  std::vector<double> ratio_to_median;  // [layers]
  std::vector<int64_t> spikes;          // layers above the ratio, ascending
  bool boundary_spike = false;          // the first or the last layer is a spike
};
// per_head: [layers][kv_heads] (KBiasNorms); empty -> an empty summary.
KBiasSummary SummarizeKBias(const std::vector<std::vector<double>>& per_head);

// O(layers * heads * T^2 * head_dim) for the sink mass; the rest is linear.
std::vector<LayerOutliers> AnalyzeOutliers(
    const StudyCapture& capture, const std::function<void(int64_t, int64_t)>& on_layer = nullptr);

}  // namespace kvq
