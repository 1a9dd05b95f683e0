// llama.cpp's cache types in the paged cache: its rotation rule (which
// types, head sizes, K and V), what the cache stores (exactly the codec's
// encoding of the rotated rows), and attention over the rotated storage
// against AttentionRef in llama.cpp's domain. The codec kernels themselves
// are covered by codec_test.cc (every registered name, every target) and
// the bytes by tests/conformance/llamacpp_kv_types_test.cc (against ggml).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kv/attention_ref.h"
#include "kv/codec.h"
#include "kv/hadamard.h"
#include "kv/kv_factory.h"
#include "kv/kv_test_util.h"
#include "kv/paged_cache.h"

namespace kvq {
namespace {

int64_t Block(const std::string& name, int64_t dim, bool is_v) {
  auto codec = ParseKvCodec(name, dim);
  EXPECT_TRUE(codec.ok()) << name << ": " << codec.status().message();
  return codec.ok() ? (*codec)->RotationBlock(is_v) : -1;
}

// llama-kv-cache.cpp: K rotated when its type is quantized and head_dim % 64
// == 0, by the largest power of two dividing head_dim; V by 64.
TEST(GgmlCache, RotationRuleIsLlamaCpps) {
  for (const char* type : {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"}) {
    SCOPED_TRACE(type);
    const std::pair<int64_t, int64_t> expected[] = {{32, 0},   {64, 64},   {96, 0},  {128, 128},
                                                    {192, 64}, {256, 256}, {320, 64}};
    for (const auto& [dim, k_block] : expected) {
      EXPECT_EQ(Block(type, dim, false), k_block) << dim;
      EXPECT_EQ(Block(type, dim, true), k_block > 0 ? 64 : 0) << dim;
      EXPECT_EQ(Block(std::string(type) + "-norot", dim, false), 0) << dim;
      EXPECT_EQ(Block(std::string(type) + "-norot", dim, true), 0) << dim;
    }
  }
  // kvq's own codecs never rotate by themselves (--kv-rotate does that).
  for (const char* type : {"f16", "f32", "int4-g32-sym", "fp8", "int2-c32-asym"}) {
    EXPECT_EQ(Block(type, 128, false), 0) << type;
    EXPECT_EQ(Block(type, 128, true), 0) << type;
  }
}

struct Case {
  std::string k_type, v_type;
  int64_t dim;
  bool kvq_rotate;
};

// Stored K == Encode(G_k k) and V == Encode(G_v v) exactly (DecodeLayer
// decodes what the cache holds), and Attend == G_v AttentionRef(G_k q, K, V)
// up to the fused kernels' f32 arithmetic (the 1e-9 NMSE of
// paged_cache_test.cc's kKernelBound: f32 dots and sums over <= 300 tokens).
// With --kv-rotate, kvq's R comes first on the way in and last on the way out.
TEST(GgmlCache, StoresTheRotatedRowsAndAttendsInLlamaCppsDomain) {
  const Case cases[] = {{"q4_0", "q4_0", 64, false},   {"q8_0", "q5_1", 128, false},
                        {"iq4_nl", "f16", 128, false}, {"f16", "q4_1", 128, false},
                        {"q5_0", "q5_0", 96, false},   {"q4_0-norot", "q4_0", 64, false},
                        {"q4_0", "q4_0", 64, true}};
  std::mt19937 rng(77);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.k_type + "/" + c.v_type + " dim " + std::to_string(c.dim) +
                 (c.kvq_rotate ? " +rot" : ""));
    const int64_t dim = c.dim, heads = 6, kv = 2;
    const KvShape shape{1, heads, kv, dim};
    KvCacheOptions options;
    options.k_type = c.k_type;
    options.v_type = c.v_type;
    options.rotate = c.kvq_rotate;
    options.max_tokens = 512;
    options.num_threads = 2;
    auto cache = PagedKvCache::Create(shape, options);
    ASSERT_TRUE(cache.ok()) << cache.status().message();
    ASSERT_TRUE((*cache)->AddSequence(0).ok());
    const int64_t k_block = Block(c.k_type, dim, false), v_block = Block(c.v_type, dim, true);
    std::vector<float> k_raw, v_raw;
    for (int64_t n : {37, 1, 300, 1}) {
      const auto k = Normal(static_cast<size_t>(n * kv * dim), rng);
      const auto v = Normal(k.size(), rng);
      ASSERT_TRUE((*cache)->Append(0, 0, n, k.data(), k.data(), v.data()).ok());
      k_raw.insert(k_raw.end(), k.begin(), k.end());
      v_raw.insert(v_raw.end(), v.begin(), v.end());
      const int64_t total = (*cache)->Length(0, 0);
      // What the codecs must have seen: R then G applied to the raw rows.
      std::vector<float> k_seen = k_raw, v_seen = v_raw;
      if (c.kvq_rotate) {
        ASSERT_TRUE(HadamardRotate(k_seen.data(), total * kv, dim).ok());
        ASSERT_TRUE(HadamardRotate(v_seen.data(), total * kv, dim).ok());
      }
      if (k_block > 0)
        ASSERT_TRUE(WalshHadamardBlocks(k_seen.data(), total * kv, dim, k_block).ok());
      if (v_block > 0)
        ASSERT_TRUE(WalshHadamardBlocks(v_seen.data(), total * kv, dim, v_block).ok());
      std::vector<float> k_dec(k_raw.size()), v_dec(v_raw.size());
      ASSERT_TRUE((*cache)->DecodeLayer(0, 0, k_dec.data(), v_dec.data()).ok());
      for (auto [type, seen, dec] : {std::make_tuple(c.k_type, &k_seen, &k_dec),
                                     std::make_tuple(c.v_type, &v_seen, &v_dec)}) {
        auto codec = ParseKvCodec(type, dim, CodecPath::kReference);
        ASSERT_TRUE(codec.ok());
        std::vector<uint8_t> rows(static_cast<size_t>(total * kv) * (*codec)->RowBytes());
        (*codec)->Encode(seen->data(), total * kv, rows.data());
        std::vector<float> want(seen->size());
        (*codec)->Decode(rows.data(), total * kv, want.data());
        ASSERT_EQ(std::memcmp(want.data(), dec->data(), want.size() * 4), 0) << type;
      }
      // Attention in the stored domain, then back.
      auto q = Normal(static_cast<size_t>(n * heads * dim), rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
      std::vector<float> out(q.size()), expected(q.size());
      ASSERT_TRUE((*cache)->Attend(0, 0, n, q.data(), scale, out.data()).ok());
      if (c.kvq_rotate) ASSERT_TRUE(HadamardRotate(q.data(), n * heads, dim).ok());
      if (k_block > 0) ASSERT_TRUE(WalshHadamardBlocks(q.data(), n * heads, dim, k_block).ok());
      AttentionRef(q.data(), k_dec.data(), v_dec.data(), n, total, heads, kv, dim, scale,
                   expected.data());
      if (v_block > 0) {
        ASSERT_TRUE(WalshHadamardBlocks(expected.data(), n * heads, dim, v_block).ok());
      }
      if (c.kvq_rotate) ASSERT_TRUE(HadamardUnrotate(expected.data(), n * heads, dim).ok());
      EXPECT_LE(Nmse(out, expected), 1e-9) << "n " << n;
    }
  }
}

// The rotation spreads an outlier channel over its block, which is why
// llama.cpp turned it on: q4_0's error on K with one large channel falls.
TEST(GgmlCache, RotationLowersQ4ErrorOnAnOutlierChannel) {
  std::mt19937 rng(3);
  const int64_t dim = 128, n = 64;
  std::vector<float> k = Normal(static_cast<size_t>(n * dim), rng);
  for (int64_t t = 0; t < n; ++t) k[t * dim + 5] = 40.0f;
  double err[2];
  for (bool rotate : {false, true}) {
    std::vector<float> x = k;
    if (rotate) ASSERT_TRUE(WalshHadamardBlocks(x.data(), n, dim, 128).ok());
    auto codec = ParseKvCodec("q4_0", dim);
    std::vector<uint8_t> rows(static_cast<size_t>(n) * (*codec)->RowBytes());
    (*codec)->Encode(x.data(), n, rows.data());
    std::vector<float> back(x.size());
    (*codec)->Decode(rows.data(), n, back.data());
    if (rotate) ASSERT_TRUE(WalshHadamardBlocks(back.data(), n, dim, 128).ok());
    err[rotate] = Nmse(back, k);
  }
  EXPECT_LT(err[1], err[0] / 2) << err[0] << " vs " << err[1];
}

// Each decoded value is within one step of its input, the step d being the
// block's scale in f32 before its f16 rounding: q8_0 d = amax / 127 (half a
// step: it rounds to nearest); q4_0 / q5_0 d = max / -(levels / 2), one step
// at most (the level of -max, one past the top code, clamps to it);
// q4_1 / q5_1 d = (max - min) / (levels - 1), half a step plus min's f16
// rounding (2^-11 relative). The f16 scale adds <= levels * 2^-11 * d, or
// levels * 2^-25 where it is an f16 subnormal (half its unit; so for min).
TEST(GgmlCache, EveryValueDecodesWithinAStepOfItsInput) {
  std::mt19937 rng(8);
  const int64_t dim = 96, n = 40;
  for (float sigma : {1.0f, 1e-3f, 300.0f}) {
    std::vector<float> x = Normal(static_cast<size_t>(n * dim), rng);
    for (float& v : x) v *= sigma;
    for (const char* type : {"q8_0", "q4_0", "q5_0", "q4_1", "q5_1"}) {
      SCOPED_TRACE(std::string(type) + " sigma " + std::to_string(sigma));
      auto codec = ParseKvCodec(type, dim);
      ASSERT_TRUE(codec.ok());
      std::vector<uint8_t> rows(static_cast<size_t>(n) * (*codec)->RowBytes());
      (*codec)->Encode(x.data(), n, rows.data());
      std::vector<float> back(x.size());
      (*codec)->Decode(rows.data(), n, back.data());
      const std::string t = type;
      const double levels = t == "q8_0" ? 255 : (t[1] == '4' ? 16 : 32);
      for (int64_t b = 0; b < n * dim / 32; ++b) {
        const float* xb = x.data() + b * 32;
        double lo = xb[0], hi = xb[0], amax = 0;
        for (int j = 0; j < 32; ++j) {
          lo = std::min<double>(lo, xb[j]);
          hi = std::max<double>(hi, xb[j]);
          amax = std::max<double>(amax, std::fabs(xb[j]));
        }
        double step, bound;
        if (t == "q8_0") {
          step = amax / 127;
          bound = step * (0.5 + 128 * std::ldexp(1.0, -11));
        } else if (t[3] == '0') {
          step = amax / (levels / 2);
          bound = step * (1 + levels * std::ldexp(1.0, -11));
        } else {
          step = (hi - lo) / (levels - 1);
          bound =
              step * (0.5 + levels * std::ldexp(1.0, -11)) + std::fabs(lo) * std::ldexp(1.0, -11);
        }
        bound += (levels + 1) * std::ldexp(1.0, -25);
        for (int j = 0; j < 32; ++j) {
          ASSERT_LE(std::fabs(back[b * 32 + j] - xb[j]), bound * 1.0001 + 1e-30)
              << "block " << b << " value " << j << " step " << step;
        }
      }
    }
  }
}

TEST(GgmlCache, HeadDimNotAMultipleOf32IsAClearError) {
  for (int64_t dim : {8, 48, 100}) {
    auto codec = ParseKvCodec("q5_1", dim);
    ASSERT_FALSE(codec.ok()) << dim;
    EXPECT_NE(codec.status().message().find("multiple of 32"), std::string::npos)
        << codec.status().message();
  }
}

TEST(GgmlCache, PreRopeKeysRefuseTheRotation) {
  KvShape shape{1, 2, 1, 64};
  shape.rope_inv_freq.assign(32, 0.5f);
  KvCacheOptions options;
  options.max_tokens = 16;
  options.k_type = "q4_0-prerope";
  auto bad = PagedKvCache::Create(shape, options);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("-norot"), std::string::npos) << bad.status().message();
  options.k_type = "q4_0-norot-prerope";
  EXPECT_TRUE(PagedKvCache::Create(shape, options).ok());
}

}  // namespace
}  // namespace kvq
