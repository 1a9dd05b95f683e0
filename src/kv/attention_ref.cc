#include "kv/attention_ref.h"

namespace kvq {

void AttentionRef(const float* q, const float* k, const float* v, int64_t n, int64_t total,
                  int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale,
                  float* out) {
  const int64_t group = num_heads / num_kv_heads;
  auto score = [&](int64_t i, int64_t h, int64_t t) {
    const float* qh = q + (i * num_heads + h) * head_dim;
    const float* kt = k + (t * num_kv_heads + h / group) * head_dim;
    double dot = 0;
    for (int64_t d = 0; d < head_dim; ++d) dot += static_cast<double>(qh[d]) * kt[d];
    return dot * scale;
  };
  AttentionRefScored(score, v, n, total, num_heads, num_kv_heads, head_dim, out);
}

}  // namespace kvq
