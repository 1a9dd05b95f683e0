#include "kv/block_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <vector>

namespace kvq {
namespace {

TEST(BlockAllocator, RejectsBadSizesAndReportsExhaustion) {
  EXPECT_FALSE(BlockAllocator::Create(0, 4).ok());
  EXPECT_FALSE(BlockAllocator::Create(100, 4).ok());  // not a multiple of 64
  EXPECT_FALSE(BlockAllocator::Create(64, -1).ok());
  auto alloc = BlockAllocator::Create(128, 2);
  ASSERT_TRUE(alloc.ok());
  auto a = (*alloc)->Allocate(), b = (*alloc)->Allocate();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  auto c = (*alloc)->Allocate();
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("out of memory"), std::string::npos);
  (*alloc)->Unref(*a);
  EXPECT_EQ((*alloc)->NumFree(), 1);
  EXPECT_TRUE((*alloc)->Allocate().ok());
  auto empty = BlockAllocator::Create(64, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE((*empty)->Allocate().ok());
}

TEST(BlockAllocator, BlocksAreAlignedAndDisjoint) {
  auto alloc = BlockAllocator::Create(192, 5);
  ASSERT_TRUE(alloc.ok());
  for (BlockId b = 0; b < 5; ++b) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*alloc)->BlockData(b)) % 64, 0u);
    if (b > 0) {
      EXPECT_EQ((*alloc)->BlockData(b) - (*alloc)->BlockData(b - 1), 192);
    }
  }
}

// Random Allocate / Ref / Unref sequences checked against a plain model of
// who holds which reference. "Holders" stand for sequences: each holds a list
// of references; a fork copies a holder's list (Ref on each), a release drops
// them all. The allocator must agree with the model after every step, never
// hand out a block that someone still references, and end empty.
TEST(BlockAllocator, RandomOperationsMatchAReferenceModel) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    const int64_t num_blocks = 1 + static_cast<int64_t>(rng() % 40);
    auto created = BlockAllocator::Create(64, num_blocks);
    ASSERT_TRUE(created.ok());
    BlockAllocator& alloc = **created;
    std::vector<std::vector<BlockId>> holders(6);
    std::map<BlockId, int32_t> model;  // block -> expected reference count
    for (int step = 0; step < 3000; ++step) {
      auto& holder = holders[rng() % holders.size()];
      switch (rng() % 5) {
        case 0:
        case 1: {  // allocate
          auto block = alloc.Allocate();
          if (static_cast<int64_t>(model.size()) == num_blocks) {
            ASSERT_FALSE(block.ok()) << "allocated past the budget";
            break;
          }
          ASSERT_TRUE(block.ok());
          ASSERT_EQ(model.count(*block), 0u) << "block " << *block << " handed out twice";
          model[*block] = 1;
          holder.push_back(*block);
          break;
        }
        case 2: {  // fork: another holder shares all of this one's blocks
          auto& other = holders[rng() % holders.size()];
          if (&other == &holder) break;
          for (BlockId b : holder) {
            alloc.Ref(b);
            ++model[b];
            other.push_back(b);
          }
          break;
        }
        case 3: {  // drop one reference
          if (holder.empty()) break;
          const size_t i = rng() % holder.size();
          const BlockId b = holder[i];
          holder.erase(holder.begin() + static_cast<std::ptrdiff_t>(i));
          alloc.Unref(b);
          if (--model[b] == 0) model.erase(b);
          break;
        }
        case 4: {  // release the whole holder
          for (BlockId b : holder) {
            alloc.Unref(b);
            if (--model[b] == 0) model.erase(b);
          }
          holder.clear();
          break;
        }
      }
      ASSERT_TRUE(alloc.CheckInvariants().ok()) << alloc.CheckInvariants().message();
      ASSERT_EQ(alloc.NumUsed(), static_cast<int64_t>(model.size()));
      for (const auto& [b, count] : model) ASSERT_EQ(alloc.RefCount(b), count) << "block " << b;
    }
    for (auto& holder : holders) {
      for (BlockId b : holder) alloc.Unref(b);
      holder.clear();
    }
    EXPECT_EQ(alloc.NumFree(), num_blocks);
    EXPECT_EQ(alloc.NumUsed(), 0);
    EXPECT_TRUE(alloc.CheckInvariants().ok());
  }
}

// Retained blocks park on the idle list when released, still count as free,
// are revived by Ref, and are evicted oldest release first, only after every
// truly free block is gone, with the owner told through the callback.
TEST(BlockAllocator, RetainedBlocksIdleRevivedAndEvictedLeastRecentlyUsed) {
  auto created = BlockAllocator::Create(64, 4);
  ASSERT_TRUE(created.ok());
  BlockAllocator& alloc = **created;
  std::vector<BlockId> evicted;
  alloc.SetEvictionCallback([&](BlockId b) { evicted.push_back(b); });
  std::vector<BlockId> b;
  for (int i = 0; i < 3; ++i) b.push_back(*alloc.Allocate());
  for (BlockId x : b) alloc.SetRetained(x, true);
  alloc.Unref(b[1]);  // released in the order 1, 0, 2
  alloc.Unref(b[0]);
  alloc.Unref(b[2]);
  ASSERT_TRUE(alloc.CheckInvariants().ok()) << alloc.CheckInvariants().message();
  EXPECT_EQ(alloc.NumIdle(), 3);
  EXPECT_EQ(alloc.NumFree(), 4);
  EXPECT_EQ(alloc.NumUsed(), 0);
  alloc.Ref(b[0]);  // revived: no longer idle or free
  EXPECT_EQ(alloc.RefCount(b[0]), 1);
  EXPECT_EQ(alloc.NumIdle(), 2);
  ASSERT_TRUE(alloc.CheckInvariants().ok()) << alloc.CheckInvariants().message();
  const BlockId fresh = *alloc.Allocate();  // the never-used block first
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(*alloc.Allocate(), b[1]);  // then the oldest idle
  EXPECT_EQ(*alloc.Allocate(), b[2]);
  EXPECT_EQ(evicted, (std::vector<BlockId>{b[1], b[2]}));
  EXPECT_FALSE(alloc.IsRetained(b[1]));
  EXPECT_FALSE(alloc.Allocate().ok());
  ASSERT_TRUE(alloc.CheckInvariants().ok()) << alloc.CheckInvariants().message();
  // Un-retaining an idle block frees it; un-retaining a held one lets its
  // last Unref free it.
  alloc.Unref(b[0]);
  EXPECT_EQ(alloc.NumIdle(), 1);
  alloc.SetRetained(b[0], false);
  EXPECT_EQ(alloc.NumIdle(), 0);
  EXPECT_EQ(alloc.NumFree(), 1);
  alloc.SetRetained(fresh, true);
  alloc.SetRetained(fresh, false);
  alloc.Unref(fresh);
  alloc.Unref(b[1]);
  alloc.Unref(b[2]);
  EXPECT_EQ(alloc.NumFree(), 4);
  EXPECT_EQ(alloc.NumIdle(), 0);
  EXPECT_TRUE(alloc.CheckInvariants().ok()) << alloc.CheckInvariants().message();
}

#ifndef NDEBUG
TEST(BlockAllocatorDeathTest, DoubleFreeIsCaughtInDebugBuilds) {
  auto alloc = BlockAllocator::Create(64, 1);
  ASSERT_TRUE(alloc.ok());
  auto b = (*alloc)->Allocate();
  ASSERT_TRUE(b.ok());
  (*alloc)->Unref(*b);
  EXPECT_DEATH((*alloc)->Unref(*b), "double free");
}
#endif

}  // namespace
}  // namespace kvq
