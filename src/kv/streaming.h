// Streaming apart from storage: where each token of a streaming codec
// (KvStreaming in codec.h: residual windows, sinks, per-channel tiles)
// lives, and how new tokens move from the f16 staging into the encoded
// blocks. The paged cache (paged_cache.h) keeps block tables, fork /
// copy-on-write and the allocator; it asks these functions which bytes hold
// a token range and hands them the block tiles.
//
// One (sequence, layer, K or V) has a KvStaging: the first `sink_tokens`
// tokens in f16, and the tokens not yet encoded in an f16 ring (slot =
// position mod capacity). Tokens [0, encoded) are also encoded in the
// blocks; attention and decoding read each token from exactly one place:
//   sinks    tokens < sink_tokens (their encoded rows are ignored);
//   encoded  the block's tile, rows from the block start;
//   ring     tokens >= max(encoded, sink_tokens).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv/codec.h"

namespace kvq {

// f16 rows of one (sequence, layer, K or V) that are not (only) in blocks.
struct KvStaging {
  int64_t encoded = 0;         // tokens [0, encoded) are in blocks
  std::vector<uint8_t> ring;   // [kv_heads, capacity, f16 row]
  std::vector<uint8_t> sinks;  // [kv_heads, sink_tokens, f16 row]
  // -aN (detected sinks, paged_cache.cc): slot i holds token detected[i]
  // (-1: empty) with the attention mass it drew, its rows in f16. Attention
  // reads an encoded token's row from here when it is detected.
  std::vector<int64_t> detected;       // [detect_sinks]
  std::vector<float> detected_mass;    // [detect_sinks]
  std::vector<uint8_t> detected_rows;  // [kv_heads, detect_sinks, f16 row]
  void Allocate(const KvStreaming& st, int64_t kv_heads, size_t f16_row_bytes);
  // The slot of token t if it is a detected sink that lives in the blocks
  // (encoded and not a prefix sink), else -1.
  int64_t DetectedSlot(int64_t t, int64_t sink_tokens) const {
    if (t >= encoded || t < sink_tokens) return -1;
    for (size_t i = 0; i < detected.size(); ++i) {
      if (detected[i] == t) return static_cast<int64_t>(i);
    }
    return -1;
  }
};

// A run of tokens stored one way.
struct KvSegment {
  enum Kind { kEncoded, kRing, kSink };
  Kind kind;
  int64_t first = 0;     // first token
  int64_t count = 0;     // tokens
  const uint8_t* rows;   // kEncoded: the tile's rows from `first`; else f16 rows
  int64_t shadowed = 0;  // kEncoded: its leading tokens that are sinks (read there)
};

// Calls fn(const KvSegment&) for tokens [t0, t0 + count) of one KV head,
// t0 a block start and the range inside that block (tile: the block's tile
// of this head), in the order attention consumes them: encoded, then the
// ring in runs that do not wrap, then the sinks (which replace the
// encoded rows' scores / carry the weight the encoded pass left out).
template <class F>
inline void ForEachKvSegment(const KvStreaming& st, const KvStaging& staging, int64_t head,
                             size_t f16_row, const uint8_t* tile, int64_t t0, int64_t count,
                             const F& fn) {
  const int64_t t1 = t0 + count, sinks = st.sink_tokens, capacity = st.ResidualCapacity();
  // Encoded tiles start at the block start (tile codecs need a tile start).
  const int64_t encoded_end = std::min(t1, staging.encoded);
  if (encoded_end > t0) {
    const int64_t shadowed = sinks > t0 ? std::min(sinks, encoded_end) - t0 : 0;
    fn(KvSegment{KvSegment::kEncoded, t0, encoded_end - t0, tile, shadowed});
  }
  for (int64_t p = std::max({t0, staging.encoded, sinks}); p < t1;) {
    const int64_t slot = p % capacity, run = std::min(t1 - p, capacity - slot);
    fn(KvSegment{KvSegment::kRing, p, run,
                 &staging.ring[static_cast<size_t>(head * capacity + slot) * f16_row], 0});
    p += run;
  }
  if (sinks > t0) {
    fn(KvSegment{KvSegment::kSink, t0, std::min(t1, sinks) - t0,
                 &staging.sinks[static_cast<size_t>(head * sinks + t0) * f16_row], 0});
  }
}

// Buffers StageTokens reuses across calls (grown, never shrunk), so a
// decode step does not allocate.
struct KvStagingScratch {
  std::vector<uint8_t> half;   // [n, kv_heads] f16 rows
  std::vector<float> rounded;  // [n, kv_heads, dim]
  std::vector<float> due;      // [due tokens, kv_heads, dim]
};

// Stages x [n, kv_heads, head_dim] (stored domain) at token `start`: every
// input is rounded to f16 first (so a token is encoded from the same values
// whether it waited in the ring or not), the sinks are copied, and the
// tokens now due for encoding are gathered into scratch->due. Returns their
// first token and count; the caller encodes them into the blocks, then sets
// staging.encoded = first + count.
struct KvDue {
  int64_t first = 0, count = 0;
};
KvDue StageTokens(const KvStreaming& st, KvStaging& staging, const KvCodec& f16, int64_t kv_heads,
                  int64_t start, int64_t n, const float* x, KvStagingScratch* scratch);

}  // namespace kvq
