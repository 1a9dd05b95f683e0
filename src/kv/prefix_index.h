// Content-addressed full blocks: the index behind prefix caching (vLLM's
// automatic prefix caching). A full block of a sequence is named by the
// chain hash of its tokens and the hash of the block before it, so one hash
// stands for the whole prefix up to the block's end and a new sequence finds
// the longest cached prefix by walking its own blocks' hashes from the start.
//
// Entries keep their block's tokens and parent hash and lookups compare
// them, so a 64-bit hash collision can only cost a miss, never hand a
// sequence another prefix's K/V. Retention of the blocks themselves (kept
// while idle, evicted least recently used) is the allocator's
// (block_allocator.h); the paged cache keeps the two in step.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_allocator.h"

namespace kvq {

class KvPrefixIndex {
 public:
  // Hash of a full block with `tokens`, after the block whose hash is
  // `parent` (0 before the first block).
  static uint64_t ChainHash(uint64_t parent, std::span<const int32_t> tokens);

  // The block recorded for (parent, tokens) under `hash`, or -1.
  BlockId Find(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) const;
  // Records `block` as holding (parent, tokens) under `hash`. Returns false,
  // recording nothing, when the hash already names a block (the same prefix
  // computed twice, or a collision) or the block is already recorded.
  bool Insert(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, BlockId block);
  // Forgets what `block` holds (evicted, or about to be written); no-op if
  // it is not recorded.
  void Erase(BlockId block);
  bool Contains(BlockId block) const { return hash_of_.count(block) != 0; }
  int64_t size() const { return static_cast<int64_t>(hash_of_.size()); }

 private:
  struct Entry {
    BlockId block = -1;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
  };
  std::unordered_map<uint64_t, Entry> by_hash_;
  std::unordered_map<BlockId, uint64_t> hash_of_;
};

}  // namespace kvq
