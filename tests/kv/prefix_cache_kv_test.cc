// The paged cache's prefix caching (KvCache's prefix interface,
// kv/prefix_index.h, paged_cache_prefix.cc) on random K/V: full blocks are
// found by their token chain only, a sequence started from them reads the
// same K/V, a retained block is copied before any write, eviction forgets
// blocks, and caches with f16 staging refuse with a reason.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "kv/kv_factory.h"
#include "kv/paged_cache.h"
#include "kv/prefix_index.h"

namespace kvq {
namespace {

const KvShape kShape{2, 4, 2, 64};
constexpr int64_t kBt = 16;

std::unique_ptr<PagedKvCache> MakeCache(int64_t blocks, const std::string& type = "f16") {
  KvCacheOptions options;
  options.k_type = options.v_type = type;
  options.max_tokens = 256;
  options.block_tokens = kBt;
  auto layout = ComputeKvLayout(kShape, options);
  EXPECT_TRUE(layout.ok());
  options.memory_bytes = layout->side_bytes + static_cast<size_t>(blocks) * layout->block_bytes;
  auto cache = PagedKvCache::Create(kShape, options);
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  return std::move(cache).value();
}

void AppendRandom(PagedKvCache& cache, SeqId seq, int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> k(static_cast<size_t>(n * kShape.num_kv_heads * kShape.head_dim));
  std::vector<float> v(k.size());
  for (int64_t l = 0; l < kShape.num_layers; ++l) {
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    ASSERT_TRUE(cache.Append(seq, l, n, k.data(), k.data(), v.data()).ok());
  }
}

// Stored K then V of every layer, decoded (the scalar truth).
std::vector<float> Decoded(const PagedKvCache& cache, SeqId seq, int64_t tokens) {
  std::vector<float> out;
  const size_t row = static_cast<size_t>(kShape.num_kv_heads * kShape.head_dim);
  for (int64_t l = 0; l < kShape.num_layers; ++l) {
    const int64_t length = cache.Length(seq, l);
    std::vector<float> k(static_cast<size_t>(length) * row), v(k.size());
    EXPECT_TRUE(cache.DecodeLayer(seq, l, k.data(), v.data()).ok());
    out.insert(out.end(), k.begin(), k.begin() + static_cast<std::ptrdiff_t>(tokens * row));
    out.insert(out.end(), v.begin(), v.begin() + static_cast<std::ptrdiff_t>(tokens * row));
  }
  return out;
}

std::vector<int32_t> Ids(int64_t n, int32_t first = 0) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

TEST(KvPrefixIndex, FindsOnlyTheExactChain) {
  KvPrefixIndex index;
  const std::vector<int32_t> a = Ids(kBt), b = Ids(kBt, 1);
  const uint64_t ha = KvPrefixIndex::ChainHash(0, a);
  EXPECT_NE(ha, KvPrefixIndex::ChainHash(0, b));
  EXPECT_NE(ha, KvPrefixIndex::ChainHash(1, a));
  EXPECT_TRUE(index.Insert(ha, 0, a, 5));
  EXPECT_FALSE(index.Insert(ha, 0, a, 6));  // the same prefix again: first block stays
  EXPECT_FALSE(index.Insert(KvPrefixIndex::ChainHash(0, b), 0, b, 5));  // block 5 is taken
  EXPECT_EQ(index.Find(ha, 0, a), 5);
  // A forged collision (same hash, other tokens or parent) is a miss.
  EXPECT_EQ(index.Find(ha, 0, b), -1);
  EXPECT_EQ(index.Find(ha, 7, a), -1);
  index.Erase(5);
  EXPECT_EQ(index.Find(ha, 0, a), -1);
  EXPECT_EQ(index.size(), 0);
}

TEST(PagedKvCachePrefix, SharesFullBlocksByTokenChain) {
  std::mt19937 rng(3);
  auto cache = MakeCache(16);
  ASSERT_EQ(cache->PrefixCachingUnsupported(), "");
  ASSERT_TRUE(cache->SetPrefixCaching(true).ok());
  const std::vector<int32_t> ids = Ids(40);
  ASSERT_TRUE(cache->AddSequence(1).ok());
  AppendRandom(*cache, 1, 40, rng);
  EXPECT_EQ(cache->FindCachedPrefix(ids, 39).blocks, 0);  // nothing offered yet
  cache->CacheFullBlocks(1, ids);
  KvPrefixHit hit = cache->FindCachedPrefix(ids, 39);
  EXPECT_EQ(hit.blocks, 2);  // the third block is not full
  EXPECT_EQ(hit.tokens, 32);
  EXPECT_EQ(hit.idle_blocks, 0);
  EXPECT_EQ(cache->FindCachedPrefix(ids, 20).tokens, 20);  // capped, 2 blocks
  // The chain: another token in block 1 keeps block 0 only; in block 0, nothing.
  std::vector<int32_t> other = ids;
  other[20] = 999;
  EXPECT_EQ(cache->FindCachedPrefix(other, 39).blocks, 1);
  other[3] = 999;
  EXPECT_EQ(cache->FindCachedPrefix(other, 39).blocks, 0);

  ASSERT_TRUE(cache->AddSequenceWithPrefix(2, ids, 32).ok());
  EXPECT_EQ(cache->Length(2, 0), 32);
  const auto t1 = cache->BlockTable(1), t2 = cache->BlockTable(2);
  ASSERT_EQ(t2.size(), 2u);
  EXPECT_EQ(t2[0], t1[0]);
  EXPECT_EQ(t2[1], t1[1]);
  EXPECT_EQ(cache->allocator().RefCount(t1[0]), 2);
  EXPECT_EQ(Decoded(*cache, 2, 32), Decoded(*cache, 1, 32));
  EXPECT_FALSE(cache->AddSequenceWithPrefix(3, other, 16).ok());  // not cached
  AppendRandom(*cache, 2, 5, rng);                                // grows into a block of its own
  EXPECT_EQ(cache->BlockTable(2).size(), 3u);
  EXPECT_EQ(cache->Usage().blocks_logical, 6);
  EXPECT_EQ(cache->Usage().blocks_used, 4);

  // Released: the full blocks stay cached (idle, counted free).
  const std::vector<float> prefix = Decoded(*cache, 1, 32);
  cache->ReleaseSequence(1);
  cache->ReleaseSequence(2);
  EXPECT_EQ(cache->Usage().blocks_used, 0);
  EXPECT_EQ(cache->Usage().blocks_cached, 2);
  EXPECT_EQ(cache->allocator().NumFree(), 16);
  hit = cache->FindCachedPrefix(ids, 39);
  EXPECT_EQ(hit.idle_blocks, 2);
  ASSERT_TRUE(cache->AddSequenceWithPrefix(4, ids, 32).ok());
  EXPECT_EQ(Decoded(*cache, 4, 32), prefix);
  EXPECT_EQ(cache->Usage().blocks_cached, 0);
  EXPECT_TRUE(cache->allocator().CheckInvariants().ok());
}

// A partly reused or truncated-into retained block is copied before the
// first write, even when no other sequence holds it, so the cached prefix
// keeps its K/V.
TEST(PagedKvCachePrefix, RetainedBlocksAreCopiedOnWrite) {
  std::mt19937 rng(5);
  auto cache = MakeCache(16);
  ASSERT_TRUE(cache->SetPrefixCaching(true).ok());
  const std::vector<int32_t> ids = Ids(32);
  ASSERT_TRUE(cache->AddSequence(1).ok());
  AppendRandom(*cache, 1, 32, rng);
  cache->CacheFullBlocks(1, ids);
  const std::vector<float> cached = Decoded(*cache, 1, 32);
  const BlockId last = cache->BlockTable(1)[1];
  ASSERT_TRUE(cache->Truncate(1, 20).ok());  // into the published second block
  // 12 tokens left in the two blocks, 14 free blocks of which one goes to
  // copying the retained block first (236 if it were written in place).
  EXPECT_EQ(cache->Capacity(1), 12 + 13 * kBt);
  AppendRandom(*cache, 1, 4, rng);
  EXPECT_NE(cache->BlockTable(1)[1], last);  // copied, not written in place
  cache->ReleaseSequence(1);
  const KvPrefixHit hit = cache->FindCachedPrefix(ids, 31);
  ASSERT_EQ(hit.blocks, 2);
  ASSERT_TRUE(cache->AddSequenceWithPrefix(2, ids, hit.tokens).ok());
  // Compare the shared rows with what was cached, layer by layer (K, V).
  const std::vector<float> now = Decoded(*cache, 2, 31);
  const size_t row = static_cast<size_t>(kShape.num_kv_heads * kShape.head_dim);
  for (size_t part = 0; part < 2 * static_cast<size_t>(kShape.num_layers); ++part) {
    for (size_t i = 0; i < 31 * row; ++i) {
      ASSERT_EQ(now[part * 31 * row + i], cached[part * 32 * row + i]) << part << " " << i;
    }
  }
  AppendRandom(*cache, 2, 1, rng);  // token 31 lands in the shared cached block: copy
  EXPECT_NE(cache->BlockTable(2)[1], last);
  cache->ReleaseSequence(2);
  EXPECT_EQ(cache->Usage().blocks_cached, 2);
  EXPECT_TRUE(cache->allocator().CheckInvariants().ok());
}

TEST(PagedKvCachePrefix, EvictionAndSwitchingOffForgetBlocks) {
  std::mt19937 rng(9);
  auto cache = MakeCache(4);
  ASSERT_TRUE(cache->SetPrefixCaching(true).ok());
  const std::vector<int32_t> a = Ids(48), b = Ids(48, 100);
  ASSERT_TRUE(cache->AddSequence(1).ok());
  AppendRandom(*cache, 1, 48, rng);
  cache->CacheFullBlocks(1, a);
  cache->ReleaseSequence(1);
  EXPECT_EQ(cache->Usage().blocks_cached, 3);
  ASSERT_TRUE(cache->AddSequence(2).ok());
  AppendRandom(*cache, 2, 40, rng);  // 3 blocks: 1 free + 2 evicted (a's tail first)
  EXPECT_EQ(cache->FindCachedPrefix(a, 47).blocks, 1);
  cache->CacheFullBlocks(2, b);
  cache->ReleaseSequence(2);
  ASSERT_TRUE(cache->SetPrefixCaching(false).ok());
  EXPECT_EQ(cache->Usage().blocks_cached, 0);
  EXPECT_EQ(cache->allocator().NumFree(), 4);
  EXPECT_EQ(cache->FindCachedPrefix(b, 47).blocks, 0);
  EXPECT_TRUE(cache->allocator().CheckInvariants().ok());
}

TEST(PagedKvCachePrefix, StreamingCachesRefuseWithAReason) {
  for (const char* type : {"f16-r8", "int2-c32-asym-r64", "bf16-s3"}) {
    auto cache = MakeCache(16, type);
    ASSERT_NE(cache, nullptr) << type;
    EXPECT_NE(cache->PrefixCachingUnsupported().find("f16"), std::string::npos) << type;
    EXPECT_FALSE(cache->SetPrefixCaching(true).ok()) << type;
    EXPECT_TRUE(cache->SetPrefixCaching(false).ok()) << type;
    EXPECT_EQ(cache->FindCachedPrefix(Ids(40), 39).blocks, 0) << type;
  }
}

}  // namespace
}  // namespace kvq
