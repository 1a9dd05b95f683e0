#include "kv/streaming.h"

#include <cstring>

namespace kvq {

void KvStaging::Allocate(const KvStreaming& st, int64_t kv_heads, size_t f16_row_bytes) {
  const size_t heads = static_cast<size_t>(kv_heads);
  ring.resize(heads * static_cast<size_t>(st.ResidualCapacity()) * f16_row_bytes);
  sinks.resize(heads * static_cast<size_t>(st.sink_tokens) * f16_row_bytes);
  detected.assign(static_cast<size_t>(st.detect_sinks), -1);
  detected_mass.assign(static_cast<size_t>(st.detect_sinks), 0.0f);
  detected_rows.resize(heads * static_cast<size_t>(st.detect_sinks) * f16_row_bytes);
}

KvDue StageTokens(const KvStreaming& st, KvStaging& staging, const KvCodec& f16, int64_t kv_heads,
                  int64_t start, int64_t n, const float* x, KvStagingScratch* scratch) {
  const int64_t dim = f16.head_dim();
  const size_t row = f16.RowBytes();
  const int64_t capacity = st.ResidualCapacity(), sinks = st.sink_tokens;
  scratch->half.resize(static_cast<size_t>(n * kv_heads) * row);
  scratch->rounded.resize(static_cast<size_t>(n * kv_heads * dim));
  f16.Encode(x, n * kv_heads, scratch->half.data());
  f16.Decode(scratch->half.data(), n * kv_heads, scratch->rounded.data());
  auto new_row = [&](int64_t p, int64_t h) {
    return &scratch->half[static_cast<size_t>((p - start) * kv_heads + h) * row];
  };
  for (int64_t p = start; p < std::min(start + n, sinks); ++p) {
    for (int64_t h = 0; h < kv_heads; ++h) {
      std::memcpy(&staging.sinks[static_cast<size_t>(h * sinks + p) * row], new_row(p, h), row);
    }
  }
  const int64_t total = start + n, encoded_old = staging.encoded;
  const int64_t encoded_new = st.EncodedAt(total);
  KvDue due{encoded_old, std::max<int64_t>(0, encoded_new - encoded_old)};
  // The due tokens are gathered before the ring takes the new ones (a long
  // prefill can reuse their slots).
  scratch->due.resize(static_cast<size_t>(due.count * kv_heads * dim));
  for (int64_t p = encoded_old; p < encoded_new; ++p) {
    for (int64_t h = 0; h < kv_heads; ++h) {
      float* dst = &scratch->due[static_cast<size_t>(((p - encoded_old) * kv_heads + h) * dim)];
      if (p < start) {
        f16.Decode(&staging.ring[static_cast<size_t>(h * capacity + p % capacity) * row], 1, dst);
      } else {
        std::memcpy(dst, &scratch->rounded[static_cast<size_t>(((p - start) * kv_heads + h) * dim)],
                    dim * sizeof(float));
      }
    }
  }
  for (int64_t p = std::max(start, encoded_new); p < total; ++p) {
    for (int64_t h = 0; h < kv_heads; ++h) {
      std::memcpy(&staging.ring[static_cast<size_t>(h * capacity + p % capacity) * row],
                  new_row(p, h), row);
    }
  }
  return due;
}

}  // namespace kvq
