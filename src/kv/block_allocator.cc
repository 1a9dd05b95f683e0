#include "kv/block_allocator.h"

#include <sys/mman.h>

#include <cassert>
#include <cstdlib>
#include <string>

namespace kvq {

void BlockAllocator::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

BlockAllocator::BlockAllocator(size_t block_bytes, int64_t num_blocks, uint8_t* arena)
    : block_bytes_(block_bytes),
      arena_(arena),
      ref_counts_(static_cast<size_t>(num_blocks), 0),
      retained_(static_cast<size_t>(num_blocks), 0),
      idle_prev_(static_cast<size_t>(num_blocks), -1),
      idle_next_(static_cast<size_t>(num_blocks), -1) {
  free_list_.reserve(static_cast<size_t>(num_blocks));
  // Pushed in reverse so Allocate hands out low addresses first.
  for (int64_t i = num_blocks - 1; i >= 0; --i) free_list_.push_back(static_cast<BlockId>(i));
}

StatusOr<std::unique_ptr<BlockAllocator>> BlockAllocator::Create(size_t block_bytes,
                                                                 int64_t num_blocks) {
  if (block_bytes == 0 || block_bytes % 64 != 0) {
    return Status::Error("block allocator: block size " + std::to_string(block_bytes) +
                         " bytes is not a positive multiple of 64");
  }
  if (num_blocks < 0 || num_blocks > INT32_MAX) {
    return Status::Error("block allocator: bad block count " + std::to_string(num_blocks));
  }
  const size_t bytes = block_bytes * static_cast<size_t>(num_blocks);
  if (num_blocks != 0 && bytes / static_cast<size_t>(num_blocks) != block_bytes) {
    return Status::Error("block allocator: " + std::to_string(num_blocks) + " blocks of " +
                         std::to_string(block_bytes) + " bytes overflow the address space");
  }
  uint8_t* arena = nullptr;
  if (bytes > 0) {
    // Pages are touched only when a block is first written, so a large budget
    // costs address space, not resident memory, until it is used.
    //
    // Large arenas ask for 2 MiB pages: a sequence's blocks need not be
    // consecutive (many sequences grow together), so its tiles of one layer
    // and head can be anywhere in their slot's region, and with 4 KiB pages
    // decode attention would take a TLB miss on nearly every tile it reads.
    // Only a hint: without transparent huge pages the arena works the same
    // on 4 KiB pages.
    constexpr size_t kHugePage = size_t{2} << 20;
    if (bytes >= kHugePage) {
      const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
      arena = static_cast<uint8_t*>(std::aligned_alloc(kHugePage, rounded));
      if (arena != nullptr) madvise(arena, rounded, MADV_HUGEPAGE);
    } else {
      arena = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
    }
    if (arena == nullptr) {
      return Status::Error("block allocator: cannot allocate " + std::to_string(bytes) +
                           " bytes (" + std::to_string(num_blocks) + " blocks of " +
                           std::to_string(block_bytes) + ")");
    }
  }
  return std::unique_ptr<BlockAllocator>(new BlockAllocator(block_bytes, num_blocks, arena));
}

StatusOr<BlockId> BlockAllocator::Allocate() {
  BlockId block = -1;
  if (!free_list_.empty()) {
    block = free_list_.back();
    free_list_.pop_back();
  } else if (idle_head_ >= 0) {
    // Evict the block released longest ago (least recently used).
    block = idle_head_;
    RemoveIdle(block);
    retained_[static_cast<size_t>(block)] = 0;
    if (on_evict_) on_evict_(block);
  } else {
    return Status::Error("KV cache out of memory: all " + std::to_string(NumBlocks()) +
                         " blocks of " + std::to_string(block_bytes_) +
                         " bytes are in use (raise --kv-memory)");
  }
  assert(ref_counts_[static_cast<size_t>(block)] == 0);
  ref_counts_[static_cast<size_t>(block)] = 1;
  return block;
}

void BlockAllocator::Ref(BlockId block) {
  assert(block >= 0 && block < NumBlocks());
  if (IsIdle(block)) RemoveIdle(block);
  assert((ref_counts_[static_cast<size_t>(block)] > 0 || IsRetained(block)) &&
         "Ref of a free block");
  ++ref_counts_[static_cast<size_t>(block)];
}

void BlockAllocator::Unref(BlockId block) {
  assert(block >= 0 && block < NumBlocks());
  int32_t& count = ref_counts_[static_cast<size_t>(block)];
  assert(count > 0 && "Unref of a free block (double free)");
  if (count <= 0) return;  // release builds: ignore rather than corrupt the free list
  if (--count > 0) return;
  if (IsRetained(block)) {
    PushIdle(block);
  } else {
    free_list_.push_back(block);
  }
}

void BlockAllocator::SetRetained(BlockId block, bool retained) {
  assert(block >= 0 && block < NumBlocks());
  char& flag = retained_[static_cast<size_t>(block)];
  if ((flag != 0) == retained) return;
  // Retaining a block nobody holds would park a free block: refused.
  assert(!retained || ref_counts_[static_cast<size_t>(block)] > 0);
  if (retained && ref_counts_[static_cast<size_t>(block)] == 0) return;
  if (!retained && IsIdle(block)) {
    RemoveIdle(block);
    free_list_.push_back(block);
  }
  flag = retained ? 1 : 0;
}

void BlockAllocator::PushIdle(BlockId block) {
  const size_t b = static_cast<size_t>(block);
  idle_prev_[b] = idle_tail_;
  idle_next_[b] = -1;
  if (idle_tail_ >= 0) {
    idle_next_[static_cast<size_t>(idle_tail_)] = block;
  } else {
    idle_head_ = block;
  }
  idle_tail_ = block;
  ++num_idle_;
}

void BlockAllocator::RemoveIdle(BlockId block) {
  const size_t b = static_cast<size_t>(block);
  const BlockId prev = idle_prev_[b], next = idle_next_[b];
  if (prev >= 0) {
    idle_next_[static_cast<size_t>(prev)] = next;
  } else {
    idle_head_ = next;
  }
  if (next >= 0) {
    idle_prev_[static_cast<size_t>(next)] = prev;
  } else {
    idle_tail_ = prev;
  }
  idle_prev_[b] = idle_next_[b] = -1;
  --num_idle_;
}

Status BlockAllocator::CheckInvariants() const {
  std::vector<char> in_free_list(ref_counts_.size(), 0);
  for (BlockId b : free_list_) {
    if (b < 0 || b >= NumBlocks()) {
      return Status::Error("free list holds out-of-range block " + std::to_string(b));
    }
    if (in_free_list[static_cast<size_t>(b)]) {
      return Status::Error("block " + std::to_string(b) + " is on the free list twice");
    }
    in_free_list[static_cast<size_t>(b)] = 1;
  }
  std::vector<char> in_idle_list(ref_counts_.size(), 0);
  int64_t idle = 0;
  for (BlockId b = idle_head_, prev = -1; b >= 0;
       prev = b, b = idle_next_[static_cast<size_t>(b)]) {
    if (b >= NumBlocks() || in_idle_list[static_cast<size_t>(b)] ||
        in_free_list[static_cast<size_t>(b)] || idle_prev_[static_cast<size_t>(b)] != prev ||
        ++idle > NumBlocks()) {
      return Status::Error("the idle list is corrupt at block " + std::to_string(b));
    }
    in_idle_list[static_cast<size_t>(b)] = 1;
  }
  if (idle != num_idle_) {
    return Status::Error("the idle list holds " + std::to_string(idle) + " blocks, counted " +
                         std::to_string(num_idle_));
  }
  for (size_t b = 0; b < ref_counts_.size(); ++b) {
    if (ref_counts_[b] < 0) {
      return Status::Error("block " + std::to_string(b) + " has a negative reference count");
    }
    if (in_idle_list[b] != (ref_counts_[b] == 0 && retained_[b] != 0)) {
      return Status::Error("block " + std::to_string(b) + " is " + (in_idle_list[b] ? "" : "not ") +
                           "on the idle list with reference count " +
                           std::to_string(ref_counts_[b]));
    }
    if (in_idle_list[b]) continue;
    if ((ref_counts_[b] == 0) != (in_free_list[b] != 0)) {
      return Status::Error("block " + std::to_string(b) + " has reference count " +
                           std::to_string(ref_counts_[b]) +
                           (in_free_list[b] ? " but is on the free list" : " but is not in use"));
    }
  }
  return Status::Ok();
}

}  // namespace kvq
