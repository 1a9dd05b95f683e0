// Attention over runs of physically consecutive blocks (one codec call per
// run, paged_cache_attend.cc) against the same cache contents scattered
// over every other block (one call per block): the outputs must be equal
// bit for bit, since each codec kernel's per-row sums and its per-lane
// accumulation order over tokens do not depend on how many rows one call
// reads (blocks that hold sinks are read alone in both). Also checks the slot-major placement of
// tiles in the arena.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kv/block_allocator.h"
#include "kv/kv_factory.h"
#include "kv/paged_cache.h"

namespace kvq {
namespace {

TEST(BlockAllocator, SlotsOfConsecutiveBlocksAreAdjacentAndDisjoint) {
  // Slots of 64 and 128 bytes in 192-byte blocks.
  auto alloc = BlockAllocator::Create(192, 5);
  ASSERT_TRUE(alloc.ok());
  BlockAllocator& a = **alloc;
  const uint8_t* arena = a.BlockData(0);
  std::vector<int> owner(192 * 5, -1);
  for (BlockId b = 0; b < 5; ++b) {
    const uint8_t* s0 = a.BlockSlot(b, 0, 64);
    const uint8_t* s1 = a.BlockSlot(b, 64, 128);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s0) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s1) % 64, 0u);
    if (b > 0) {
      EXPECT_EQ(s0 - a.BlockSlot(b - 1, 0, 64), 64);
      EXPECT_EQ(s1 - a.BlockSlot(b - 1, 64, 128), 128);
    }
    for (auto [p, bytes] : {std::pair{s0, 64}, std::pair{s1, 128}}) {
      for (int i = 0; i < bytes; ++i) {
        const ptrdiff_t at = p - arena + i;
        ASSERT_GE(at, 0);
        ASSERT_LT(at, 192 * 5);  // inside the arena
        EXPECT_EQ(owner[static_cast<size_t>(at)], -1) << "slots overlap";
        owner[static_cast<size_t>(at)] = b;
      }
    }
  }
}

// Appends `tokens` random tokens to every layer of `seq`, `chunk` at a time;
// when `other` >= 0, that sequence takes one block's worth of tokens after
// each chunk, so seq's blocks are not consecutive.
void Fill(PagedKvCache& cache, const KvShape& shape, SeqId seq, SeqId other, int64_t tokens,
          int64_t chunk, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t row = shape.num_kv_heads * shape.head_dim;
  std::vector<float> k(static_cast<size_t>(chunk * row)), v(k.size());
  std::vector<float> pad(static_cast<size_t>(cache.layout().block_tokens * row), 0.5f);
  for (int64_t done = 0; done < tokens; done += chunk) {
    const int64_t n = std::min(chunk, tokens - done);
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      const Status appended = cache.Append(seq, l, n, k.data(), k.data(), v.data());
      ASSERT_TRUE(appended.ok()) << appended.message();
      if (other >= 0) {
        const int64_t bt = cache.layout().block_tokens;
        const Status padded = cache.Append(other, l, bt, pad.data(), pad.data(), pad.data());
        ASSERT_TRUE(padded.ok()) << padded.message();
      }
    }
  }
}

TEST(PagedKvCache, RunsOfConsecutiveBlocksMatchBlockByBlockBitForBit) {
  KvShape shape{2, 14, 2, 64};
  for (int64_t i = 0; i < 32; ++i) shape.rope_inv_freq.push_back(std::pow(1e4f, -i / 32.0f));
  // Sinks within one block and across two (read block by block, then runs),
  // pre-RoPE keys (a run decoded and rotated at a time), detected sinks
  // (every block on its own: the two caches take the same path).
  for (const std::string codec : {"f16", "bf16", "int8", "int4", "int2-c32-asym-r64", "f16-r8-s1",
                                  "int4-s2-prerope", "f16-r8-s20-prerope", "int4-a2"}) {
    ASSERT_TRUE(ParseKvCodec(codec, 64).ok()) << codec;
    for (int threads : {1, 3}) {
      SCOPED_TRACE(codec + " threads " + std::to_string(threads));
      KvCacheOptions options;
      options.k_type = options.v_type = codec;
      const size_t pre_rope = codec.find("-prerope");  // K only
      if (pre_rope != std::string::npos) options.v_type = codec.substr(0, pre_rope);
      options.max_tokens = 4096;  // 37 blocks of up to 64 tokens (tile codecs round up)
      options.num_threads = threads;
      auto layout = ComputeKvLayout(shape, options);
      ASSERT_TRUE(layout.ok()) << layout.status().message();
      const int64_t bt = layout->block_tokens;
      const int64_t tokens = 37 * bt + 5;  // a partial last block
      options.memory_bytes =
          layout->side_bytes +
          layout->block_bytes * (2 * (tokens / bt + 2) * 3 + 8 + 2 * layout->staging_blocks);
      auto together = PagedKvCache::Create(shape, options);
      auto apart = PagedKvCache::Create(shape, options);
      ASSERT_TRUE(together.ok() && apart.ok());
      ASSERT_TRUE((*together)->AddSequence(0).ok());
      ASSERT_TRUE((*apart)->AddSequence(0).ok());
      ASSERT_TRUE((*apart)->AddSequence(1).ok());
      Fill(**together, shape, 0, -1, tokens, bt, 7);
      Fill(**apart, shape, 0, 1, tokens, bt, 7);
      if (HasFatalFailure()) return;
      const std::vector<BlockId> runs = (*together)->BlockTable(0);
      const std::vector<BlockId> scattered = (*apart)->BlockTable(0);
      ASSERT_EQ(runs.size(), scattered.size());
      for (size_t j = 1; j < runs.size(); ++j) {
        ASSERT_EQ(runs[j], runs[j - 1] + 1);            // one run
        ASSERT_NE(scattered[j], scattered[j - 1] + 1);  // no two consecutive
      }
      std::mt19937 rng(11);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int64_t n : {1, 3}) {
        std::vector<float> q(static_cast<size_t>(n * shape.num_heads * shape.head_dim));
        for (float& x : q) x = normal(rng);
        std::vector<float> a(q.size()), b(q.size());
        for (int64_t l = 0; l < shape.num_layers; ++l) {
          ASSERT_TRUE((*together)->Attend(0, l, n, q.data(), 0.125f, a.data()).ok());
          ASSERT_TRUE((*apart)->Attend(0, l, n, q.data(), 0.125f, b.data()).ok());
          EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
              << "layer " << l << " queries " << n;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvq
