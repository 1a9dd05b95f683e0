#include "kv/dense_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/fp16.h"
#include "kv/attention_ref.h"
#include "kv/kv_test_util.h"

namespace kvq {
namespace {

struct DenseCase {
  int64_t heads, kv_heads, head_dim;
  std::vector<int64_t> chunks;  // tokens appended per step (prefill, then decode steps)
};

// Appends chunks the way a forward pass does and compares every Attend with
// AttentionRef over the values the cache actually stores (for f16: the
// rounded values), so the only difference left is summation order in f32.
void CheckAgainstReference(DenseKvType type, const DenseCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const KvShape shape{1, c.heads, c.kv_heads, c.head_dim};
  auto cache = MakeDenseKvCache(shape, type, 4096);
  ASSERT_TRUE(cache->AddSequence(0).ok());
  const int64_t row = c.kv_heads * c.head_dim;
  std::vector<float> all_k, all_v;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  for (int64_t n : c.chunks) {
    auto k = Normal(n * row, rng), v = Normal(n * row, rng);
    auto q = Normal(n * c.heads * c.head_dim, rng);
    ASSERT_TRUE(cache->Append(0, 0, n, k.data(), k.data(), v.data()).ok());
    for (size_t i = 0; i < k.size(); ++i) {
      const bool f16 = type == DenseKvType::kF16;
      all_k.push_back(f16 ? F16ToF32(F32ToF16(k[i])) : k[i]);
      all_v.push_back(f16 ? F16ToF32(F32ToF16(v[i])) : v[i]);
    }
    const int64_t total = static_cast<int64_t>(all_k.size()) / row;
    ASSERT_EQ(cache->Length(0, 0), total);
    std::vector<float> out(q.size()), expected(q.size());
    ASSERT_TRUE(cache->Attend(0, 0, n, q.data(), scale, out.data()).ok());
    AttentionRef(q.data(), all_k.data(), all_v.data(), n, total, c.heads, c.kv_heads, c.head_dim,
                 scale, expected.data());
    // Outputs are convex combinations of V rows (|v| ~ N(0,1), so |out| <~ 4);
    // f32 dots of length head_dim and sums over <= 300 tokens lose at most
    // ~(head_dim + total) * 2^-24 relative: 1e-4 absolute is a generous bound
    // that still catches a wrong token, head or mask (errors of order 0.1).
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_NEAR(out[i], expected[i], 1e-4) << "index " << i << " total " << total;
    }
  }
}

TEST(DenseKvCache, MatchesReferenceAcrossShapesAndGqaRatios) {
  const std::vector<DenseCase> cases = {
      {1, 1, 64, {1, 1, 1}},          {2, 2, 64, {7, 1, 1}},    {14, 2, 64, {33, 1, 1, 1}},
      {8, 1, 128, {300, 1}},          {6, 3, 64, {5, 2, 1}},    {32, 8, 128, {17, 1}},
      {7, 1, 32, {1, 1, 1, 1, 1, 1}}, {4, 4, 128, {64, 64, 1}},
  };
  uint32_t seed = 1;
  for (const DenseCase& c : cases) {
    for (DenseKvType type : {DenseKvType::kF32, DenseKvType::kF16}) {
      SCOPED_TRACE(testing::Message() << "heads " << c.heads << " kv " << c.kv_heads << " dim "
                                      << c.head_dim << " type " << static_cast<int>(type));
      CheckAgainstReference(type, c, seed++);
    }
  }
}

TEST(DenseKvCache, RejectsOverflowAndUnknownSequences) {
  const KvShape shape{2, 2, 1, 8};
  auto cache = MakeDenseKvCache(shape, DenseKvType::kF16, 4);
  ASSERT_TRUE(cache->AddSequence(3).ok());
  EXPECT_FALSE(cache->AddSequence(3).ok());
  std::vector<float> kv(5 * 8, 0.5f);
  EXPECT_TRUE(cache->Append(3, 0, 4, kv.data(), kv.data(), kv.data()).ok());
  Status full = cache->Append(3, 0, 1, kv.data(), kv.data(), kv.data());
  EXPECT_FALSE(full.ok());
  EXPECT_NE(full.message().find("exceed the context of 4"), std::string::npos) << full.message();
  EXPECT_FALSE(cache->Append(9, 0, 1, kv.data(), kv.data(), kv.data()).ok());
  EXPECT_EQ(cache->BytesUsed(), 2u * 4 * 8 * sizeof(uint16_t));
  cache->ReleaseSequence(3);
  EXPECT_EQ(cache->BytesUsed(), 0u);
}

// The dense cache has no blocks to share: Fork is a deep copy, Truncate
// shrinks the arrays; attention after either sees exactly the kept rows.
TEST(DenseKvCache, ForkCopiesAndTruncateKeepsAPrefix) {
  std::mt19937 rng(4);
  const KvShape shape{1, 4, 2, 16};
  auto cache = MakeDenseKvCache(shape, DenseKvType::kF32, 64);
  ASSERT_TRUE(cache->AddSequence(0).ok());
  auto k = Normal(10 * 2 * 16, rng), v = Normal(10 * 2 * 16, rng);
  ASSERT_TRUE(cache->Append(0, 0, 10, k.data(), k.data(), v.data()).ok());
  ASSERT_TRUE(cache->Fork(0, 1).ok());
  EXPECT_FALSE(cache->Fork(0, 1).ok());
  EXPECT_FALSE(cache->Fork(7, 8).ok());
  EXPECT_EQ(cache->BytesUsed(), 2u * 2 * 10 * 2 * 16 * sizeof(float));
  EXPECT_EQ(cache->Usage().sequences, 2);
  EXPECT_FALSE(cache->Truncate(0, 11).ok());
  ASSERT_TRUE(cache->Truncate(0, 6).ok());
  EXPECT_EQ(cache->Length(0, 0), 6);
  EXPECT_EQ(cache->Length(1, 0), 10);
  const auto q = Normal(4 * 16, rng);
  std::vector<float> out(q.size()), expected(q.size());
  const float scale = 0.25f;
  for (SeqId seq : {0, 1}) {
    const int64_t total = cache->Length(seq, 0);
    ASSERT_TRUE(cache->Attend(seq, 0, 1, q.data(), scale, out.data()).ok());
    AttentionRef(q.data(), k.data(), v.data(), 1, total, 4, 2, 16, scale, expected.data());
    // Same f32 values, different summation order: see the bound above.
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], expected[i], 1e-4);
  }
}

TEST(DenseKvCache, ParsesTypeNames) {
  EXPECT_TRUE(ParseDenseKvType("f16").ok());
  auto bad = ParseDenseKvType("int3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("f32, f16"), std::string::npos);
}

}  // namespace
}  // namespace kvq
