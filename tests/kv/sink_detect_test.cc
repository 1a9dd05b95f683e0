// Detected attention sinks (-aN, kv/paged_cache_sinks.cc): a planted token
// that draws most of the attention mass is found during prefill and kept in
// f16 (its decoded rows are the f16 rows of what was appended, and attention
// reads them), the planner counts the rows, truncate drops a detection past
// the new length and fork keeps it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "kv/attention_ref.h"
#include "kv/codec_int_scores.h"
#include "kv/codec_registry.h"
#include "kv/kv_factory.h"
#include "kv/kv_test_util.h"
#include "kv/paged_cache.h"

namespace kvq {
namespace {

constexpr int64_t kDim = 64, kHeads = 4, kTokens = 64, kSink = 37;

float F16(float x) { return F16ToF32(F32ToF16(x)); }

// Keys N(0, 0.5) except token kSink, 10u with u a unit direction every query
// leans on (q = 4u + N(0, 0.5)): its scaled score is ~40 / 8 = 5 while the
// others' are N(0, ~0.35), so it draws ~e^5 / (e^5 + 63) ~ 70% of every
// row's mass.
struct Planted {
  std::vector<float> k, v, q;  // [tokens, 1, dim], same, [tokens, heads, dim]
};
Planted MakePlanted(std::mt19937& rng) {
  Planted p;
  p.k = Normal(static_cast<size_t>(kTokens * kDim), rng, 0.5f);
  p.v = Normal(p.k.size(), rng);
  p.q = Normal(static_cast<size_t>(kTokens * kHeads * kDim), rng, 0.5f);
  std::vector<float> u = Normal(kDim, rng);
  double norm = 0;
  for (float x : u) norm += double{x} * x;
  for (float& x : u) x = static_cast<float>(x / std::sqrt(norm));
  for (int64_t i = 0; i < kDim; ++i) {
    p.k[kSink * kDim + i] = 10.0f * u[i];
    for (int64_t r = 0; r < kTokens * kHeads; ++r) p.q[r * kDim + i] += 4.0f * u[i];
  }
  return p;
}

std::unique_ptr<PagedKvCache> Make(const std::string& type) {
  KvCacheOptions options;
  options.k_type = options.v_type = type;
  options.max_tokens = 256;
  options.num_threads = 2;
  auto cache = PagedKvCache::Create(KvShape{1, kHeads, 1, kDim}, options);
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  return cache.ok() ? std::move(cache).value() : nullptr;
}

// Prefill: Append then Attend, as Transformer::Forward does.
void Prefill(PagedKvCache& cache, const Planted& p) {
  ASSERT_TRUE(cache.AddSequence(0).ok());
  ASSERT_TRUE(cache.Append(0, 0, kTokens, p.k.data(), p.k.data(), p.v.data()).ok());
  std::vector<float> out(p.q.size());
  ASSERT_TRUE(cache.Attend(0, 0, kTokens, p.q.data(), 0.125f, out.data()).ok());
}

// Whether token t decodes to the f16 rounding of what was appended (K and V).
bool StoredInF16(PagedKvCache& cache, SeqId seq, const Planted& p, int64_t t) {
  const int64_t total = cache.Length(seq, 0);
  std::vector<float> k(static_cast<size_t>(total * kDim)), v(k.size());
  EXPECT_TRUE(cache.DecodeLayer(seq, 0, k.data(), v.data()).ok());
  for (int64_t i = 0; i < kDim; ++i) {
    if (k[t * kDim + i] != F16(p.k[t * kDim + i]) || v[t * kDim + i] != F16(p.v[t * kDim + i]))
      return false;
  }
  return true;
}

TEST(SinkDetection, PlantedSinkIsFoundKeptInF16AndReadByAttention) {
  std::mt19937 rng(7);
  const Planted p = MakePlanted(rng);
  auto cache = Make("int2-g64-asym-a2");
  ASSERT_NE(cache, nullptr);
  Prefill(*cache, p);
  EXPECT_TRUE(StoredInF16(*cache, 0, p, kSink));
  int others_f16 = 0;  // at most one more slot (a=2): the rest stay int2
  for (int64_t t = 0; t < kTokens; ++t) others_f16 += t != kSink && StoredInF16(*cache, 0, p, t);
  EXPECT_LE(others_f16, 1);

  // Without -a the planted token is an int2 row like the others.
  auto plain = Make("int2-g64-asym-s1");
  ASSERT_NE(plain, nullptr);
  Prefill(*plain, p);
  EXPECT_FALSE(StoredInF16(*plain, 0, p, kSink));

  // A decode query reads the f16 row: equal to softmax attention over the
  // decoded rows with the int8 query for int2 rows (codec_int_scores.h) and
  // the f32 query for the f16 rows (the detected sink). Same f32-rounding
  // bound as paged_cache_test's kernel comparison.
  const std::vector<float> k1 = Normal(kDim, rng, 0.5f), v1 = Normal(kDim, rng);
  ASSERT_TRUE(cache->Append(0, 0, 1, k1.data(), k1.data(), v1.data()).ok());
  std::vector<float> q(p.q.begin(), p.q.begin() + kHeads * kDim), out(q.size()), expected(q.size());
  ASSERT_TRUE(cache->Attend(0, 0, 1, q.data(), 0.125f, out.data()).ok());
  const int64_t total = kTokens + 1;
  std::vector<float> kd(static_cast<size_t>(total * kDim)), vd(kd.size()), q8(q.size());
  ASSERT_TRUE(cache->DecodeLayer(0, 0, kd.data(), vd.data()).ok());
  std::vector<int8_t> i8(kDim);
  float qs = 0;
  int32_t qsum = 0;
  for (int64_t h = 0; h < kHeads; ++h) {
    codec::QuantizeQueryRef(&q[h * kDim], kDim, kDim, i8.data(), &qs, &qsum);
    for (int64_t i = 0; i < kDim; ++i) q8[h * kDim + i] = qs * i8[i];
  }
  std::vector<char> f16_row(static_cast<size_t>(total));
  // (The decode token is encoded at once: -a keeps no window.)
  for (int64_t t = 0; t < kTokens; ++t) f16_row[t] = StoredInF16(*cache, 0, p, t);
  auto score = [&](int64_t, int64_t h, int64_t t) {
    const float* qh = (f16_row[t] ? q : q8).data() + h * kDim;
    double dot = 0;
    for (int64_t i = 0; i < kDim; ++i) dot += double{qh[i]} * kd[t * kDim + i];
    return dot * 0.125;
  };
  AttentionRefScored(score, vd.data(), 1, total, kHeads, 1, kDim, expected.data());
  EXPECT_LE(Nmse(out, expected), 1e-9);
}

TEST(SinkDetection, TruncateDropsAndForkKeepsDetections) {
  std::mt19937 rng(8);
  const Planted p = MakePlanted(rng);
  auto cache = Make("int4-a1");
  ASSERT_NE(cache, nullptr);
  Prefill(*cache, p);
  ASSERT_TRUE(StoredInF16(*cache, 0, p, kSink));
  ASSERT_TRUE(cache->Fork(0, 1).ok());
  EXPECT_TRUE(StoredInF16(*cache, 1, p, kSink));
  ASSERT_TRUE(cache->Truncate(0, 30).ok());
  // Re-append the same tokens one at a time (decode steps measure nothing):
  // the sink is now an int4 row in sequence 0, still f16 in its fork.
  for (int64_t t = 30; t < kTokens; ++t) {
    ASSERT_TRUE(cache->Append(0, 0, 1, &p.k[t * kDim], &p.k[t * kDim], &p.v[t * kDim]).ok());
  }
  EXPECT_FALSE(StoredInF16(*cache, 0, p, kSink));
  EXPECT_TRUE(StoredInF16(*cache, 1, p, kSink));
}

TEST(SinkDetection, PlannerCountsTheDetectedRows) {
  const KvShape shape{3, 9, 3, 64};
  KvCacheOptions options;
  options.max_tokens = 1024;
  options.k_type = options.v_type = "int2-g64-asym-s1";
  auto with_s1 = ComputeKvLayout(shape, options);
  options.k_type = options.v_type = "int2-g64-asym-s1-a4";
  auto with_a4 = ComputeKvLayout(shape, options);
  ASSERT_TRUE(with_s1.ok() && with_a4.ok());
  EXPECT_EQ(with_a4->block_bytes, with_s1->block_bytes);
  // 4 more f16 rows per layer, K and V, KV head.
  EXPECT_EQ(with_a4->staging_bytes - with_s1->staging_bytes, size_t{3 * 2 * 3 * 4 * 64 * 2});
  EXPECT_FALSE(ParseKvCodecSpec("int4-a0").ok());
  EXPECT_FALSE(ParseKvCodecSpec("int4-a65").ok());
  EXPECT_FALSE(ParseKvCodecSpec("int4-a2-a3").ok());
  auto spec = ParseKvCodecSpec("int4-a3-s1-r8");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->Name(), "int4-g32-asym-r8-s1-a3");
}

}  // namespace
}  // namespace kvq
