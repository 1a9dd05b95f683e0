// Building a KV cache from user-facing options (--kv-cache-dtype,
// --cache-type-k/-v, --kv-rotate, --kv-memory), and the byte layout the cache
// will allocate: the planner and the cache share ComputeKvLayout, so the plan
// equals what is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "kv/kv_cache.h"

namespace kvq {

struct KvCacheOptions {
  std::string k_type = "f16";  // codec name for K (see ParseKvCodec)
  std::string v_type = "f16";  // codec name for V
  bool rotate = false;         // Hadamard per head on K (and q) and on V (undone on the output)
  int64_t block_tokens = 16;   // tokens per paged block
  int64_t max_tokens = 0;      // per-sequence limit (the model's context); required
  size_t memory_bytes = 0;     // allocator budget; 0 = room for one sequence of max_tokens
  int num_threads = 0;         // OpenMP threads for Attend (0 = OpenMP's default)
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
// cache, not per block: side_bytes = layers * kv_heads * (K + V side bytes).
struct KvLayout {
  int64_t block_tokens = 0;
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  size_t k_row_bytes = 0;   // one token of one KV head, K
  size_t v_row_bytes = 0;   // one token of one KV head, V
  size_t k_tile_bytes = 0;  // block_tokens K rows of one (layer, KV head), padded to 64
  size_t v_tile_bytes = 0;  // block_tokens V rows of one (layer, KV head), padded to 64
  size_t block_bytes = 0;   // one block: every layer, K and V, every KV head, block_tokens tokens
  size_t side_bytes = 0;    // per-cache side data (e.g. fp8 scales), allocated once
  int64_t num_blocks = 0;   // blocks that fit memory_bytes after side_bytes
  double BytesPerToken() const { return static_cast<double>(block_bytes) / block_tokens; }
  size_t LayerBytes() const {
    return static_cast<size_t>(num_kv_heads) * (k_tile_bytes + v_tile_bytes);
  }
  // Byte offsets inside a block of the K / V tile of (layer, KV head).
  size_t KTileOffset(int64_t layer, int64_t head) const {
    return static_cast<size_t>(layer) * LayerBytes() + static_cast<size_t>(head) * k_tile_bytes;
  }
  size_t VTileOffset(int64_t layer, int64_t head) const {
    return static_cast<size_t>(layer) * LayerBytes() +
           static_cast<size_t>(num_kv_heads) * k_tile_bytes +
           static_cast<size_t>(head) * v_tile_bytes;
  }
};

StatusOr<KvLayout> ComputeKvLayout(const KvShape& shape, const KvCacheOptions& options);

// --kv-memory text -> bytes. "123456" (bytes), "512M", "8G", "8GiB"
// (K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024), "8GB" (KB/MB/GB/TB are
// powers of 1000), or a fraction of `total_ram_bytes` written with a decimal
// point, "0.5" or "1.0". Errors name the accepted forms.
StatusOr<size_t> ParseKvMemory(const std::string& text, size_t total_ram_bytes);

// Paged cache over codecs (or an error naming the bad option).
StatusOr<std::unique_ptr<KvCache>> MakeKvCache(const KvShape& shape, const KvCacheOptions& options);

}  // namespace kvq
