#include "study/study_outliers.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "study/study_quant.h"

namespace kvq {
namespace {

// [kv_heads][head_dim] mean |x| over tokens of x[tokens, heads, head_dim].
std::vector<std::vector<double>> ChannelMeanAbs(const std::vector<float>& x, int64_t tokens,
                                                int64_t heads, int64_t head_dim) {
  std::vector<std::vector<double>> mean(heads, std::vector<double>(head_dim, 0.0));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* row = x.data() + (t * heads + h) * head_dim;
      for (int64_t c = 0; c < head_dim; ++c) mean[h][c] += std::fabs(row[c]);
    }
  }
  for (auto& head : mean) {
    for (double& m : head) m /= static_cast<double>(std::max<int64_t>(tokens, 1));
  }
  return mean;
}

}  // namespace

TensorStats ComputeTensorStats(const float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                               int64_t h) {
  TensorStats s;
  const double n = static_cast<double>(tokens * head_dim);
  if (n <= 0) return s;
  double sum = 0, sum_abs = 0, sum_sq = 0, norm_sum = 0, norm_sq = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = x + (t * heads + h) * head_dim;
    double row_sq = 0;
    for (int64_t c = 0; c < head_dim; ++c) {
      const double v = row[c];
      sum += v;
      sum_abs += std::fabs(v);
      row_sq += v * v;
      s.absmax = std::max(s.absmax, std::fabs(v));
    }
    sum_sq += row_sq;
    norm_sum += std::sqrt(row_sq);
    norm_sq += row_sq;
  }
  const double mean = sum / n;
  s.mean_abs = sum_abs / n;
  s.rms = std::sqrt(sum_sq / n);
  double m2 = 0, m4 = 0;  // central moments, second pass for accuracy
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = x + (t * heads + h) * head_dim;
    for (int64_t c = 0; c < head_dim; ++c) {
      const double d = row[c] - mean;
      m2 += d * d;
      m4 += d * d * d * d;
    }
  }
  m2 /= n;
  m4 /= n;
  s.kurtosis = m2 > 0 ? m4 / (m2 * m2) : std::numeric_limits<double>::quiet_NaN();
  const double norm_mean = norm_sum / static_cast<double>(tokens);
  const double norm_var =
      std::max(0.0, norm_sq / static_cast<double>(tokens) - norm_mean * norm_mean);
  s.token_norm_cv = norm_mean > 0 ? std::sqrt(norm_var) / norm_mean : 0;
  return s;
}

double FindAttentionSinks(const float* probs, int64_t T, int64_t head,
                          std::vector<AttentionSink>* sinks) {
  double m0 = 0;
  for (int64_t j = 0; j < T; ++j) {
    const int64_t first = j == 0 ? 1 : j + kSinkWindow;
    const int64_t rows = T - first;
    if (rows < 1) break;
    double mass = 0, uniform = 0;
    for (int64_t i = first; i < T; ++i) {
      mass += probs[i * T + j];
      uniform += 1.0 / static_cast<double>(i + 1);
    }
    mass /= static_cast<double>(rows);
    uniform /= static_cast<double>(rows);
    if (j == 0) m0 = mass;
    if (rows >= kSinkWindow && mass >= kSinkMinMass && mass >= kSinkUniformRatio * uniform) {
      sinks->push_back({head, j, mass, uniform});
    }
  }
  return m0;
}

KBiasSummary SummarizeKBias(const std::vector<std::vector<double>>& per_head) {
  KBiasSummary s;
  for (const std::vector<double>& heads : per_head) {
    double sq = 0;
    for (double n : heads) sq += n * n;
    s.layer_norms.push_back(std::sqrt(sq));
  }
  if (s.layer_norms.empty()) return s;
  std::vector<double> sorted = s.layer_norms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  s.median = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  for (size_t l = 0; l < n; ++l) {
    const double r = s.median > 0 ? s.layer_norms[l] / s.median : 0;
    s.ratio_to_median.push_back(r);
    if (s.median > 0 && r > kBiasSpikeRatio) s.spikes.push_back(static_cast<int64_t>(l));
  }
  for (int64_t l : s.spikes) s.boundary_spike |= l == 0 || l == static_cast<int64_t>(n) - 1;
  return s;
}

std::vector<int> OutlierChannels(const std::vector<double>& mean_abs, double ratio) {
  std::vector<int> out;
  if (mean_abs.empty()) return out;
  std::vector<double> sorted = mean_abs;
  const size_t mid = sorted.size() / 2;
  std::nth_element(sorted.begin(), sorted.begin() + mid, sorted.end());
  double median = sorted[mid];
  if (sorted.size() % 2 == 0) {
    median = 0.5 * (median + *std::max_element(sorted.begin(), sorted.begin() + mid));
  }
  for (size_t c = 0; c < mean_abs.size(); ++c) {
    if (mean_abs[c] > ratio * median) out.push_back(static_cast<int>(c));
  }
  return out;
}

double OutlierConsistency(const float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                          int64_t h, const std::vector<int>& outliers) {
  if (outliers.empty() || tokens < 1) return std::numeric_limits<double>::quiet_NaN();
  const size_t m = outliers.size();
  std::vector<int> order(head_dim);  // channel indices, largest |x| first
  int64_t hits = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = x + (t * heads + h) * head_dim;
    for (int64_t c = 0; c < head_dim; ++c) order[c] = static_cast<int>(c);
    std::partial_sort(order.begin(), order.begin() + m, order.end(),
                      [row](int a, int b) { return std::fabs(row[a]) > std::fabs(row[b]); });
    std::sort(order.begin(), order.begin() + m);
    hits += std::equal(outliers.begin(), outliers.end(), order.begin()) ? 1 : 0;
  }
  return static_cast<double>(hits) / static_cast<double>(tokens);
}

std::vector<LayerOutliers> AnalyzeOutliers(const StudyCapture& capture,
                                           const std::function<void(int64_t, int64_t)>& on_layer) {
  const KvShape& s = capture.shape;
  const int64_t T = capture.tokens, d = s.head_dim, kvh = s.num_kv_heads;
  const int64_t group = kvh > 0 ? s.num_heads / kvh : 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<LayerOutliers> result;
  std::vector<float> qh(T * d), kh(T * d), scores(T * T);  // [T, d], [T, d], [T, T]
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const LayerCapture& c = capture.layers[l];
    LayerOutliers out;
    out.layer = l;
    out.k_pre_mean_abs = ChannelMeanAbs(c.k_pre_rope, T, kvh, d);
    out.k_post_mean_abs = ChannelMeanAbs(c.k, T, kvh, d);
    out.v_mean_abs = ChannelMeanAbs(c.v, T, kvh, d);
    for (int64_t h = 0; h < kvh; ++h) {
      out.k_pre_outliers.push_back(OutlierChannels(out.k_pre_mean_abs[h], kOutlierRatio));
      out.k_post_outliers.push_back(OutlierChannels(out.k_post_mean_abs[h], kOutlierRatio));
      out.v_outliers.push_back(OutlierChannels(out.v_mean_abs[h], kOutlierRatio));
      out.k_pre_consistency.push_back(
          OutlierConsistency(c.k_pre_rope.data(), T, kvh, d, h, out.k_pre_outliers.back()));
      out.k_post_consistency.push_back(
          OutlierConsistency(c.k.data(), T, kvh, d, h, out.k_post_outliers.back()));
      out.k_pre_stats.push_back(ComputeTensorStats(c.k_pre_rope.data(), T, kvh, d, h));
      out.k_post_stats.push_back(ComputeTensorStats(c.k.data(), T, kvh, d, h));
      out.v_stats.push_back(ComputeTensorStats(c.v.data(), T, kvh, d, h));
    }
    double sink = 0;
    int64_t rows = 0;
    for (int64_t h = 0; h < s.num_heads && T > 1; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        std::copy_n(c.q.data() + (t * s.num_heads + h) * d, d, qh.data() + t * d);
        std::copy_n(c.k.data() + (t * kvh + h / group) * d, d, kh.data() + t * d);
      }
      CausalScores(qh.data(), kh.data(), T, d, scale, scores.data());
      CausalSoftmax(T, scores.data());
      for (int64_t i = 1; i < T; ++i) sink += scores[i * T];
      rows += T - 1;
      out.sink_mass_heads.push_back(FindAttentionSinks(scores.data(), T, h, &out.sinks));
    }
    out.sink_mass = rows > 0 ? sink / static_cast<double>(rows) : 0;
    result.push_back(std::move(out));
    if (on_layer) on_layer(l + 1, s.num_layers);
  }
  return result;
}

}  // namespace kvq
