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

// Bytes the paged cache allocates, exactly.
struct KvLayout {
  int64_t block_tokens = 0;
  size_t k_row_bytes = 0;  // one token of one KV head, K
  size_t v_row_bytes = 0;  // one token of one KV head, V
  size_t block_bytes = 0;  // one block: every layer, K and V, every KV head, block_tokens tokens
  size_t side_bytes = 0;   // per-cache side data (e.g. fp8 scales), allocated once
  int64_t num_blocks = 0;  // blocks that fit memory_bytes after side_bytes
  double BytesPerToken() const { return static_cast<double>(block_bytes) / block_tokens; }
};

StatusOr<KvLayout> ComputeKvLayout(const KvShape& shape, const KvCacheOptions& options);

// Paged cache over codecs (or an error naming the bad option).
StatusOr<std::unique_ptr<KvCache>> MakeKvCache(const KvShape& shape, const KvCacheOptions& options);

}  // namespace kvq
