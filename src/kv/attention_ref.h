// Plain causal grouped-query attention over f32 arrays: the truth every KV
// cache's Attend is tested against.
#pragma once

#include <cstdint>

namespace kvq {

// q:   [n, num_heads, head_dim]      queries for the last n of `total` tokens
// k,v: [total, num_kv_heads, head_dim]
// out: [n, num_heads, head_dim]
// Query i sees tokens [0, total - n + i]; query head h reads KV head
// h / (num_heads / num_kv_heads). Accumulates in double.
void AttentionRef(const float* q, const float* k, const float* v, int64_t n, int64_t total,
                  int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale,
                  float* out);

}  // namespace kvq
