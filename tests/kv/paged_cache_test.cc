#include "kv/paged_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "kv/attention_ref.h"
#include "kv/codec.h"
#include "kv/codec_int_scores.h"
#include "kv/hadamard.h"
#include "kv/kv_factory.h"
#include "kv/kv_test_util.h"
#include "kv/online_softmax.h"

namespace kvq {
namespace {

// Error bounds, all on NMSE of attention outputs with q, k, v ~ N(0, 1) and
// scale 1/sqrt(head_dim) (so scores ~ N(0, 1) and outputs are O(1)).
//
// Kernel vs AttentionRef on the codec's own Decode output: both see the same
// values, so only f32 arithmetic differs (dots of <= 128 terms, a running
// sum over <= 5000 tokens, exp): relative error per output of order
// sqrt(terms) * 2^-24 ~ 1e-6 at worst, NMSE ~ 1e-12. 1e-9 leaves a 1000x
// margin and still fails on a wrong token, head, mask or merge (NMSE >~ 1e-3).
constexpr double kKernelBound = 1e-9;
// f32 cache vs raw inputs: the same f32 arithmetic, nothing stored lossily;
// with rotation add two Hadamard transforms (log2(dim) <= 7 f32 butterfly
// stages each): still ~1e-12.
constexpr double kF32Bound = 1e-10;
// f16 cache vs raw inputs: each stored value carries a relative rounding
// error of at most 2^-11 (uniform: variance 2^-22 / 3 ~ 8e-8). V errors pass
// into the output with that NMSE or less (averaging over tokens shrinks it);
// K errors move each score by ~ 2^-11 / sqrt(3) * |score| and the softmax
// weights by the same relative amount: another ~1e-7. 1e-6 is a 5x margin.
constexpr double kF16Bound = 1e-6;

double RawBound(const std::string& codec) {
  if (codec == "f32") return kF32Bound;
  if (codec == "f16") return kF16Bound;
  return -1;  // lossy codecs: only the kernel-vs-decoded comparison applies
}

// Every codec the build knows: the ones ParseKvCodec rejects are skipped, so
// this test covers new codecs as soon as they are registered.
std::vector<std::string> AvailableCodecs() {
  std::vector<std::string> names;
  for (const char* name :
       {"f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "int2", "int4-g64-sym",
        "int8-g128", "int2-g32-sym",
        // streaming: per-channel tiles, residual rings, sinks
        "int2-c32-asym-r64", "int8-c64-sym", "fp8_e4m3-r32", "bf16-s3", "f16-r8-s1",
        // GEAR: base + low-rank residual + sparse outliers per tile
        "gear2", "gear4-c32-rank2-iter2-out0.5-s2", "tq3-nc", "tq2.5-qjl", "qjl",
        "tqv3"}) {  // TurboQuant, QJL
    if (ParseKvCodec(name, 64).ok()) names.push_back(name);
  }
  return names;
}

// What a sequence stored, per layer: [total, kv_heads, head_dim].
struct Stored {
  std::vector<std::vector<float>> k, v;
};

// The query an integer K codec actually attends with (codec_int_scores.h):
// each head's q quantized to int8 per group and dequantized, so the
// decoded-contents comparison below stays an f32-rounding comparison.
// q: [n * heads, dim], in place; other codecs leave q unchanged.
void QuantizeQueryLikeKCodec(const std::string& k_type, int64_t dim, std::vector<float>& q) {
  auto parsed = ParseKvCodec(k_type, dim);
  if (!parsed.ok()) return;
  const std::string name = (*parsed)->Name();
  // Per-token integer K codecs only (per-channel ones: AttentionLikeKCodec).
  if (name.rfind("int", 0) != 0 || name.find("-g") == std::string::npos) return;
  const int64_t group = std::stoll(name.substr(name.find("-g") + 2)), groups = dim / group;
  std::vector<int8_t> q8(static_cast<size_t>(dim));
  std::vector<float> qs(static_cast<size_t>(groups));
  std::vector<int32_t> qsum(static_cast<size_t>(groups));
  for (size_t at = 0; at < q.size(); at += static_cast<size_t>(dim)) {
    codec::QuantizeQueryRef(q.data() + at, dim, group, q8.data(), qs.data(), qsum.data());
    for (int64_t i = 0; i < dim; ++i) q[at + i] = qs[i / group] * q8[i];
  }
}

// Bits of a per-channel integer K codec (int2-c32-asym..., or GEAR over a
// per-channel base: gear2-c64-...), else 0.
int PerChannelIntBits(const std::string& k_type, int64_t dim) {
  auto parsed = ParseKvCodec(k_type, dim);
  if (!parsed.ok()) return 0;
  const std::string name = (*parsed)->Name();
  if (name.find("-c") == std::string::npos) return 0;
  if (name.rfind("int", 0) == 0) return name[3] - '0';
  if (name.rfind("gear", 0) == 0) return name[4] - '0';
  return 0;
}

// Per-channel integer K codecs fold each tile's channel scales into q and
// quantize q' = q s per 32 channels (codec_channel.cc), so their effective
// query changes per tile and one quantized q cannot replay it. For them the
// reference is assembled from the codec itself: encoded tokens are scored by
// the codec's Scores over the raw K re-encoded (Encode is deterministic and
// tiles start at token 0, as in the cache; per head, each score depends only
// on its own tile and query head; streaming codecs encode the f16-rounded
// input, paged_cache.cc), sinks and staged tokens by f32 dots with
// the decoded f16 rows; softmax and V as AttentionRef (AttentionRefScored). What remains is the
// fused kernel's own f32 arithmetic: kKernelBound applies. k_raw: the K the codec encoded; k, v:
// the cache's decoded K and V; all [total, kv_heads, head_dim]. Returns [n, heads, head_dim].
std::vector<float> AttentionLikeKCodec(const std::string& k_type, const float* q,
                                       const float* k_raw, const float* k, const float* v,
                                       int64_t n, int64_t total, const KvShape& shape,
                                       float scale) {
  const int64_t dim = shape.head_dim, heads = shape.num_heads, kv = shape.num_kv_heads;
  const int64_t group = heads / kv;
  auto codec = ParseKvCodec(k_type, dim);
  EXPECT_TRUE(codec.ok());
  const KvStreaming& st = (*codec)->streaming();
  const int64_t encoded = st.EncodedAt(total), sinks = st.sink_tokens;
  std::vector<std::vector<uint8_t>> rows(static_cast<size_t>(kv));  // per KV head
  for (int64_t g = 0; g < kv; ++g) {
    std::vector<float> x(static_cast<size_t>(encoded * dim));  // [encoded, dim]
    for (int64_t t = 0; t < encoded; ++t) {
      for (int64_t c = 0; c < dim; ++c) {  // streaming codecs encode f16-staged values
        x[t * dim + c] = F16ToF32(F32ToF16(k_raw[(t * kv + g) * dim + c]));
      }
    }
    rows[g].resize(static_cast<size_t>(encoded) * (*codec)->RowBytes());
    if (encoded > 0) (*codec)->Encode(x.data(), encoded, rows[g].data());
  }
  // The codec's scores of every (query row, head) over the encoded tokens.
  std::vector<float> codec_scores(static_cast<size_t>(n * heads * encoded));  // [n, heads, encoded]
  for (int64_t i = 0; i < n && encoded > 0; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      (*codec)->Scores(rows[h / group].data(), encoded, q + (i * heads + h) * dim, 1, scale,
                       &codec_scores[(i * heads + h) * encoded], encoded);
    }
  }
  auto score = [&](int64_t i, int64_t h, int64_t t) -> double {
    if (t >= sinks && t < encoded) return codec_scores[(i * heads + h) * encoded + t];
    const float* qh = q + (i * heads + h) * dim;
    const float* kt = k + (t * kv + h / group) * dim;
    double dot = 0;
    for (int64_t c = 0; c < dim; ++c) dot += static_cast<double>(qh[c]) * kt[c];
    return dot * scale;
  };
  std::vector<float> out(static_cast<size_t>(n * heads * dim));
  AttentionRefScored(score, v, n, total, heads, kv, dim, out.data());
  return out;
}

// Attends the last n tokens and checks the result against AttentionRef on
// (a) the cache's decoded contents (isolates the fused kernel; integer K
// codecs with their quantized query) and, for lossless-ish codecs, (b) the
// raw inputs.
void CheckAttend(const PagedKvCache& cache, const KvShape& shape, SeqId seq, int64_t layer,
                 int64_t n, const Stored& raw, bool rotate, double raw_bound, std::mt19937& rng,
                 const std::string& k_type = "f32") {
  const int64_t total = cache.Length(seq, layer);
  const int64_t row = shape.num_kv_heads * shape.head_dim;
  ASSERT_EQ(static_cast<int64_t>(raw.k[layer].size()), total * row);
  const auto q = Normal(static_cast<size_t>(n * shape.num_heads * shape.head_dim), rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  std::vector<float> out(q.size()), expected(q.size());
  ASSERT_TRUE(cache.Attend(seq, layer, n, q.data(), scale, out.data()).ok());
  if (!rotate) {  // decoded rows live in the rotated domain when rotating
    std::vector<float> k(static_cast<size_t>(total * row)), v(k.size());
    ASSERT_TRUE(cache.DecodeLayer(seq, layer, k.data(), v.data()).ok());
    std::vector<float> attended_q = q;
    QuantizeQueryLikeKCodec(k_type, shape.head_dim, attended_q);
    AttentionRef(attended_q.data(), k.data(), v.data(), n, total, shape.num_heads,
                 shape.num_kv_heads, shape.head_dim, scale, expected.data());
    if (PerChannelIntBits(k_type, shape.head_dim) != 0) {
      expected = AttentionLikeKCodec(k_type, q.data(), raw.k[layer].data(), k.data(), v.data(), n,
                                     total, shape, scale);
    }
    EXPECT_LE(Nmse(out, expected), kKernelBound)
        << "vs decoded: seq " << seq << " layer " << layer << " n " << n << " total " << total;
  }
  if (raw_bound > 0) {
    AttentionRef(q.data(), raw.k[layer].data(), raw.v[layer].data(), n, total, shape.num_heads,
                 shape.num_kv_heads, shape.head_dim, scale, expected.data());
    EXPECT_LE(Nmse(out, expected), raw_bound)
        << "vs raw: seq " << seq << " layer " << layer << " n " << n << " total " << total;
  }
}

// Appends n random tokens to every layer of `seq` (as a forward pass does,
// layer by layer) and records them.
Status AppendRandom(PagedKvCache& cache, const KvShape& shape, SeqId seq, int64_t n, Stored& raw,
                    std::mt19937& rng) {
  const size_t count = static_cast<size_t>(n * shape.num_kv_heads * shape.head_dim);
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    const auto k = Normal(count, rng), v = Normal(count, rng);
    KVQ_RETURN_IF_ERROR(cache.Append(seq, l, n, k.data(), k.data(), v.data()));
    raw.k[l].insert(raw.k[l].end(), k.begin(), k.end());
    raw.v[l].insert(raw.v[l].end(), v.begin(), v.end());
  }
  return Status::Ok();
}

Stored EmptyStored(const KvShape& shape) {
  Stored s;
  s.k.resize(static_cast<size_t>(shape.num_layers));
  s.v.resize(static_cast<size_t>(shape.num_layers));
  return s;
}

std::unique_ptr<PagedKvCache> MakeCache(const KvShape& shape, KvCacheOptions options) {
  auto cache = PagedKvCache::Create(shape, options);
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  return cache.ok() ? std::move(cache).value() : nullptr;
}

struct ShapeCase {
  int64_t heads, kv_heads, head_dim, block_tokens;
  int threads;
};

// Several sequences at once, prefill chunks and single-token decode steps
// interleaved, over head_dim 64/128, GQA ratios 1/2/4/7/8, odd block sizes
// and thread counts that force split-K (8 threads on 1-2 KV heads).
TEST(PagedKvCache, FusedAttentionMatchesReferenceForEveryCodec) {
  const std::vector<ShapeCase> shapes = {
      {2, 2, 64, 16, 2},  {4, 2, 64, 16, 8},  {8, 2, 128, 16, 2}, {14, 2, 64, 16, 8},
      {7, 1, 128, 7, 8},  {8, 1, 64, 32, 1},  {16, 2, 128, 5, 2}, {3, 3, 128, 16, 8},
      {28, 4, 64, 16, 2}, {16, 2, 64, 13, 3},
  };
  uint32_t seed = 1;
  const std::vector<std::string> codecs = AvailableCodecs();
  for (size_t ci = 0; ci < codecs.size(); ++ci) {
    const std::string& codec = codecs[ci];
    for (size_t si = 0; si < shapes.size(); ++si) {
      // f32 and f16 run every shape; lossy codecs (whose own tests cover
      // their kernels per group size) alternate halves, so every shape still
      // meets several lossy codecs while the test stays under a minute.
      if (RawBound(codec) < 0 && (si + ci) % 2 != 0) continue;
      const ShapeCase& c = shapes[si];
      SCOPED_TRACE(testing::Message()
                   << codec << " heads " << c.heads << " kv " << c.kv_heads << " dim " << c.head_dim
                   << " block " << c.block_tokens << " threads " << c.threads);
      std::mt19937 rng(seed++);
      const KvShape shape{2, c.heads, c.kv_heads, c.head_dim};
      KvCacheOptions options;
      options.k_type = options.v_type = codec;
      options.block_tokens = c.block_tokens;
      options.max_tokens = 1000;
      options.memory_bytes = 0;
      options.num_threads = c.threads;
      // Room for three sequences of up to ~400 tokens.
      auto layout = ComputeKvLayout(shape, options);
      ASSERT_TRUE(layout.ok());
      options.memory_bytes =
          layout->side_bytes +
          layout->block_bytes * 3 * (400 / layout->block_tokens + 2 + layout->staging_blocks);
      auto cache = MakeCache(shape, options);
      ASSERT_NE(cache, nullptr);
      std::map<SeqId, Stored> raw;
      for (SeqId s : {3, 7, 11}) {
        ASSERT_TRUE(cache->AddSequence(s).ok());
        raw[s] = EmptyStored(shape);
      }
      for (int step = 0; step < 12; ++step) {
        for (auto& [seq, stored] : raw) {
          // Prefill chunks early, then mostly decode steps, with an odd
          // chunk now and then (lengths never land on block boundaries by design).
          const int64_t n = step < 2 ? 1 + static_cast<int64_t>(rng() % 130)
                                     : (rng() % 4 == 0 ? 1 + static_cast<int64_t>(rng() % 20) : 1);
          ASSERT_TRUE(AppendRandom(*cache, shape, seq, n, stored, rng).ok());
          for (int64_t l = 0; l < shape.num_layers; ++l) {
            CheckAttend(*cache, shape, seq, l, n, stored, false, RawBound(codec), rng, codec);
          }
        }
      }
      EXPECT_EQ(cache->BytesUsed(), cache->allocator().NumUsed() * cache->layout().block_bytes +
                                        cache->layout().side_bytes);
      for (auto& [seq, stored] : raw) cache->ReleaseSequence(seq);
      EXPECT_EQ(cache->allocator().NumUsed(), 0);
    }
  }
}

// Long contexts (up to 5000 tokens, never a multiple of the block size),
// checked with decode steps and a short prefill chunk at the end; 8 threads
// over one KV head exercises the split-K merge over many blocks.
TEST(PagedKvCache, LongContextsWithSplitK) {
  std::mt19937 rng(99);
  for (const ShapeCase& c :
       {ShapeCase{8, 1, 128, 16, 8}, ShapeCase{14, 2, 64, 16, 2}, ShapeCase{4, 4, 64, 32, 8}}) {
    for (int64_t length : {1, 17, 999, 4093, 4999}) {
      SCOPED_TRACE(testing::Message() << "heads " << c.heads << " length " << length);
      const KvShape shape{1, c.heads, c.kv_heads, c.head_dim};
      KvCacheOptions options;
      options.k_type = options.v_type = "f16";
      options.block_tokens = c.block_tokens;
      options.max_tokens = 5100;
      options.num_threads = c.threads;
      auto cache = MakeCache(shape, options);
      ASSERT_NE(cache, nullptr);
      ASSERT_TRUE(cache->AddSequence(0).ok());
      Stored raw = EmptyStored(shape);
      ASSERT_TRUE(AppendRandom(*cache, shape, 0, length, raw, rng).ok());
      CheckAttend(*cache, shape, 0, 0, 1, raw, false, kF16Bound, rng);  // last token as a query
      ASSERT_TRUE(AppendRandom(*cache, shape, 0, 1, raw, rng).ok());
      CheckAttend(*cache, shape, 0, 0, 1, raw, false, kF16Bound, rng);
      ASSERT_TRUE(AppendRandom(*cache, shape, 0, 19, raw, rng).ok());
      CheckAttend(*cache, shape, 0, 0, 19, raw, false, kF16Bound, rng);
    }
  }
}

TEST(PagedKvCache, RotationLeavesF32AttentionUnchanged) {
  std::mt19937 rng(5);
  for (const ShapeCase& c : {ShapeCase{8, 2, 64, 16, 2}, ShapeCase{7, 1, 128, 16, 8}}) {
    const KvShape shape{2, c.heads, c.kv_heads, c.head_dim};
    KvCacheOptions options;
    options.k_type = options.v_type = "f32";
    options.rotate = true;
    options.max_tokens = 512;
    options.num_threads = c.threads;
    auto cache = MakeCache(shape, options);
    ASSERT_NE(cache, nullptr);
    EXPECT_NE(std::string(cache->TypeName()).find("rot"), std::string::npos);
    ASSERT_TRUE(cache->AddSequence(0).ok());
    Stored raw = EmptyStored(shape);
    for (int64_t n : {37, 1, 1, 300, 1}) {
      ASSERT_TRUE(AppendRandom(*cache, shape, 0, n, raw, rng).ok());
      for (int64_t l = 0; l < 2; ++l)
        CheckAttend(*cache, shape, 0, l, n, raw, true, kF32Bound, rng);
    }
    // The stored rows really are rotated (not silently skipped).
    std::vector<float> k(raw.k[0].size()), v(k.size());
    ASSERT_TRUE(cache->DecodeLayer(0, 0, k.data(), v.data()).ok());
    EXPECT_GT(Nmse(k, raw.k[0]), 0.1);
  }
  KvCacheOptions bad;
  bad.rotate = true;
  bad.max_tokens = 16;
  EXPECT_FALSE(PagedKvCache::Create(KvShape{1, 2, 1, 48}, bad).ok());  // 48: not a power of 2
}

// With a lossy codec the rotated cache must equal, up to f32 rounding,
// H^T AttentionRef(Hq, decoded rotated K, decoded rotated V): the kernel's own
// error isolated from the codec's, as in the unrotated test.
TEST(PagedKvCache, RotatedLossyCodecsMatchReferenceInTheRotatedDomain) {
  std::mt19937 rng(13);
  for (const std::string& codec : AvailableCodecs()) {
    SCOPED_TRACE(codec);
    const KvShape shape{1, 8, 2, 64};
    KvCacheOptions options;
    options.k_type = options.v_type = codec;
    options.rotate = true;
    options.max_tokens = 256;
    options.num_threads = 8;
    auto cache = MakeCache(shape, options);
    ASSERT_NE(cache, nullptr);
    ASSERT_TRUE(cache->AddSequence(0).ok());
    Stored raw = EmptyStored(shape);
    for (int64_t n : {45, 1, 20}) {
      ASSERT_TRUE(AppendRandom(*cache, shape, 0, n, raw, rng).ok());
      const int64_t total = cache->Length(0, 0);
      auto q = Normal(static_cast<size_t>(n * 8 * 64), rng);
      std::vector<float> out(q.size()), expected(q.size());
      const float scale = 0.125f;
      ASSERT_TRUE(cache->Attend(0, 0, n, q.data(), scale, out.data()).ok());
      std::vector<float> k(static_cast<size_t>(total * 2 * 64)), v(k.size());
      ASSERT_TRUE(cache->DecodeLayer(0, 0, k.data(), v.data()).ok());
      ASSERT_TRUE(HadamardRotate(q.data(), n * 8, 64).ok());
      QuantizeQueryLikeKCodec(codec, 64, q);  // integer K codecs quantize the rotated q
      AttentionRef(q.data(), k.data(), v.data(), n, total, 8, 2, 64, scale, expected.data());
      ASSERT_TRUE(HadamardUnrotate(expected.data(), n * 8, 64).ok());
      if (PerChannelIntBits(codec, 64) != 0) {
        std::vector<float> k_raw_rotated = raw.k[0];  // the codec saw rotated K
        ASSERT_TRUE(HadamardRotate(k_raw_rotated.data(), total * 2, 64).ok());
        expected = AttentionLikeKCodec(codec, q.data(), k_raw_rotated.data(), k.data(), v.data(), n,
                                       total, shape, scale);
        ASSERT_TRUE(HadamardUnrotate(expected.data(), n * 8, 64).ok());
      }
      EXPECT_LE(Nmse(out, expected), kKernelBound) << "n " << n;
    }
  }
}

TEST(KvMemory, ParsesBytesSuffixesAndFractions) {
  const size_t ram = size_t{16} << 30;
  EXPECT_EQ(*ParseKvMemory("123456", ram), 123456u);
  EXPECT_EQ(*ParseKvMemory("512M", ram), size_t{512} << 20);
  EXPECT_EQ(*ParseKvMemory("8G", ram), size_t{8} << 30);
  EXPECT_EQ(*ParseKvMemory("8GiB", ram), size_t{8} << 30);
  EXPECT_EQ(*ParseKvMemory("8GB", ram), size_t{8000000000});
  EXPECT_EQ(*ParseKvMemory("1.5K", ram), 1536u);
  EXPECT_EQ(*ParseKvMemory("0.5", ram), ram / 2);
  EXPECT_EQ(*ParseKvMemory("1.0", ram), ram);
  for (const char* bad : {"", "G", "12X", "1.2.3", "-5", "1.5", "0.0", "0", "8 G"}) {
    EXPECT_FALSE(ParseKvMemory(bad, ram).ok()) << bad;
  }
  EXPECT_FALSE(ParseKvMemory("0.5", 0).ok());  // RAM unknown
}

// Fork shares blocks by reference count; the first write into the shared,
// partially filled last block copies it; full prefix blocks stay shared.
TEST(PagedKvCache, ForkSharesPrefixAndCopiesOnWrite) {
  std::mt19937 rng(7);
  const KvShape shape{2, 4, 2, 64};
  KvCacheOptions options;
  options.k_type = options.v_type = "f16";
  options.max_tokens = 200;
  options.memory_bytes = 0;
  auto layout = ComputeKvLayout(shape, options);
  ASSERT_TRUE(layout.ok());
  options.memory_bytes = layout->block_bytes * 12;
  auto cache = MakeCache(shape, options);
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(cache->AddSequence(1).ok());
  Stored a = EmptyStored(shape);
  ASSERT_TRUE(AppendRandom(*cache, shape, 1, 37, a, rng).ok());  // 2 full blocks + 5 tokens
  EXPECT_EQ(cache->allocator().NumUsed(), 3);
  ASSERT_TRUE(cache->Fork(1, 2).ok());
  EXPECT_FALSE(cache->Fork(1, 2).ok());   // dst exists
  EXPECT_FALSE(cache->Fork(42, 5).ok());  // unknown src
  EXPECT_EQ(cache->BlockTable(1), cache->BlockTable(2));
  EXPECT_EQ(cache->allocator().NumUsed(), 3);  // a fork costs no blocks
  for (BlockId b : cache->BlockTable(2)) EXPECT_EQ(cache->allocator().RefCount(b), 2);
  Stored b = a;
  for (int64_t l = 0; l < 2; ++l) CheckAttend(*cache, shape, 2, l, 3, b, false, kF16Bound, rng);

  ASSERT_TRUE(AppendRandom(*cache, shape, 2, 4, b, rng).ok());  // diverge: copies block 2
  const auto table_a = cache->BlockTable(1), table_b = cache->BlockTable(2);
  EXPECT_EQ(table_a[0], table_b[0]);
  EXPECT_EQ(table_a[1], table_b[1]);
  EXPECT_NE(table_a[2], table_b[2]);
  EXPECT_EQ(cache->allocator().RefCount(table_a[2]), 1);
  EXPECT_EQ(cache->allocator().NumUsed(), 4);
  ASSERT_TRUE(AppendRandom(*cache, shape, 1, 30, a, rng).ok());  // a writes in place, then grows
  for (int64_t l = 0; l < 2; ++l) {
    CheckAttend(*cache, shape, 1, l, 30, a, false, kF16Bound, rng);
    CheckAttend(*cache, shape, 2, l, 4, b, false, kF16Bound, rng);
  }
  // Fork of a fork, then release in an arbitrary order: the allocator ends empty.
  ASSERT_TRUE(cache->Fork(2, 3).ok());
  EXPECT_EQ(cache->allocator().RefCount(table_a[0]), 3);
  cache->ReleaseSequence(2);
  EXPECT_EQ(cache->allocator().RefCount(table_a[0]), 2);
  EXPECT_TRUE(cache->allocator().CheckInvariants().ok());
  cache->ReleaseSequence(1);
  cache->ReleaseSequence(3);
  cache->ReleaseSequence(3);  // unknown ids are ignored
  EXPECT_EQ(cache->allocator().NumUsed(), 0);
  EXPECT_EQ(cache->BytesUsed(), cache->layout().side_bytes);
}

TEST(PagedKvCache, TruncateFreesBlocksAndAppendsContinue) {
  std::mt19937 rng(11);
  const KvShape shape{2, 8, 2, 64};
  KvCacheOptions options;
  options.k_type = options.v_type = "f32";
  options.max_tokens = 300;
  auto cache = MakeCache(shape, options);
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(cache->AddSequence(0).ok());
  Stored raw = EmptyStored(shape);
  ASSERT_TRUE(AppendRandom(*cache, shape, 0, 70, raw, rng).ok());
  EXPECT_EQ(cache->allocator().NumUsed(), 5);
  EXPECT_FALSE(cache->Truncate(0, 71).ok());
  EXPECT_FALSE(cache->Truncate(0, -1).ok());
  EXPECT_FALSE(cache->Truncate(9, 0).ok());
  ASSERT_TRUE(cache->Fork(0, 1).ok());
  ASSERT_TRUE(cache->Truncate(0, 20).ok());  // inside block 1, which seq 1 still shares
  EXPECT_EQ(cache->Length(0, 0), 20);
  EXPECT_EQ(cache->BlockTable(0).size(), 2u);
  EXPECT_EQ(cache->allocator().NumUsed(), 5);  // seq 1 holds them all
  for (int64_t l = 0; l < 2; ++l) {
    raw.k[l].resize(20 * 2 * 64);
    raw.v[l].resize(20 * 2 * 64);
  }
  ASSERT_TRUE(AppendRandom(*cache, shape, 0, 9, raw, rng).ok());  // copies shared block 1
  EXPECT_NE(cache->BlockTable(0)[1], cache->BlockTable(1)[1]);
  for (int64_t l = 0; l < 2; ++l) CheckAttend(*cache, shape, 0, l, 9, raw, false, kF32Bound, rng);
  ASSERT_TRUE(cache->Truncate(0, 0).ok());
  EXPECT_TRUE(cache->BlockTable(0).empty());
  cache->ReleaseSequence(1);
  EXPECT_EQ(cache->allocator().NumUsed(), 0);
}

TEST(PagedKvCache, ClearErrorsWhenMemoryOrContextRunsOut) {
  std::mt19937 rng(3);
  const KvShape shape{1, 2, 1, 64};
  KvCacheOptions options;
  options.k_type = options.v_type = "f16";
  options.max_tokens = 100;
  auto layout = ComputeKvLayout(shape, options);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->num_blocks, 7);  // ceil(100 / 16): one sequence of max_tokens
  options.memory_bytes = layout->block_bytes * 4 + 10;  // 4 blocks, 10 bytes to spare
  auto cache = MakeCache(shape, options);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->Usage().blocks_total, 4);
  ASSERT_TRUE(cache->AddSequence(0).ok());
  ASSERT_TRUE(cache->AddSequence(1).ok());
  EXPECT_EQ(cache->Capacity(0), 64);
  Stored raw = EmptyStored(shape);
  ASSERT_TRUE(AppendRandom(*cache, shape, 0, 40, raw, rng).ok());  // 3 blocks
  EXPECT_EQ(cache->Capacity(0), 24);
  EXPECT_EQ(cache->Capacity(1), 16);
  Stored other = EmptyStored(shape);
  Status full = AppendRandom(*cache, shape, 1, 17, other, rng);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.message().find("out of memory"), std::string::npos) << full.message();
  EXPECT_EQ(cache->Length(1, 0), 0);  // a failed append changes nothing
  EXPECT_EQ(cache->allocator().NumUsed(), 3);
  // A shared partial block needs a copy before the first write: the fork can
  // grow only while a free block remains for that copy.
  ASSERT_TRUE(cache->Fork(0, 2).ok());
  EXPECT_EQ(cache->Capacity(2), 8);
  ASSERT_TRUE(AppendRandom(*cache, shape, 1, 1, other, rng).ok());  // takes the last block
  EXPECT_EQ(cache->Capacity(2), 0);
  EXPECT_EQ(cache->Capacity(0), 0);
  EXPECT_FALSE(cache->Append(2, 0, 1, raw.k[0].data(), raw.k[0].data(), raw.v[0].data()).ok());
  cache->ReleaseSequence(1);
  EXPECT_EQ(cache->Capacity(2), 8 + 0 * 16);  // the freed block goes to the copy
  ASSERT_TRUE(AppendRandom(*cache, shape, 2, 8, raw, rng).ok());

  options.memory_bytes = 0;
  options.max_tokens = 20;
  auto small = MakeCache(shape, options);
  ASSERT_NE(small, nullptr);
  ASSERT_TRUE(small->AddSequence(0).ok());
  Stored s = EmptyStored(shape);
  Status over = AppendRandom(*small, shape, 0, 21, s, rng);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.message().find("limit of 20 tokens"), std::string::npos) << over.message();
  EXPECT_FALSE(small->AddSequence(0).ok());
  EXPECT_FALSE(small->Append(5, 0, 1, s.k[0].data(), s.k[0].data(), s.v[0].data()).ok());
  options.memory_bytes = 100;  // less than one block
  EXPECT_FALSE(PagedKvCache::Create(shape, options).ok());
  options.k_type = "int3";
  EXPECT_FALSE(PagedKvCache::Create(shape, options).ok());
}

TEST(PagedKvCache, LayoutMatchesAllocationAndAccounting) {
  const KvShape shape{3, 6, 2, 64};
  KvCacheOptions options;
  options.k_type = "f32";
  options.v_type = "f16";
  options.max_tokens = 64;
  auto layout = ComputeKvLayout(shape, options);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->k_row_bytes, 256u);
  EXPECT_EQ(layout->v_row_bytes, 128u);
  EXPECT_EQ(layout->block_bytes, 3u * 2u * 16u * (256u + 128u));
  EXPECT_EQ(layout->VTileOffset(1, 1), layout->LayerBytes(0) + 2 * 16 * 256 + 16 * 128);
  auto cache = MakeCache(shape, options);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(std::string(cache->TypeName()), "k:f32/v:f16");
  const KvUsage empty = cache->Usage();
  EXPECT_EQ(empty.blocks_total, 4);
  EXPECT_EQ(empty.bytes_reserved, 4 * layout->block_bytes + layout->side_bytes);
  ASSERT_TRUE(cache->AddSequence(0).ok());
  std::mt19937 rng(1);
  Stored raw = EmptyStored(shape);
  ASSERT_TRUE(AppendRandom(*cache, shape, 0, 17, raw, rng).ok());
  const KvUsage usage = cache->Usage();
  EXPECT_EQ(usage.blocks_used, 2);
  EXPECT_EQ(usage.bytes_used, 2 * layout->block_bytes + layout->side_bytes);
  EXPECT_EQ(cache->BytesUsed(), usage.bytes_used);
  EXPECT_EQ(usage.sequences, 1);

  // fp8 keeps one f32 scale per (layer, K/V, KV head) outside the blocks.
  options.k_type = options.v_type = "fp8_e4m3";
  auto fp8_layout = ComputeKvLayout(shape, options);
  ASSERT_TRUE(fp8_layout.ok());
  EXPECT_EQ(fp8_layout->side_bytes, 3u * 2u * (4u + 4u));
  auto fp8 = MakeCache(shape, options);
  ASSERT_NE(fp8, nullptr);
  EXPECT_EQ(fp8->BytesUsed(), fp8_layout->side_bytes);
  ASSERT_TRUE(fp8->AddSequence(0).ok());
  ASSERT_TRUE(AppendRandom(*fp8, shape, 0, 33, raw, rng).ok());
  EXPECT_EQ(fp8->BytesUsed(), 3 * fp8_layout->block_bytes + fp8_layout->side_bytes);
}

// Random AddSequence / Fork / Append / Truncate / Release sequences: after
// every step each block's reference count equals the number of block tables
// that hold it (no sharing without a count, nothing leaked), and releasing
// every sequence returns the allocator to empty.
TEST(PagedKvCache, RandomSequenceOperationsKeepReferenceCountsExact) {
  const KvShape shape{2, 2, 1, 64};
  for (uint32_t seed = 1; seed <= 10; ++seed) {
    std::mt19937 rng(seed);
    KvCacheOptions options;
    options.k_type = options.v_type = "f16";
    options.block_tokens = 4;
    options.max_tokens = 64;
    auto layout = ComputeKvLayout(shape, options);
    ASSERT_TRUE(layout.ok());
    options.memory_bytes = layout->block_bytes * (10 + rng() % 30);
    auto cache = MakeCache(shape, options);
    ASSERT_NE(cache, nullptr);
    std::map<SeqId, Stored> live;
    for (int step = 0; step < 400; ++step) {
      const SeqId id = static_cast<SeqId>(rng() % 8);
      const bool exists = live.count(id) != 0;
      switch (rng() % 6) {
        case 0:
          if (!exists) {
            ASSERT_TRUE(cache->AddSequence(id).ok());
            live[id] = EmptyStored(shape);
          }
          break;
        case 1: {
          const SeqId dst = static_cast<SeqId>(rng() % 8);
          if (exists && live.count(dst) == 0) {
            ASSERT_TRUE(cache->Fork(id, dst).ok());
            live[dst] = live[id];
          }
          break;
        }
        case 2:
        case 3:
          if (exists) {
            const int64_t n = 1 + static_cast<int64_t>(rng() % 9);
            Stored copy = live[id];
            const bool fits = n <= cache->Capacity(id);
            Status s = AppendRandom(*cache, shape, id, n, copy, rng);
            ASSERT_EQ(s.ok(), fits) << s.message();  // Capacity predicts Append exactly
            if (s.ok()) live[id] = copy;
          }
          break;
        case 4:
          if (exists) {
            const int64_t length = cache->Length(id, 0);
            const int64_t keep = length == 0 ? 0 : static_cast<int64_t>(rng() % (length + 1));
            ASSERT_TRUE(cache->Truncate(id, keep).ok());
            for (auto* rows : {&live[id].k, &live[id].v}) {
              for (auto& r : *rows) r.resize(static_cast<size_t>(keep * 64));
            }
          }
          break;
        case 5:
          cache->ReleaseSequence(id);
          live.erase(id);
          break;
      }
      const BlockAllocator& alloc = cache->allocator();
      ASSERT_TRUE(alloc.CheckInvariants().ok());
      std::map<BlockId, int32_t> holders;
      for (const auto& [seq, stored] : live) {
        for (BlockId b : cache->BlockTable(seq)) ++holders[b];
      }
      ASSERT_EQ(alloc.NumUsed(), static_cast<int64_t>(holders.size()));
      for (const auto& [b, count] : holders) ASSERT_EQ(alloc.RefCount(b), count);
    }
    // Contents survived all the copy-on-write traffic.
    std::mt19937 qrng(seed);
    for (const auto& [seq, stored] : live) {
      if (cache->Length(seq, 0) > 0)
        CheckAttend(*cache, shape, seq, 1, 1, stored, false, kF16Bound, qrng);
    }
    for (const auto& [seq, stored] : live) cache->ReleaseSequence(seq);
    EXPECT_EQ(cache->allocator().NumUsed(), 0);
    EXPECT_EQ(cache->allocator().NumFree(), cache->allocator().NumBlocks());
  }
}

TEST(OnlineSoftmax, SimdMatchesReferenceAndPlainSoftmax) {
  std::mt19937 rng(17);
  for (int64_t dim : {1, 7, 64, 128}) {
    for (int64_t count : {1, 3, 16, 17, 40}) {
      std::vector<float> scores = Normal(static_cast<size_t>(count * 5), rng);
      for (float& s : scores) s *= 4.0f;
      const auto v = Normal(static_cast<size_t>(count * 5 * dim), rng);
      float m = -INFINITY, l = 0, m_ref = -INFINITY, l_ref = 0;
      std::vector<float> acc(dim, 0.0f), acc_ref(dim, 0.0f);
      for (int64_t b = 0; b < 5; ++b) {  // five blocks of `count` scores
        std::vector<float> p(scores.begin() + b * count, scores.begin() + (b + 1) * count);
        std::vector<float> p_ref = p;
        OnlineSoftmaxStep(p.data(), count, &m, &l, acc.data(), dim);
        OnlineSoftmaxStepRef(p_ref.data(), count, &m_ref, &l_ref, acc_ref.data(), dim);
        for (int64_t t = 0; t < count; ++t) {
          // Highway's exp is within a few ulp of libm's: 1e-6 relative.
          ASSERT_NEAR(p[t], p_ref[t], 1e-6f * std::max(1.0f, p_ref[t]));
          for (int64_t d = 0; d < dim; ++d) {
            acc[d] += p[t] * v[(b * count + t) * dim + d];
            acc_ref[d] += p_ref[t] * v[(b * count + t) * dim + d];
          }
        }
      }
      EXPECT_EQ(m, m_ref);
      EXPECT_NEAR(l, l_ref, 1e-5f * l_ref);
      // Against a plain two-pass softmax in double.
      double max = -INFINITY, sum = 0;
      for (float s : scores) max = std::max<double>(max, s);
      for (float s : scores) sum += std::exp(s - max);
      for (int64_t d = 0; d < dim; ++d) {
        double expected = 0;
        for (int64_t t = 0; t < count * 5; ++t)
          expected += std::exp(scores[t] - max) / sum * v[t * dim + d];
        // Sums of <= 200 f32 terms of magnitude <= ~4: 1e-5 absolute.
        EXPECT_NEAR(acc[d] / l, expected, 1e-5) << "dim " << dim << " count " << count;
      }
    }
  }
}

}  // namespace
}  // namespace kvq
