// Plain causal grouped-query attention over f32 arrays: the truth every KV
// cache's Attend is tested against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace kvq {

// The softmax and V sum of AttentionRef over scores from `score(i, h, t)`
// (double, already scaled): for caches whose scores are not q . k of one
// decoded K (tests replay such a codec's own scores through it).
// v: [total, num_kv_heads, head_dim]; out: [n, num_heads, head_dim].
template <class ScoreFn>
void AttentionRefScored(const ScoreFn& score, const float* v, int64_t n, int64_t total,
                        int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float* out) {
  const int64_t group = num_heads / num_kv_heads;
  std::vector<double> p(static_cast<size_t>(total));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t visible = total - n + i + 1;
    for (int64_t h = 0; h < num_heads; ++h) {
      const int64_t g = h / group;
      double max_score = -INFINITY;
      for (int64_t t = 0; t < visible; ++t) {
        p[t] = score(i, h, t);
        max_score = std::max(max_score, p[t]);
      }
      double sum = 0;
      for (int64_t t = 0; t < visible; ++t) {
        p[t] = std::exp(p[t] - max_score);
        sum += p[t];
      }
      float* oh = out + (i * num_heads + h) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) {
        double acc = 0;
        for (int64_t t = 0; t < visible; ++t)
          acc += p[t] * v[(t * num_kv_heads + g) * head_dim + d];
        oh[d] = static_cast<float>(acc / sum);
      }
    }
  }
}

// q:   [n, num_heads, head_dim]      queries for the last n of `total` tokens
// k,v: [total, num_kv_heads, head_dim]
// out: [n, num_heads, head_dim]
// Query i sees tokens [0, total - n + i]; query head h reads KV head
// h / (num_heads / num_kv_heads). Accumulates in double.
void AttentionRef(const float* q, const float* k, const float* v, int64_t n, int64_t total,
                  int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale,
                  float* out);

}  // namespace kvq
