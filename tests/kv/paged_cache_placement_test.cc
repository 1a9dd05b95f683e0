// A sequence's attention must not depend on where its blocks lie in the
// arena: that is decided by the other sequences (whoever took the blocks
// before it), so a dependence would make one request's output depend on the
// load (SchedulerOptions::batch_invariant) and a prefix-cache hit differ
// from computing the prompt. The fused kernels read physically consecutive
// blocks as one run (paged_cache_attend.cc); here the same sequence is
// stored once in consecutive blocks and once in blocks interleaved with
// another sequence's, and every attention output must be the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kv/codec.h"
#include "kv/kv_factory.h"
#include "kv/kv_test_util.h"
#include "kv/paged_cache.h"

namespace kvq {
namespace {

struct Chunk {
  int64_t tokens;
  std::vector<std::vector<float>> k, v, q;  // per layer
};

// The target's appends: prefill chunks (odd sizes, so runs start mid-block),
// then decode steps, with a query block for each.
std::vector<Chunk> TargetChunks(const KvShape& shape, std::mt19937& rng) {
  std::vector<Chunk> chunks;
  for (int64_t n : {37, 50, 1, 1, 19, 1, 70, 1, 1}) {
    Chunk c{n, {}, {}, {}};
    const size_t kv = static_cast<size_t>(n * shape.num_kv_heads * shape.head_dim);
    const size_t q = static_cast<size_t>(n * shape.num_heads * shape.head_dim);
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      c.k.push_back(Normal(kv, rng));
      c.v.push_back(Normal(kv, rng));
      c.q.push_back(Normal(q, rng));
    }
    chunks.push_back(std::move(c));
  }
  return chunks;
}

// Every attention output of the target (seq 1), its blocks consecutive or,
// with `interleave`, alternating with another sequence's (seq 2 appends a
// block's worth of tokens after each of the target's chunks; after, so that
// codecs that calibrate on the first rows they see, fp8's scale, see the
// target's first chunk either way: that dependence is the cache's
// FirstRowsCalibrate, not placement).
std::vector<float> TargetOutputs(const std::string& codec, const KvShape& shape,
                                 const std::vector<Chunk>& chunks, bool interleave, int threads) {
  KvCacheOptions options;
  options.k_type = options.v_type = codec;
  if (codec.find("-prerope") != std::string::npos) options.v_type = "f16";  // a K-only form
  options.block_tokens = 16;
  options.max_tokens = 1000;
  options.num_threads = threads;
  auto layout = ComputeKvLayout(shape, options);
  EXPECT_TRUE(layout.ok()) << layout.status().message();
  if (!layout.ok()) return {};
  options.memory_bytes =
      layout->side_bytes + layout->block_bytes * 2 * (400 / 16 + 2 + layout->staging_blocks);
  auto cache = PagedKvCache::Create(shape, options);
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  if (!cache.ok()) return {};
  EXPECT_TRUE((*cache)->AddSequence(1).ok());
  EXPECT_TRUE((*cache)->AddSequence(2).ok());
  std::mt19937 other_rng(5);
  std::vector<float> outputs;
  for (const Chunk& c : chunks) {
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      const size_t l_index = static_cast<size_t>(l);
      EXPECT_TRUE((*cache)
                      ->Append(1, l, c.tokens, c.k[l_index].data(), c.k[l_index].data(),
                               c.v[l_index].data())
                      .ok());
      std::vector<float> out(c.q[l_index].size());
      EXPECT_TRUE((*cache)
                      ->Attend(1, l, c.tokens, c.q[l_index].data(),
                               1.0f / std::sqrt(static_cast<float>(shape.head_dim)), out.data())
                      .ok());
      outputs.insert(outputs.end(), out.begin(), out.end());
    }
    if (interleave) {
      const size_t count = static_cast<size_t>(16 * shape.num_kv_heads * shape.head_dim);
      for (int64_t l = 0; l < shape.num_layers; ++l) {
        const auto k = Normal(count, other_rng), v = Normal(count, other_rng);
        EXPECT_TRUE((*cache)->Append(2, l, 16, k.data(), k.data(), v.data()).ok());
      }
    }
  }
  return outputs;
}

TEST(PagedKvCachePlacement, AttentionIsTheSameInScatteredBlocks) {
  std::vector<std::string> codecs = AllKvCodecNames(64);
  for (const std::string& s : AllKvStreamingCodecNames(64)) codecs.push_back(s);
  struct Case {
    int64_t heads, kv_heads, head_dim;
    int threads;
  };
  int checked = 0;
  for (const Case& c : {Case{8, 2, 64, 1}, Case{12, 2, 128, 2}}) {
    KvShape shape{2, c.heads, c.kv_heads, c.head_dim};
    for (int64_t i = 0; i < c.head_dim / 2; ++i) {  // for the pre-RoPE K forms
      shape.rope_inv_freq.push_back(
          std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(c.head_dim)));
    }
    std::mt19937 rng(static_cast<uint32_t>(c.head_dim));
    const std::vector<Chunk> chunks = TargetChunks(shape, rng);
    for (const std::string& codec : codecs) {
      if (!ParseKvCodec(codec, c.head_dim).ok()) continue;
      SCOPED_TRACE(codec + " head_dim " + std::to_string(c.head_dim));
      const std::vector<float> consecutive = TargetOutputs(codec, shape, chunks, false, c.threads);
      const std::vector<float> scattered = TargetOutputs(codec, shape, chunks, true, c.threads);
      ASSERT_EQ(consecutive.size(), scattered.size());
      size_t differ = 0;
      for (size_t i = 0; i < consecutive.size(); ++i) differ += consecutive[i] != scattered[i];
      EXPECT_EQ(differ, 0u) << "of " << consecutive.size() << " outputs";
      ++checked;
    }
  }
  // Every registered family, per token and streaming, at both head sizes.
  EXPECT_GE(checked, 2 * 20);
}

}  // namespace
}  // namespace kvq
