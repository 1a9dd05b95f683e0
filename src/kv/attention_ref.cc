#include "kv/attention_ref.h"

#include <cmath>
#include <vector>

namespace kvq {

void AttentionRef(const float* q, const float* k, const float* v, int64_t n, int64_t total,
                  int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale,
                  float* out) {
  const int64_t group = num_heads / num_kv_heads;
  std::vector<double> scores(static_cast<size_t>(total));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t visible = total - n + i + 1;
    for (int64_t h = 0; h < num_heads; ++h) {
      const int64_t g = h / group;
      const float* qh = q + (i * num_heads + h) * head_dim;
      double max_score = -INFINITY;
      for (int64_t t = 0; t < visible; ++t) {
        const float* kt = k + (t * num_kv_heads + g) * head_dim;
        double dot = 0;
        for (int64_t d = 0; d < head_dim; ++d) dot += static_cast<double>(qh[d]) * kt[d];
        scores[t] = dot * scale;
        max_score = std::max(max_score, scores[t]);
      }
      double sum = 0;
      for (int64_t t = 0; t < visible; ++t) {
        scores[t] = std::exp(scores[t] - max_score);
        sum += scores[t];
      }
      float* oh = out + (i * num_heads + h) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) {
        double acc = 0;
        for (int64_t t = 0; t < visible; ++t)
          acc += scores[t] * v[(t * num_kv_heads + g) * head_dim + d];
        oh[d] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace kvq
