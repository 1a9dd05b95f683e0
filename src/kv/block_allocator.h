// Fixed-size blocks carved from one contiguous, 64-byte aligned arena: the
// physical memory of the paged KV cache. Block i lives at data() + i *
// block_bytes. Blocks are reference counted so sequences that fork can share
// a prefix (copy-on-write is the cache's job: it copies a block whose count
// is above one before writing into it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"

namespace kvq {

using BlockId = int32_t;

class BlockAllocator {
 public:
  // block_bytes must be a positive multiple of 64 (so every block stays
  // aligned); num_blocks may be 0 (every Allocate then fails).
  static StatusOr<std::unique_ptr<BlockAllocator>> Create(size_t block_bytes, int64_t num_blocks);

  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  // A free block with reference count 1, or an error when none is left.
  StatusOr<BlockId> Allocate();
  // Adds a reference to an allocated block (a fork sharing it).
  void Ref(BlockId block);
  // Drops a reference; the block returns to the free list at zero.
  void Unref(BlockId block);

  int64_t NumBlocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  int64_t NumFree() const { return static_cast<int64_t>(free_list_.size()); }
  int64_t NumUsed() const { return NumBlocks() - NumFree(); }
  int32_t RefCount(BlockId block) const { return ref_counts_[static_cast<size_t>(block)]; }
  size_t block_bytes() const { return block_bytes_; }

  uint8_t* BlockData(BlockId block) {
    return arena_.get() + static_cast<size_t>(block) * block_bytes_;
  }
  const uint8_t* BlockData(BlockId block) const {
    return arena_.get() + static_cast<size_t>(block) * block_bytes_;
  }

  // Full consistency check (free list and counts agree, no duplicates):
  // O(num_blocks), for tests and debug builds.
  Status CheckInvariants() const;

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  BlockAllocator(size_t block_bytes, int64_t num_blocks, uint8_t* arena);

  size_t block_bytes_;
  std::unique_ptr<uint8_t, FreeDeleter> arena_;  // [num_blocks, block_bytes]
  std::vector<int32_t> ref_counts_;              // [num_blocks]; 0 = free
  std::vector<BlockId> free_list_;               // stack of free blocks
};

}  // namespace kvq
