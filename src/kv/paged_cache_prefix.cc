// PagedKvCache's prefix caching (paged_cache.h, kv/prefix_index.h).
#include <algorithm>

#include "kv/paged_cache.h"

namespace kvq {

std::string PagedKvCache::PrefixCachingUnsupported() const {
  // A streaming codec keeps the newest tokens (a residual window, partial
  // tiles) and sinks as per-sequence f16 rows outside the blocks, and a
  // block's encoded rows of those tokens are not what attention reads for
  // them (the f16 copy, or nothing yet). A sequence started from another's
  // blocks would have none of that staging, so its output would differ from
  // computing the prompt. Rebuilding the staging would need an f16 copy of
  // the window per cached prefix, the memory sharing is meant to save.
  if (any_streaming_) {
    return "KV cache type " + type_name_ +
           " keeps per-sequence f16 rows outside the blocks (residual window, sinks or partial "
           "tiles), which shared blocks cannot carry";
  }
  return "";
}

std::string PagedKvCache::BatchInvarianceUnsupported() const {
  // Codecs that calibrate on the first rows they store (fp8's per-head
  // scale) encode every later sequence with the first one's range.
  for (const auto* codecs : {&k_codecs_, &v_codecs_}) {
    for (const auto& codec : *codecs) {
      if (codec->NeedsCalibration()) {
        return "KV cache type " + type_name_ + " sets its " + codec->Name() +
               " scales from the first rows it stores (the first request's prefill), so every "
               "later request depends on which came first";
      }
    }
  }
  return "";
}

Status PagedKvCache::SetPrefixCaching(bool enabled) {
  if (!enabled) {
    if (prefix_ == nullptr) return Status::Ok();
    // Release every retained block: idle ones return to the free list, the
    // ones sequences still hold are freed by them as usual.
    for (BlockId b = 0; b < allocator_->NumBlocks(); ++b) allocator_->SetRetained(b, false);
    prefix_.reset();
    for (auto& [id, s] : sequences_) s.block_hashes.clear();
    return Status::Ok();
  }
  const std::string why = PrefixCachingUnsupported();
  if (!why.empty()) return Status::Error("prefix caching: " + why);
  if (prefix_ == nullptr) prefix_ = std::make_unique<KvPrefixIndex>();
  return Status::Ok();
}

template <class F>
int64_t PagedKvCache::WalkCachedBlocks(std::span<const int32_t> tokens, int64_t max_blocks,
                                       const F& fn) const {
  if (prefix_ == nullptr) return 0;
  const int64_t bt = layout_.block_tokens;
  const int64_t full = static_cast<int64_t>(tokens.size()) / bt;
  uint64_t parent = 0;
  int64_t j = 0;
  for (; j < std::min(full, max_blocks); ++j) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(j * bt), static_cast<size_t>(bt));
    const uint64_t hash = KvPrefixIndex::ChainHash(parent, block_tokens);
    const BlockId block = prefix_->Find(hash, parent, block_tokens);
    if (block < 0) break;
    fn(j, hash, block);
    parent = hash;
  }
  return j;
}

KvPrefixHit PagedKvCache::FindCachedPrefix(std::span<const int32_t> tokens,
                                           int64_t max_tokens) const {
  KvPrefixHit hit;
  const int64_t bt = layout_.block_tokens;
  max_tokens = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  if (max_tokens <= 0) return hit;
  // A block is worth taking when at least one of its tokens is within
  // max_tokens; a partly used last block is copied on the first write.
  const int64_t max_blocks = (max_tokens + bt - 1) / bt;
  hit.blocks = WalkCachedBlocks(tokens, max_blocks, [&](int64_t, uint64_t, BlockId block) {
    if (allocator_->RefCount(block) == 0) ++hit.idle_blocks;
  });
  hit.tokens = std::min(hit.blocks * bt, max_tokens);
  return hit;
}

Status PagedKvCache::AddSequenceWithPrefix(SeqId seq, std::span<const int32_t> tokens,
                                           int64_t reuse) {
  if (reuse == 0) return AddSequence(seq);
  const int64_t bt = layout_.block_tokens;
  if (reuse < 0 || reuse > static_cast<int64_t>(tokens.size())) {
    return Status::Error("prefix: " + std::to_string(reuse) + " tokens to reuse of " +
                         std::to_string(tokens.size()));
  }
  if (reuse > options_.max_tokens) {
    return Status::Error("prefix: " + std::to_string(reuse) + " tokens exceed the limit of " +
                         std::to_string(options_.max_tokens) + " per sequence");
  }
  const int64_t want = (reuse + bt - 1) / bt;
  std::vector<BlockId> blocks;
  std::vector<uint64_t> hashes;
  WalkCachedBlocks(tokens, want, [&](int64_t, uint64_t hash, BlockId block) {
    blocks.push_back(block);
    hashes.push_back(hash);
  });
  if (static_cast<int64_t>(blocks.size()) < want) {
    return Status::Error("prefix: only " + std::to_string(blocks.size() * bt) + " of " +
                         std::to_string(reuse) + " tokens are cached");
  }
  KVQ_RETURN_IF_ERROR(AddSequence(seq));
  Sequence& s = *Find(seq);
  for (BlockId block : blocks) {
    allocator_->Ref(block);  // revives idle blocks
    s.blocks.push_back(block);
  }
  // A partly reused last block is not this sequence's full block yet.
  hashes.resize(static_cast<size_t>(reuse / bt));
  s.block_hashes = std::move(hashes);
  std::fill(s.lengths.begin(), s.lengths.end(), reuse);
  return Status::Ok();
}

void PagedKvCache::CacheFullBlocks(SeqId seq, std::span<const int32_t> tokens) {
  Sequence* s = Find(seq);
  if (prefix_ == nullptr || s == nullptr) return;
  const int64_t bt = layout_.block_tokens;
  const int64_t stored = *std::min_element(s->lengths.begin(), s->lengths.end());
  const int64_t full = std::min<int64_t>(stored, static_cast<int64_t>(tokens.size())) / bt;
  for (int64_t j = static_cast<int64_t>(s->block_hashes.size()); j < full; ++j) {
    const uint64_t parent = j == 0 ? 0 : s->block_hashes[static_cast<size_t>(j - 1)];
    const auto block_tokens = tokens.subspan(static_cast<size_t>(j * bt), static_cast<size_t>(bt));
    const uint64_t hash = KvPrefixIndex::ChainHash(parent, block_tokens);
    const BlockId block = s->blocks[static_cast<size_t>(j)];
    // A block computed again while an identical one is cached stays private
    // (freed with its sequence); the chain goes on through the same hash.
    if (!prefix_->Contains(block) && prefix_->Insert(hash, parent, block_tokens, block)) {
      allocator_->SetRetained(block, true);
    }
    s->block_hashes.push_back(hash);
  }
}

}  // namespace kvq
