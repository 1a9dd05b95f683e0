#include "kv/kv_factory.h"

#include "kv/codec.h"
#include "kv/dense_cache.h"

namespace kvq {

// Block layout (what the paged cache allocates): a block holds block_tokens
// tokens of every layer, K and V, every KV head, as tiles of contiguous rows:
//   block = [layer][K tiles: kv_head][V tiles: kv_head]
//   K tile = block_tokens * k_row_bytes, V tile = block_tokens * v_row_bytes
// Side data (per-codec-instance parameters) is allocated once per cache.
StatusOr<KvLayout> ComputeKvLayout(const KvShape& shape, const KvCacheOptions& options) {
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.num_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0) {
    return Status::Error("KV cache: invalid model shape");
  }
  if (options.block_tokens <= 0) return Status::Error("KV cache: block size must be positive");
  KVQ_ASSIGN_OR_RETURN(auto k_codec, ParseKvCodec(options.k_type, shape.head_dim));
  KVQ_ASSIGN_OR_RETURN(auto v_codec, ParseKvCodec(options.v_type, shape.head_dim));
  KvLayout layout;
  layout.block_tokens = options.block_tokens;
  layout.k_row_bytes = k_codec->RowBytes();
  layout.v_row_bytes = v_codec->RowBytes();
  const size_t heads = static_cast<size_t>(shape.num_layers * shape.num_kv_heads);
  layout.block_bytes =
      heads * static_cast<size_t>(options.block_tokens) * (layout.k_row_bytes + layout.v_row_bytes);
  layout.side_bytes = heads * (k_codec->SideBytes() + v_codec->SideBytes());
  size_t budget = options.memory_bytes;
  if (budget == 0) {
    if (options.max_tokens <= 0) return Status::Error("KV cache: max_tokens must be positive");
    const int64_t blocks = (options.max_tokens + options.block_tokens - 1) / options.block_tokens;
    budget = layout.side_bytes + static_cast<size_t>(blocks) * layout.block_bytes;
  }
  if (budget < layout.side_bytes + layout.block_bytes) {
    return Status::Error("KV cache: memory budget of " + std::to_string(budget) +
                         " bytes holds no block (one block is " +
                         std::to_string(layout.block_bytes) + " bytes)");
  }
  layout.num_blocks = static_cast<int64_t>((budget - layout.side_bytes) / layout.block_bytes);
  return layout;
}

// Temporary: the dense cache until the paged cache lands.
StatusOr<std::unique_ptr<KvCache>> MakeKvCache(const KvShape& shape,
                                               const KvCacheOptions& options) {
  KVQ_RETURN_IF_ERROR(ComputeKvLayout(shape, options).status());
  if (options.k_type != options.v_type || options.rotate) {
    return Status::Error("KV cache: this build supports only equal f32/f16 K and V types");
  }
  KVQ_ASSIGN_OR_RETURN(DenseKvType type, ParseDenseKvType(options.k_type));
  return MakeDenseKvCache(shape, type, options.max_tokens, options.num_threads);
}

}  // namespace kvq
