// Detected attention sinks (-aN, KvStreaming::detect_sinks) in the paged
// cache. KVSink (Su & Yuan, arXiv:2508.04257) shows that the tokens that
// draw attention like the first one (sinks) are not only the first N, and
// that keeping them in 16 bits is what protects quantized caches; it
// predicts them from the stable outlier channels of the residual stream.
// The cache never sees the residual stream, but it sees the quantity the
// criterion stands for: the attention each token draws. So, during prefill,
// for each (sequence, layer) with -aN:
//   - Attend of a prefill chunk (n > 1 queries, right after its Append)
//     takes up to kDetectQueries query rows spread over the chunk, computes
//     their exact softmax over every visible key (the stored keys as
//     attention reads them, with the f32 query: the fused kernel's
//     probabilities up to its int8 query rounding), and sums, per token of
//     the chunk, the probability it receives over those rows and the query
//     heads of each KV head;
//   - the N tokens with the most mass (not the -sN prefix, already f16)
//     compete with those kept from earlier chunks; the winners' K and V rows
//     of every KV head are stored in f16 (rounded from the values appended,
//     as the f16 window does), and attention reads those rows instead of the
//     encoded ones from then on, for this chunk's own queries too.
// Decode steps (n = 1) measure nothing and allocate nothing. The f16 rows
// are fixed per sequence (N per layer, K and V, KV head: the planner's
// staging bytes); fork copies them with the staging, truncate drops slots
// past the new length.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kv/paged_cache.h"

namespace kvq {
namespace {

// Sinks draw mass from nearly every query, so a sample of rows spread over
// the chunk ranks them; 16 rows x the query heads keeps the measurement a
// small fraction of the chunk's own attention (n rows).
constexpr int64_t kDetectQueries = 16;

}  // namespace

bool PagedKvCache::DetectionDue(SeqId seq, int64_t layer, int64_t n, int64_t stored) const {
  return any_detect_ && last_valid_ && n > 1 && last_seq_ == seq && last_layer_ == layer &&
         last_n_ == n && last_start_ + n == stored;
}

void PagedKvCache::DetectSinks(Sequence& s, int64_t layer, int64_t n, const float* q,
                               float scale) const {
  const int64_t dim = shape_.head_dim, kv = shape_.num_kv_heads, heads = shape_.num_heads;
  const int64_t group = heads / kv, total = s.lengths[static_cast<size_t>(layer)];
  const int64_t start = total - n;
  const KvStreaming& kst = Streaming(layer, false);
  const int64_t prefix = std::max(kst.sink_tokens, Streaming(layer, true).sink_tokens);
  detect_mass_.assign(static_cast<size_t>(n), 0.0);
  detect_keys_.resize(static_cast<size_t>(total * dim));
  detect_p_.resize(static_cast<size_t>(total));
  const int64_t samples = std::min(n, kDetectQueries);
  for (int64_t g = 0; g < kv; ++g) {
    DecodeTokens(s, layer, /*is_v=*/false, g, 0, total, detect_keys_.data());
    if (kst.pre_rope) rope_table_->Apply(0, total, detect_keys_.data());
    for (int64_t k = 0; k < samples; ++k) {
      const int64_t i = n - 1 - k * n / samples, visible = start + i + 1;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const float* qh = q + (i * heads + h) * dim;
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t t = 0; t < visible; ++t) {
          const float* kt = &detect_keys_[static_cast<size_t>(t * dim)];
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) dot += static_cast<double>(qh[d]) * kt[d];
          detect_p_[t] = dot * scale;
          max_score = std::max(max_score, detect_p_[t]);
        }
        double sum = 0;
        for (int64_t t = 0; t < visible; ++t) {
          detect_p_[t] = std::exp(detect_p_[t] - max_score);
          sum += detect_p_[t];
        }
        for (int64_t t = std::max(start, prefix); t < visible; ++t) {
          detect_mass_[t - start] += detect_p_[t] / sum;
        }
      }
    }
  }
  const size_t row = f16_codec_->RowBytes();
  for (bool is_v : {false, true}) {
    const int64_t slots = Streaming(layer, is_v).detect_sinks;
    KvStaging& staging = StagingOf(s, layer, is_v);
    const float* rows = (is_v ? last_v_ : last_k_).data();
    std::vector<char> taken;  // prefill only
    taken.assign(static_cast<size_t>(n), 0);
    for (int64_t pick = 0; pick < slots; ++pick) {
      int64_t best = -1;
      for (int64_t j = 0; j < n; ++j) {
        if (!taken[j] && detect_mass_[j] > 0 && (best < 0 || detect_mass_[j] > detect_mass_[best]))
          best = j;
      }
      if (best < 0) break;
      taken[best] = 1;
      int64_t weakest = 0;  // an empty slot, else the one with the least mass
      for (int64_t i = 1; i < slots; ++i) {
        const bool emptier = staging.detected[i] < 0 && staging.detected[weakest] >= 0;
        if (emptier || (staging.detected[weakest] >= 0 &&
                        staging.detected_mass[i] < staging.detected_mass[weakest]))
          weakest = i;
      }
      if (staging.detected[weakest] >= 0 &&
          staging.detected_mass[weakest] >= static_cast<float>(detect_mass_[best]))
        break;  // the slots already hold heavier sinks
      staging.detected[weakest] = start + best;
      staging.detected_mass[weakest] = static_cast<float>(detect_mass_[best]);
      for (int64_t h = 0; h < kv; ++h) {
        f16_codec_->Encode(rows + (best * kv + h) * dim, 1,
                           &staging.detected_rows[static_cast<size_t>(h * slots + weakest) * row]);
      }
    }
  }
}

std::vector<std::pair<int64_t, float>> PagedKvCache::DetectedSinks(SeqId seq, int64_t layer) const {
  std::vector<std::pair<int64_t, float>> out;
  const Sequence* s = Find(seq);
  if (s == nullptr || layer < 0 || layer >= shape_.num_layers || !any_streaming_) return out;
  const KvStaging& staging = StagingOf(*s, layer, /*is_v=*/false);
  for (size_t i = 0; i < staging.detected.size(); ++i) {
    if (staging.detected[i] >= 0) out.emplace_back(staging.detected[i], staging.detected_mass[i]);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

void PagedKvCache::DetectedScores(const KvStaging& staging, const KvStreaming& st, int64_t head,
                                  int64_t t0, int64_t count, const float* q, int64_t rows,
                                  float scale, float* scores, int64_t stride,
                                  float* scratch) const {
  const size_t row = f16_codec_->RowBytes();
  const int64_t slots = st.detect_sinks;
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t t = staging.detected[i];
    if (t < t0 || t >= t0 + count || staging.DetectedSlot(t, st.sink_tokens) < 0) continue;
    const uint8_t* f16_row = &staging.detected_rows[static_cast<size_t>(head * slots + i) * row];
    float* out = scores + (t - t0);
    if (!st.pre_rope) {
      f16_codec_->Scores(f16_row, 1, q, rows, scale, out, stride);
      continue;
    }
    f16_codec_->Decode(f16_row, 1, scratch);
    rope_table_->Apply(t, 1, scratch);
    f32_codec_->Scores(reinterpret_cast<const uint8_t*>(scratch), 1, q, rows, scale, out, stride);
  }
}

void PagedKvCache::DetectedValues(const KvStaging& staging, const KvStreaming& st, int64_t head,
                                  int64_t t0, int64_t count, const float* p, int64_t rows,
                                  int64_t stride, float* acc) const {
  const size_t row = f16_codec_->RowBytes();
  const int64_t slots = st.detect_sinks;
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t t = staging.detected[i];
    if (t < t0 || t >= t0 + count || staging.DetectedSlot(t, st.sink_tokens) < 0) continue;
    f16_codec_->AccumulateV(&staging.detected_rows[static_cast<size_t>(head * slots + i) * row], 1,
                            p + (t - t0), rows, stride, acc);
  }
}

void PagedKvCache::DetectedRows(const KvStaging& staging, const KvStreaming& st, int64_t head,
                                int64_t t0, int64_t count, float* x) const {
  const size_t row = f16_codec_->RowBytes();
  const int64_t slots = st.detect_sinks;
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t t = staging.detected[i];
    if (t < t0 || t >= t0 + count || staging.DetectedSlot(t, st.sink_tokens) < 0) continue;
    f16_codec_->Decode(&staging.detected_rows[static_cast<size_t>(head * slots + i) * row], 1,
                       x + (t - t0) * shape_.head_dim);
  }
}

}  // namespace kvq
