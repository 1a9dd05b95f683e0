// Fixed-size blocks carved from one contiguous, 64-byte aligned arena: the
// physical memory of the paged KV cache. Block i is either the bytes at
// BlockData(i) (block-major) or a set of slots spread slot-major over the
// arena (BlockSlot, what the paged cache uses). Blocks are reference
// counted so sequences that fork can share a prefix (copy-on-write is the
// cache's job: it copies a block whose count is above one before writing
// into it).
//
// Retained blocks (prefix caching, kv/prefix_index.h): a block marked
// retained holds contents someone may want again, so when its last
// reference goes it is not freed but parked on an idle list, oldest release
// first. An idle block still counts as free (NumFree): Allocate hands out
// truly free blocks first and otherwise evicts the least recently released
// idle block, telling the owner through the eviction callback. Ref revives
// an idle block. This is vLLM's block pool, where cached blocks with no
// reference sit in the free queue until they are needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
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

  // A free block with reference count 1 (evicting the oldest idle retained
  // block when no other is free), or an error when none is left.
  StatusOr<BlockId> Allocate();
  // Adds a reference to an allocated block (a fork sharing it) or to an
  // idle retained block (which leaves the idle list).
  void Ref(BlockId block);
  // Drops a reference; at zero the block returns to the free list, or to
  // the idle list if it is retained.
  void Unref(BlockId block);

  // Retention (see above). SetRetained(b, false) on an idle block frees it.
  void SetRetained(BlockId block, bool retained);
  bool IsRetained(BlockId block) const { return retained_[static_cast<size_t>(block)] != 0; }
  // Called with each idle block Allocate evicts (its retention is already
  // cleared), so the owner can forget what the block held.
  void SetEvictionCallback(std::function<void(BlockId)> callback) {
    on_evict_ = std::move(callback);
  }

  int64_t NumBlocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  // Blocks Allocate can hand out: free and idle.
  int64_t NumFree() const { return static_cast<int64_t>(free_list_.size()) + num_idle_; }
  // Retained blocks nobody references (kept for reuse, evictable).
  int64_t NumIdle() const { return num_idle_; }
  // Blocks with a reference.
  int64_t NumUsed() const { return NumBlocks() - NumFree(); }
  int32_t RefCount(BlockId block) const { return ref_counts_[static_cast<size_t>(block)]; }
  size_t block_bytes() const { return block_bytes_; }

  // A block as one slice of the arena: bytes [i * block_bytes, (i + 1) *
  // block_bytes). For callers that do not split blocks into slots.
  uint8_t* BlockData(BlockId block) {
    return arena_.get() + static_cast<size_t>(block) * block_bytes_;
  }
  const uint8_t* BlockData(BlockId block) const {
    return arena_.get() + static_cast<size_t>(block) * block_bytes_;
  }

  // Slot-major placement: a block is split into slots (byte ranges
  // [offset, offset + bytes) of a block_bytes-sized record, at most
  // block_bytes in total), and slot s of every block lives in its own
  // region of the arena, [offset * NumBlocks(), (offset + bytes) *
  // NumBlocks()), block i at i * bytes inside it. Consecutive blocks' slots
  // are then adjacent: the paged cache keeps one (layer, K/V, head) tile per
  // slot, so a run of a sequence's blocks is one contiguous run of a head's
  // rows that the hardware prefetchers stream, instead of a few KiB a block
  // apart. Callers use either BlockData or BlockSlot for an arena, not both.
  uint8_t* BlockSlot(BlockId block, size_t offset, size_t bytes) {
    return arena_.get() + offset * ref_counts_.size() + static_cast<size_t>(block) * bytes;
  }
  const uint8_t* BlockSlot(BlockId block, size_t offset, size_t bytes) const {
    return arena_.get() + offset * ref_counts_.size() + static_cast<size_t>(block) * bytes;
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
  std::vector<int32_t> ref_counts_;              // [num_blocks]; 0 = free or idle
  std::vector<BlockId> free_list_;               // stack of free blocks
  // Idle list: doubly linked through idle_prev_/idle_next_ ([num_blocks],
  // -1 = none), oldest release at idle_head_. Links are preallocated, so
  // parking and reviving a block allocates nothing.
  std::vector<char> retained_;  // [num_blocks]
  std::vector<BlockId> idle_prev_, idle_next_;
  BlockId idle_head_ = -1, idle_tail_ = -1;
  int64_t num_idle_ = 0;
  std::function<void(BlockId)> on_evict_;
  bool IsIdle(BlockId block) const {
    return ref_counts_[static_cast<size_t>(block)] == 0 && IsRetained(block);
  }
  void PushIdle(BlockId block);
  void RemoveIdle(BlockId block);
};

}  // namespace kvq
