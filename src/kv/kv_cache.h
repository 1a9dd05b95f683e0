// The KV-cache interface the model's forward pass talks to. A cache owns how
// K and V are stored (f32, f16, later quantized and paged) and computes
// attention itself, so a quantized cache can read its compressed blocks
// directly. Model code never changes when a new cache type is added.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "ops/rope.h"

namespace kvq {

using SeqId = int32_t;

// Shapes shared by every layer of one model.
struct KvShape {
  KvShape() = default;
  KvShape(int64_t layers, int64_t heads, int64_t kv_heads, int64_t dim)
      : num_layers(layers), num_heads(heads), num_kv_heads(kv_heads), head_dim(dim) {}

  int64_t num_layers = 0;
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // num_heads % num_kv_heads == 0 (grouped-query attention)
  int64_t head_dim = 0;
  // The model's RoPE, for caches that store K before RoPE and apply it after
  // decoding (KVQuant). Empty inv_freq: unknown (such caches then refuse).
  ops::RopeLayout rope_layout = ops::RopeLayout::kHalves;
  std::vector<float> rope_inv_freq;  // [head_dim / 2]
};

// Memory accounting a server's /metrics (and `kvq generate`) reads.
struct KvUsage {
  int64_t blocks_total = 0;  // 0 for caches that are not paged
  int64_t blocks_used = 0;   // blocks with a reference count above zero
  size_t block_bytes = 0;
  int64_t block_tokens = 0;     // tokens one block holds (every layer, K and V)
  int64_t sequence_blocks = 0;  // blocks each sequence takes when it starts (f16 windows)
  size_t bytes_used = 0;        // == BytesUsed(): used blocks + side data
  size_t bytes_reserved = 0;    // the whole budget (arena + side data); 0 = grows on demand
  int64_t sequences = 0;
  // Prefix caching: blocks kept only for reuse (no sequence holds them;
  // counted free, evicted when needed), and the blocks the sequences' tables
  // name, counting a shared block once per sequence: blocks_logical -
  // blocks_used is what sharing saves.
  int64_t blocks_cached = 0;
  int64_t blocks_logical = 0;
};

// A cached prefix (KvCache::FindCachedPrefix).
struct KvPrefixHit {
  int64_t tokens = 0;       // leading tokens whose K/V are cached
  int64_t blocks = 0;       // blocks holding them (the last one may be used only in part)
  int64_t idle_blocks = 0;  // of those, blocks no sequence holds now (free until reused)
};

class KvCache {
 public:
  virtual ~KvCache() = default;

  // Starts an empty sequence. Errors if `seq` exists.
  virtual Status AddSequence(SeqId seq) = 0;
  // Frees everything `seq` holds; unknown ids are ignored.
  virtual void ReleaseSequence(SeqId seq) = 0;
  // Starts `dst` as a copy of `src` (every layer must hold the same length).
  // A paged cache shares the blocks (copy-on-write: a later write into a
  // shared block copies it first), so a fork costs no cache memory until the
  // sequences diverge. Errors if `src` is unknown or `dst` exists.
  virtual Status Fork(SeqId src, SeqId dst) = 0;
  // Keeps the first `length` tokens of `seq` in every layer and frees the
  // rest. Errors if `seq` is unknown or `length` exceeds what is stored.
  virtual Status Truncate(SeqId seq, int64_t length) = 0;
  // Tokens stored for `seq` in `layer` (every layer holds the same count
  // once a forward pass has finished).
  virtual int64_t Length(SeqId seq, int64_t layer) const = 0;
  // Tokens the cache can still accept for `seq` (context or memory limit).
  virtual int64_t Capacity(SeqId seq) const = 0;

  // Stores `n` new tokens at the end of `seq` in `layer`.
  // k_pre_rope, k, v: [n, num_kv_heads, head_dim]. k is k_pre_rope with RoPE
  // applied; schemes that quantize before RoPE keep k_pre_rope instead.
  virtual Status Append(SeqId seq, int64_t layer, int64_t n, const float* k_pre_rope,
                        const float* k, const float* v) = 0;

  // Causal attention of the last `n` appended tokens over everything stored:
  // query i (0-based within the n) sees cached tokens [0, Length - n + i].
  // q:   [n, num_heads, head_dim] (RoPE applied)
  // out: [n, num_heads, head_dim]
  // scale: the softmax temperature, normally 1/sqrt(head_dim).
  // Errors (an unknown sequence, a bad layer, more queries than stored
  // tokens) leave `out` unspecified.
  virtual Status Attend(SeqId seq, int64_t layer, int64_t n, const float* q, float scale,
                        float* out) const = 0;

  // Prefix caching (vLLM's automatic prefix caching): full blocks are named
  // by a chain hash of their tokens; a new sequence can start from the
  // longest cached run of blocks of its prompt, shared copy-on-write, and
  // blocks no sequence holds stay cached until memory is needed.
  // Why this cache cannot share prefixes exactly, or "" when it can.
  virtual std::string PrefixCachingUnsupported() const { return "the KV cache is not paged"; }
  // On or off (off forgets every cached block). Errors, changing nothing,
  // when PrefixCachingUnsupported() is not empty.
  virtual Status SetPrefixCaching(bool enabled) {
    return enabled ? Status::Error(PrefixCachingUnsupported()) : Status::Ok();
  }
  // The longest cached prefix of `tokens` of at most `max_tokens` tokens.
  // Changes nothing.
  virtual KvPrefixHit FindCachedPrefix(std::span<const int32_t> tokens, int64_t max_tokens) const {
    (void)tokens, (void)max_tokens;
    return {};
  }
  // Starts `seq` holding the first `reuse` tokens of `tokens` from cached
  // blocks: `reuse` is FindCachedPrefix(tokens, ...).tokens with nothing
  // changed since (0: same as AddSequence).
  virtual Status AddSequenceWithPrefix(SeqId seq, std::span<const int32_t> tokens, int64_t reuse) {
    if (reuse != 0) return Status::Error("this KV cache keeps no prefixes");
    (void)tokens;
    return AddSequence(seq);
  }
  // Records the full blocks `seq` stores as cached prefixes: `tokens` are
  // its token ids (at least the stored ones). No-op while caching is off.
  virtual void CacheFullBlocks(SeqId seq, std::span<const int32_t> tokens) {
    (void)seq, (void)tokens;
  }

  // Why a sequence's attention here can depend on the other sequences the
  // cache holds or held, or "" when it cannot (where blocks lie never matters:
  // tests/kv/paged_cache_placement_test.cc). Batch-invariant serving
  // (SchedulerOptions::batch_invariant) refuses a cache that gives a reason.
  virtual std::string BatchInvarianceUnsupported() const {
    return "the KV cache does not declare that its sequences are independent";
  }

  // Bytes of cache storage currently in use (including any side data).
  virtual size_t BytesUsed() const = 0;
  virtual KvUsage Usage() const = 0;
  // Short name of the storage type, e.g. "f16".
  virtual const char* TypeName() const = 0;
};

}  // namespace kvq
