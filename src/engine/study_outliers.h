// kvq study, part 2: the outlier structure of captured K and V (per layer and
// KV head), and how much attention the first token (the "sink") receives.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/study_capture.h"

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
};

// O(layers * heads * T^2 * head_dim) for the sink mass; the rest is linear.
std::vector<LayerOutliers> AnalyzeOutliers(
    const StudyCapture& capture, const std::function<void(int64_t, int64_t)>& on_layer = nullptr);

}  // namespace kvq
