// Unquantized KV cache: K (post-RoPE) and V stored per token in f32 or f16.
// The baseline every quantized scheme is measured against.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "kv/kv_cache.h"

namespace kvq {

enum class DenseKvType { kF32, kF16 };

// `max_tokens` bounds every sequence (the model's context length);
// `num_threads` is how many threads Attend uses (its own pool; 0 = every
// core). A reference cache: it allocates its scratch on every call.
std::unique_ptr<KvCache> MakeDenseKvCache(const KvShape& shape, DenseKvType type,
                                          int64_t max_tokens, int num_threads = 0);

// "f32" / "f16" -> type; anything else is an error listing the choices.
StatusOr<DenseKvType> ParseDenseKvType(const std::string& name);

}  // namespace kvq
