// Streaming codecs in the paged cache (KvStreaming): KIVI's residual window
// and per-channel keys, sinks, K stored before RoPE, per-layer policies.
// The generic fused-attention-vs-decoded checks for these codecs live in
// paged_cache_test.cc (AvailableCodecs); here are the properties specific to
// streaming.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "kv/attention_ref.h"
#include "kv/codec.h"
#include "kv/kv_factory.h"
#include "kv/kv_policy.h"
#include "kv/kv_test_util.h"
#include "kv/paged_cache.h"
#include "ops/rope.h"

namespace kvq {
namespace {

// Keys like real ones: N(0, 1) plus a few channels that are large in every
// token (the fixed outlier channels KIVI and KVQuant target).
std::vector<float> KeysWithOutlierChannels(int64_t tokens, int64_t kv_heads, int64_t dim,
                                           std::mt19937& rng) {
  std::vector<float> k = Normal(static_cast<size_t>(tokens * kv_heads * dim), rng);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < kv_heads; ++h) {
      for (int64_t c : {3, 17, 40})
        k[(t * kv_heads + h) * dim + c] = 20.0f + k[(t * kv_heads + h) * dim + c];
    }
  }
  return k;
}

std::unique_ptr<PagedKvCache> Make(const KvShape& shape, const std::string& k_type,
                                   const std::string& v_type, int64_t max_tokens,
                                   const std::string& policy = "") {
  KvCacheOptions options;
  options.k_type = k_type;
  options.v_type = v_type;
  options.policy = policy;
  options.max_tokens = max_tokens;
  options.num_threads = 2;
  // The same block size for every cache a test compares (online softmax
  // steps block by block), room for four full sequences (forks).
  options.block_tokens = 32;
  auto layout = ComputeKvLayout(KvShape(shape), options);
  if (layout.ok())
    options.memory_bytes = layout->side_bytes + 4 * layout->SequenceBytes(max_tokens);
  auto cache = PagedKvCache::Create(shape, options);
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  return cache.ok() ? std::move(cache).value() : nullptr;
}

struct Layer {
  std::vector<float> k_pre, k, v;  // [tokens, kv_heads, dim]
};

// Appends tokens [from, to) of `data` to every layer of `seq`.
void AppendRange(PagedKvCache& cache, const KvShape& shape, SeqId seq,
                 const std::vector<Layer>& data, int64_t from, int64_t to) {
  const int64_t row = shape.num_kv_heads * shape.head_dim;
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    const Layer& d = data[static_cast<size_t>(l)];
    ASSERT_TRUE(cache
                    .Append(seq, l, to - from, d.k_pre.data() + from * row, d.k.data() + from * row,
                            d.v.data() + from * row)
                    .ok());
  }
}

std::vector<Layer> RandomLayers(const KvShape& shape, int64_t tokens, std::mt19937& rng) {
  std::vector<Layer> layers(static_cast<size_t>(shape.num_layers));
  for (Layer& l : layers) {
    l.k = KeysWithOutlierChannels(tokens, shape.num_kv_heads, shape.head_dim, rng);
    l.k_pre = l.k;
    l.v = Normal(l.k.size(), rng);
  }
  return layers;
}

TEST(KvStreaming, EncodedCountFollowsKivi) {
  KvStreaming keys;  // KIVI keys: group 32, residual 128 -> flush 128 at once
  keys.tile_tokens = 32;
  keys.flush_tokens = 128;
  KvStreaming values;  // KIVI values: keep exactly the newest 128
  values.keep_tokens = 128;
  for (int64_t length : {0, 1, 127, 128, 129, 255, 256, 1000}) {
    EXPECT_EQ(keys.EncodedAt(length), length / 128 * 128) << length;
    EXPECT_EQ(values.EncodedAt(length), std::max<int64_t>(0, length - 128)) << length;
  }
}

TEST(KvScheme, NamesExpandAndPoliciesParse) {
  auto kivi = ExpandKvScheme("kivi2");
  ASSERT_TRUE(kivi.ok());
  EXPECT_EQ(kivi->k_type, "int2-c32-asym-r128");
  EXPECT_EQ(kivi->v_type, "int2-g32-asym-r128");
  // A scheme name takes the sink options, given to both codecs.
  auto sinks = ExpandKvScheme("kivi2-a4");
  ASSERT_TRUE(sinks.ok());
  EXPECT_EQ(sinks->k_type, "int2-c32-asym-r128-a4");
  EXPECT_EQ(sinks->v_type, "int2-g32-asym-r128-a4");
  for (const char* name : {"kivi2-a4", "kivi2-s16", "hf-quanto-int4-a1"}) {
    auto types = ExpandKvScheme(name);
    ASSERT_TRUE(types.ok()) << name;
    EXPECT_TRUE(ParseKvCodec(types->k_type, 64).ok()) << name << ": " << types->k_type;
    EXPECT_TRUE(ParseKvCodec(types->v_type, 64).ok()) << name << ": " << types->v_type;
  }
  // Not a streaming option, or not a scheme: left to the codec parser, which refuses.
  for (const char* name : {"kivi2-x4", "kivi2-a", "kivi9-a4"}) {
    auto types = ExpandKvScheme(name);
    EXPECT_TRUE(!types.ok() || !ParseKvCodec(types->k_type, 64).ok()) << name;
  }
  auto pair = ExpandKvScheme("f16/kivi4");
  ASSERT_TRUE(pair.ok());
  EXPECT_EQ(pair->k_type, "f16");
  EXPECT_EQ(pair->v_type, "int4-g32-asym-r128");
  auto knobs = KiviTypes(4, 2, 64, 256);
  ASSERT_TRUE(knobs.ok());
  EXPECT_EQ(knobs->k_type, "int4-c64-asym-r256");
  EXPECT_EQ(knobs->v_type, "int2-g64-asym-r256");
  EXPECT_FALSE(KiviTypes(3, 2, 32, 128).ok());
  EXPECT_FALSE(KiviTypes(2, 2, 32, 100).ok());

  auto layers = ParseKvPolicy("*: kivi2 # all\n0, -1: f16; 1..2: int4/int8", 5, {"f16", "f16"});
  ASSERT_TRUE(layers.ok()) << layers.status().message();
  EXPECT_EQ((*layers)[0].k_type, "f16");
  EXPECT_EQ((*layers)[1].k_type, "int4");
  EXPECT_EQ((*layers)[2].v_type, "int8");
  EXPECT_EQ((*layers)[3].k_type, "int2-c32-asym-r128");
  EXPECT_EQ((*layers)[4].v_type, "f16");
  for (const char* bad : {"", "# only a comment", "*", "5: f16", "-6: f16", "3..1: f16", "x: f16",
                          "0: ", "0: a/b/c"}) {
    EXPECT_FALSE(ParseKvPolicy(bad, 5, {"f16", "f16"}).ok()) << bad;
  }
  for (const char* bad :
       {"int2-c48", "int2-c32-r48", "int4-r0", "int4-s0", "f16-g32", "int4-r12-r4"}) {
    EXPECT_FALSE(ParseKvCodec(bad, 64).ok()) << bad;
  }
  auto named = ParseKvCodec("int2-c32-r128", 64);
  ASSERT_TRUE(named.ok());
  EXPECT_EQ((*named)->Name(), "int2-c32-asym-r128");
  EXPECT_EQ((*named)->streaming().flush_tokens, 128);
  // 16 code bytes + 64 channels * (scale + min) * 2 bytes / 32 tokens.
  EXPECT_EQ((*named)->RowBytes(), 16u + 8u);
}

// KIVI with a residual at least the context never quantizes: exactly the f16
// cache (same f16 rows, same kernels, same order).
TEST(KvStreaming, KiviWithResidualBeyondContextEqualsF16) {
  std::mt19937 rng(7);
  const KvShape shape{2, 4, 2, 64};
  const auto data = RandomLayers(shape, 300, rng);
  auto kivi = Make(shape, "int2-c32-r320", "int2-g32-r320", 300);
  auto f16 = Make(shape, "f16", "f16", 300);
  ASSERT_TRUE(kivi && f16);
  for (auto* cache : {kivi.get(), f16.get()}) {
    ASSERT_TRUE(cache->AddSequence(0).ok());
    AppendRange(*cache, shape, 0, data, 0, 257);
  }
  const auto q = Normal(static_cast<size_t>(shape.num_heads * shape.head_dim), rng);
  for (int64_t step = 257; step < 300; step += 21) {
    for (auto* cache : {kivi.get(), f16.get()}) AppendRange(*cache, shape, 0, data, step, step + 1);
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      std::vector<float> a(q.size()), b(q.size());
      ASSERT_TRUE(kivi->Attend(0, l, 1, q.data(), 0.125f, a.data()).ok());
      ASSERT_TRUE(f16->Attend(0, l, 1, q.data(), 0.125f, b.data()).ok());
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "layer " << l << " i " << i;
    }
  }
}

// Token-by-token appends leave the same stored state, and the same attention,
// as one prefill (the rule depends on counts only; inputs go through f16 first).
TEST(KvStreaming, TokenByTokenEqualsPrefill) {
  std::mt19937 rng(11);
  const KvShape shape{1, 6, 2, 64};
  const int64_t tokens = 333;
  const auto data = RandomLayers(shape, tokens, rng);
  for (const char* scheme :
       {"kivi2", "kivi4", "int4-g32-r16-s2/int2-c64-sym-r64", "gear2", "gear4-g32-r128/gear4"}) {
    SCOPED_TRACE(scheme);
    auto types = ExpandKvScheme(scheme);
    ASSERT_TRUE(types.ok());
    auto once = Make(shape, types->k_type, types->v_type, tokens);
    auto stepwise = Make(shape, types->k_type, types->v_type, tokens);
    ASSERT_TRUE(once && stepwise);
    ASSERT_TRUE(once->AddSequence(0).ok());
    ASSERT_TRUE(stepwise->AddSequence(0).ok());
    AppendRange(*once, shape, 0, data, 0, tokens);
    for (int64_t t = 0; t < tokens; ++t) AppendRange(*stepwise, shape, 0, data, t, t + 1);
    const size_t size = static_cast<size_t>(tokens * shape.num_kv_heads * shape.head_dim);
    std::vector<float> k1(size), v1(size), k2(size), v2(size);
    ASSERT_TRUE(once->DecodeLayer(0, 0, k1.data(), v1.data()).ok());
    ASSERT_TRUE(stepwise->DecodeLayer(0, 0, k2.data(), v2.data()).ok());
    for (size_t i = 0; i < size; ++i) {
      ASSERT_EQ(k1[i], k2[i]) << "K value " << i;
      ASSERT_EQ(v1[i], v2[i]) << "V value " << i;
    }
    const auto q = Normal(static_cast<size_t>(shape.num_heads * shape.head_dim), rng);
    std::vector<float> a(q.size()), b(q.size());
    ASSERT_TRUE(once->Attend(0, 0, 1, q.data(), 0.125f, a.data()).ok());
    ASSERT_TRUE(stepwise->Attend(0, 0, 1, q.data(), 0.125f, b.data()).ok());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]);
  }
}

// Where each token lives: KIVI keeps the newest tokens exactly in f16, sinks
// keep the first ones, everything else is quantized; per-channel keys beat
// per-token keys on outlier channels.
TEST(KvStreaming, ResidualAndSinksHoldF16AndPerChannelKeysWin) {
  std::mt19937 rng(3);
  const KvShape shape{1, 2, 1, 64};
  const int64_t tokens = 300;
  const auto data = RandomLayers(shape, tokens, rng);
  auto kivi = Make(shape, "int2-c32-r128", "int2-g32-r128-s4", tokens);
  auto per_token = Make(shape, "int2-g32", "int2-g32", tokens);
  ASSERT_TRUE(kivi && per_token);
  for (auto* cache : {kivi.get(), per_token.get()}) {
    ASSERT_TRUE(cache->AddSequence(0).ok());
    AppendRange(*cache, shape, 0, data, 0, tokens);
  }
  const int64_t dim = shape.head_dim;
  std::vector<float> k(static_cast<size_t>(tokens * dim)), v(k.size()), kt(k.size()), vt(k.size());
  ASSERT_TRUE(kivi->DecodeLayer(0, 0, k.data(), v.data()).ok());
  ASSERT_TRUE(per_token->DecodeLayer(0, 0, kt.data(), vt.data()).ok());
  auto f16 = [](float x) { return F16ToF32(F32ToF16(x)); };
  // K: 300 = 2 * 128 encoded + 44 in the ring; V: the newest 128 and the first 4.
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < dim; ++c) {
      const size_t i = static_cast<size_t>(t * dim + c);
      if (t >= 256) {
        ASSERT_EQ(k[i], f16(data[0].k[i])) << "K ring token " << t;
      }
      if (t >= tokens - 128 || t < 4) {
        ASSERT_EQ(v[i], f16(data[0].v[i])) << "V f16 token " << t;
      }
    }
  }
  double channel_err = 0, token_err = 0;
  for (int64_t t = 0; t < 256; ++t) {
    for (int64_t c = 0; c < dim; ++c) {
      const size_t i = static_cast<size_t>(t * dim + c);
      channel_err += std::pow(k[i] - data[0].k[i], 2);
      token_err += std::pow(kt[i] - data[0].k[i], 2);
    }
  }
  // Per token, a group holding an outlier channel (~20) has a 2-bit step of
  // ~21/3 = 7 for its other N(0, 1) values; per channel the step is ~range of
  // N(0, 1) over 32 tokens / 3 ~ 1.5. Squared errors differ by ~20x; demand 4x.
  EXPECT_LT(channel_err * 4, token_err);
}

// Planner bytes == allocated bytes, including the staging charged per sequence.
TEST(KvStreaming, LayoutCountsStagingExactly) {
  const KvShape shape{3, 4, 2, 64};
  KvCacheOptions options;
  options.k_type = "kivi2";
  options.v_type = "kivi2";
  options.max_tokens = 512;
  options.memory_bytes = 4 << 20;
  auto layout = ComputeKvLayout(shape, options);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  EXPECT_EQ(layout->block_tokens, 32);  // 16 rounded up to the per-channel group
  // K ring holds 128 tokens, V ring 129 (128 kept + 1 waiting), f16 rows of 128 bytes.
  EXPECT_EQ(layout->staging_bytes, 3u * 2u * (128u + 129u) * 128u);
  auto cache = PagedKvCache::Create(shape, options);
  ASSERT_TRUE(cache.ok());
  std::mt19937 rng(1);
  const auto data = RandomLayers(shape, 300, rng);
  for (SeqId s : {0, 1}) {
    ASSERT_TRUE((*cache)->AddSequence(s).ok());
    AppendRange(**cache, shape, s, data, 0, 150 + 100 * s);
  }
  EXPECT_EQ((*cache)->BytesUsed(),
            layout->side_bytes + layout->SequenceBytes(150) + layout->SequenceBytes(250));
  ASSERT_TRUE((*cache)->Fork(1, 2).ok());
  EXPECT_EQ((*cache)->allocator().NumUsed(),
            static_cast<int64_t>((layout->SequenceBytes(150) + layout->SequenceBytes(250)) /
                                 layout->block_bytes) +
                layout->staging_blocks);
  for (SeqId s : {0, 1, 2}) (*cache)->ReleaseSequence(s);
  EXPECT_EQ((*cache)->allocator().NumUsed(), 0);
}

// A fork continues exactly like its source; truncating back into quantized
// tokens keeps them (decoded) and the cache keeps working.
TEST(KvStreaming, ForkAndTruncate) {
  std::mt19937 rng(5);
  const KvShape shape{2, 4, 2, 64};
  const auto data = RandomLayers(shape, 400, rng);
  auto cache = Make(shape, "kivi2", "kivi2", 400);
  ASSERT_TRUE(cache);
  ASSERT_TRUE(cache->AddSequence(0).ok());
  AppendRange(*cache, shape, 0, data, 0, 200);
  ASSERT_TRUE(cache->Fork(0, 1).ok());
  for (SeqId s : {0, 1}) AppendRange(*cache, shape, s, data, 200, 290);
  const size_t size = static_cast<size_t>(290 * shape.num_kv_heads * shape.head_dim);
  std::vector<float> k0(size), v0(size), k1(size), v1(size);
  for (int64_t l = 0; l < 2; ++l) {
    ASSERT_TRUE(cache->DecodeLayer(0, l, k0.data(), v0.data()).ok());
    ASSERT_TRUE(cache->DecodeLayer(1, l, k1.data(), v1.data()).ok());
    EXPECT_EQ(k0, k1);
    EXPECT_EQ(v0, v1);
  }
  // 290 -> 130: K had 256 encoded, now 128 encoded + 2 in the ring (tokens 128,
  // 129 decoded back); V had 162 encoded, now 2 encoded + 128 in the ring.
  ASSERT_TRUE(cache->Truncate(1, 130).ok());
  std::vector<float> kt(static_cast<size_t>(130 * shape.num_kv_heads * shape.head_dim)),
      vt(kt.size());
  ASSERT_TRUE(cache->DecodeLayer(1, 0, kt.data(), vt.data()).ok());
  ASSERT_TRUE(cache->DecodeLayer(0, 0, k0.data(), v0.data()).ok());
  for (size_t i = 0; i < kt.size(); ++i) {
    // Decoded values re-stored in f16: within f16 rounding (2^-11 relative).
    ASSERT_NEAR(kt[i], k0[i], std::fabs(k0[i]) * 0x1p-11 + 1e-7) << i;
    ASSERT_NEAR(vt[i], v0[i], std::fabs(v0[i]) * 0x1p-11 + 1e-7) << i;
  }
  AppendRange(*cache, shape, 1, data, 130, 400);
  EXPECT_EQ(cache->Length(1, 1), 400);
  cache->ReleaseSequence(0);
  cache->ReleaseSequence(1);
  EXPECT_EQ(cache->allocator().NumUsed(), 0);
}

// K stored before RoPE and rotated after decoding: at 16 bits this is the
// ordinary cache up to where the f16 rounding happens.
TEST(KvStreaming, PreRopeKeysMatchOrdinaryCache) {
  std::mt19937 rng(9);
  KvShape shape{1, 4, 2, 64};
  auto inv_freq = ops::RopeInvFreq(64, 10000.0f, ops::RopeScaling{});
  ASSERT_TRUE(inv_freq.ok());
  shape.rope_inv_freq = *inv_freq;
  const int64_t tokens = 200;
  std::vector<Layer> data = RandomLayers(shape, tokens, rng);
  std::vector<int32_t> positions(tokens);
  for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>(t);
  data[0].k = data[0].k_pre;
  ops::RopeRef(shape.rope_layout, inv_freq->data(), positions.data(), tokens, shape.num_kv_heads,
               64, data[0].k.data());
  auto pre = Make(shape, "f16-prerope", "f16", tokens);
  auto post = Make(shape, "f16", "f16", tokens);
  auto exact = Make(shape, "f32", "f32", tokens);
  ASSERT_TRUE(pre && post && exact);
  for (auto* cache : {pre.get(), post.get(), exact.get()}) {
    ASSERT_TRUE(cache->AddSequence(0).ok());
    AppendRange(*cache, shape, 0, data, 0, tokens);
  }
  const int64_t n = 50;
  const auto q = Normal(static_cast<size_t>(n * shape.num_heads * 64), rng);
  std::vector<float> a(q.size()), b(q.size()), c(q.size());
  ASSERT_TRUE(pre->Attend(0, 0, n, q.data(), 0.125f, a.data()).ok());
  ASSERT_TRUE(post->Attend(0, 0, n, q.data(), 0.125f, b.data()).ok());
  ASSERT_TRUE(exact->Attend(0, 0, n, q.data(), 0.125f, c.data()).ok());
  double pre_err = 0, post_err = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    pre_err += std::pow(a[i] - c[i], 2);
    post_err += std::pow(b[i] - c[i], 2);
    norm += std::pow(c[i], 2);
  }
  // Both round the same keys to f16 once (relative 2^-11) in a different
  // basis (RoPE is a rotation of channel pairs), so their errors against f32
  // have the same size, though not the same bits. NMSE ~ (2^-11)^2 * |score|^2
  // ~ 1e-6 here (outlier channels of 20 make scores ~4); 1e-5 bounds both,
  // and 4x between them allows for the different rounding draws.
  EXPECT_LT(pre_err / norm, 1e-5);
  EXPECT_LT(post_err / norm, 1e-5);
  EXPECT_LT(pre_err, 4 * post_err);
  EXPECT_GT(pre_err, 0.0);
  KvCacheOptions no_rope;
  no_rope.k_type = "f16-prerope";
  no_rope.max_tokens = 16;
  EXPECT_FALSE(PagedKvCache::Create(KvShape{1, 2, 1, 64}, no_rope).ok());
  no_rope.k_type = "f16";
  no_rope.v_type = "f16-prerope";
  EXPECT_FALSE(PagedKvCache::Create(shape, no_rope).ok());
}

TEST(KvPolicy, LayersGetTheirOwnCodecs) {
  std::mt19937 rng(13);
  const KvShape shape{3, 4, 2, 64};
  const auto data = RandomLayers(shape, 100, rng);
  auto cache = Make(shape, "f16", "f16", 100, "*: kivi2; 0, -1: f16");
  ASSERT_TRUE(cache);
  EXPECT_NE(std::string(cache->TypeName()).find("policy["), std::string::npos);
  ASSERT_TRUE(cache->AddSequence(0).ok());
  AppendRange(*cache, shape, 0, data, 0, 100);
  const KvLayout& layout = cache->layout();
  EXPECT_EQ(layout.layers[0].k_row_bytes, 128u);
  EXPECT_EQ(layout.layers[1].k_row_bytes, 24u);
  EXPECT_EQ(layout.layers[2].v_row_bytes, 128u);
  EXPECT_EQ(layout.block_bytes, layout.layers[2].offset + layout.LayerBytes(2));
  auto f16 = [](float x) { return F16ToF32(F32ToF16(x)); };
  const size_t size = static_cast<size_t>(100 * shape.num_kv_heads * shape.head_dim);
  std::vector<float> k(size), v(size);
  for (int64_t l : {0, 2}) {
    ASSERT_TRUE(cache->DecodeLayer(0, l, k.data(), v.data()).ok());
    for (size_t i = 0; i < size; ++i) ASSERT_EQ(k[i], f16(data[l].k[i]));
  }
  KvCacheOptions bad;
  bad.policy = "7: f16";  // the model has 3 layers
  bad.max_tokens = 100;
  EXPECT_FALSE(PagedKvCache::Create(shape, bad).ok());
}

}  // namespace
}  // namespace kvq
