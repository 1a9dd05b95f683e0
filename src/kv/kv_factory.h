// Building a KV cache from user-facing options (--kv-cache-dtype,
// --cache-type-k/-v, --kv-rotate, --kv-memory), and the byte layout the cache
// will allocate: the planner and the cache share ComputeKvLayout, so the plan
// equals what is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "kv/kv_cache.h"

namespace kvq {

struct KvCacheTypes;  // kv/kv_policy.h

// The codecs of one layer's K and V.
struct KvLayerTypes {
  std::string k_type, v_type;
};

struct KvCacheOptions {
  std::string k_type = "f16";  // codec name for K (see ParseKvCodec)
  std::string v_type = "f16";  // codec name for V
  // k_type / v_type may also name a scheme ("kivi2": its K or V codec).
  // Per-layer policy text (--kv-policy, grammar in kv_policy.h); empty =
  // k_type / v_type in every layer.
  std::string policy;
  bool rotate = false;        // Hadamard per head on K (and q) and on V (undone on the output)
  int64_t block_tokens = 16;  // tokens per paged block
  int64_t max_tokens = 0;     // per-sequence limit (the model's context); required
  size_t memory_bytes = 0;    // allocator budget; 0 = room for one sequence of max_tokens
  // The threads Attend runs on: normally the model's pool
  // (Transformer::pool()), so one set of workers serves the whole decode
  // step and none polls while another works. It must outlive the cache, and
  // one thread at a time runs the model and the cache on it. Null: the cache
  // starts its own pool of num_threads (0 = every core), for tests and
  // kernels alone.
  ThreadPool* pool = nullptr;
  int num_threads = 0;
  // `kvq calibrate` output for codecs that need one (KVQuant's nuq*); loaded
  // once by the cache, ignored by the others.
  std::string calibration_path;
  // k_type / v_type / policy parsed once (ParseKvCacheTypes in kv_policy.h;
  // KvFlagsToOptions sets it). Ignored, and the strings parsed instead, when
  // it was parsed from other strings than the current ones.
  std::shared_ptr<const KvCacheTypes> types;
};

// Bytes the paged cache allocates, exactly (the planner prints these).
//
// A block holds block_tokens tokens of every layer, K and V, every KV head,
// grouped so attention reads contiguous rows of one (layer, K/V, KV head):
//   block = [layer 0][layer 1]...                       block_bytes
//   layer = [K tile head 0..kv_heads-1][V tile head 0..kv_heads-1]
//   K tile = block_tokens K rows (k_row_bytes each), zero-padded to a
//            multiple of 64 bytes (k_tile_bytes); V tiles likewise.
// Tiles and blocks therefore start on 64-byte boundaries (the arena is
// 64-byte aligned). With block_tokens a multiple of 16 and row sizes a
// multiple of 4 bytes (every codec kvq ships) the padding is zero.
// Side data (per codec instance, e.g. an fp8 scale) is allocated once per
// cache, not per block: side_bytes = layers * kv_heads * (K + V side bytes),
// plus, when any layer keeps K before RoPE, the cos/sin table attention
// rotates those keys with (ops::RopeTable::Bytes for max_tokens, one coarse
// row per block).
// With a per-layer policy the layers' tiles differ in size; block_tokens is
// then rounded up to a multiple of every codec's tile (per-channel groups).
//
// Streaming codecs (KvStreaming: residual windows, sinks) also keep f16 rows
// per sequence: staging_bytes = sum over layers, K and V, KV heads of
// (residual capacity + sinks + detected sinks) * head_dim * 2. A sequence is charged
// staging_blocks = ceil(staging_bytes / block_bytes) blocks of the budget for
// them when it starts, so the budget and the planner count them exactly.
struct KvLayerLayout {
  size_t k_row_bytes = 0, v_row_bytes = 0;    // one token of one KV head
  size_t k_tile_bytes = 0, v_tile_bytes = 0;  // block_tokens rows of one KV head, padded to 64
  size_t offset = 0;                          // of the layer inside a block
};
struct KvLayout {
  int64_t block_tokens = 0;
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  // Layer 0's row and tile bytes (every layer's when there is no policy).
  size_t k_row_bytes = 0;
  size_t v_row_bytes = 0;
  size_t k_tile_bytes = 0;
  size_t v_tile_bytes = 0;
  std::vector<KvLayerLayout> layers;  // [num_layers]
  size_t block_bytes = 0;  // one block: every layer, K and V, every KV head, block_tokens tokens
  size_t side_bytes = 0;   // per-cache side data (e.g. fp8 scales), allocated once:
                           // SideBytesFor(options.max_tokens)
  size_t codec_side_bytes = 0;      // the part of it every codec instance holds
  int64_t rope_table_head_dim = 0;  // > 0: a pre-RoPE K codec's RopeTable is side data too
  size_t staging_bytes = 0;         // per sequence: f16 residual windows and sinks
  int64_t staging_blocks = 0;       // blocks charged per sequence for staging_bytes
  int64_t num_blocks = 0;           // blocks that fit memory_bytes after side_bytes
  double BytesPerToken() const { return static_cast<double>(block_bytes) / block_tokens; }
  // Side data of a cache made for sequences of up to max_tokens tokens (the
  // RoPE table grows with it; codec side data does not).
  size_t SideBytesFor(int64_t max_tokens) const {
    return codec_side_bytes +
           (rope_table_head_dim > 0
                ? ops::RopeTable::Bytes(rope_table_head_dim, max_tokens, block_tokens)
                : 0);
  }
  // Bytes a sequence of `tokens` tokens holds: its blocks and its staging.
  size_t SequenceBytes(int64_t tokens) const {
    const int64_t blocks = (tokens + block_tokens - 1) / block_tokens + staging_blocks;
    return static_cast<size_t>(blocks) * block_bytes;
  }
  size_t LayerBytes(int64_t layer) const {
    const KvLayerLayout& l = layers[static_cast<size_t>(layer)];
    return static_cast<size_t>(num_kv_heads) * (l.k_tile_bytes + l.v_tile_bytes);
  }
  // Byte offsets inside a block of the K / V tile of (layer, KV head).
  size_t KTileOffset(int64_t layer, int64_t head) const {
    const KvLayerLayout& l = layers[static_cast<size_t>(layer)];
    return l.offset + static_cast<size_t>(head) * l.k_tile_bytes;
  }
  size_t VTileOffset(int64_t layer, int64_t head) const {
    const KvLayerLayout& l = layers[static_cast<size_t>(layer)];
    return l.offset + static_cast<size_t>(num_kv_heads) * l.k_tile_bytes +
           static_cast<size_t>(head) * l.v_tile_bytes;
  }
};

StatusOr<KvLayout> ComputeKvLayout(const KvShape& shape, const KvCacheOptions& options);

// --kv-memory text -> bytes. "123456" (bytes), "512M", "8G", "8GiB"
// (K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024), "8GB" (KB/MB/GB/TB are
// powers of 1000), or a fraction of `total_ram_bytes` written with a decimal
// point, "0.5" or "1.0". Errors name the accepted forms.
StatusOr<size_t> ParseKvMemory(const std::string& text, size_t total_ram_bytes);

// Whether any layer's K or V codec needs options.calibration_path (KVQuant's
// nuq*), so a caller can make one first (kvq study does).
StatusOr<bool> NeedsCalibrationFile(const KvShape& shape, const KvCacheOptions& options);

// Paged cache over codecs (or an error naming the bad option).
StatusOr<std::unique_ptr<KvCache>> MakeKvCache(const KvShape& shape, const KvCacheOptions& options);

}  // namespace kvq
