// GEAR codec (codec_gear.cc): names and layout, deterministic encoding,
// exact outliers, reconstruction bounds, the low-rank term's benefit, fused
// kernels against decoding (SIMD and reference), and the codec in the paged
// cache (streaming equivalence, planner bytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "int_scores_bounds.h"
#include "kv/codec.h"
#include "kv/codec_formats.h"
#include "kv/kv_factory.h"
#include "kv/kv_policy.h"
#include "kv/kv_test_util.h"
#include "kv/paged_cache.h"

namespace kvq {
namespace {

float RoundF16(float x) { return F16ToF32(F32ToF16(x)); }

std::vector<uint8_t> EncodeAll(const KvCodec& codec, const std::vector<float>& x, int64_t n) {
  std::vector<uint8_t> rows(static_cast<size_t>(n) * codec.RowBytes(), 0xEE);
  codec.Encode(x.data(), n, rows.data());
  return rows;
}

std::vector<float> DecodeAll(const KvCodec& codec, const std::vector<uint8_t>& rows, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n * codec.head_dim()));
  if (n > 0) codec.Decode(rows.data(), n, x.data());
  return x;
}

double SquaredError(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::pow(static_cast<double>(a[i]) - b[i], 2);
  return sum;
}

// Keys with fixed outlier channels (large in every token), plus `spikes`
// single large values per 64-token tile at random places (f16-exact values).
std::vector<float> OutlierKeys(int64_t tokens, int64_t dim, int spikes, std::mt19937& rng) {
  std::vector<float> x = Normal(static_cast<size_t>(tokens * dim), rng);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c : {3, 17, 40}) {
      if (c < dim) x[t * dim + c] += 20.0f;  // dim 32 has no channel 40
    }
  }
  std::uniform_int_distribution<int64_t> pos(0, 64 * dim - 1);
  for (int64_t t0 = 0; t0 + 64 <= tokens; t0 += 64) {
    for (int s = 0; s < spikes; ++s) x[t0 * dim + pos(rng)] = s % 2 ? 30.5f : -28.25f;
  }
  for (float& v : x) v = RoundF16(v);  // the cache hands codecs f16-rounded values
  return x;
}

TEST(GearCodec, NamesRoundTripWithTheirLayout) {
  for (const char* name : {"gear2", "gear4-g32-t64", "gear2-c32-rank2-iter1-out0.5",
                           "gear8-g64-t128-rank0-iter3-out0", "gear4-c128-rank16-iter20-out10"}) {
    for (int64_t dim : {32, 64, 128}) {
      auto codec = ParseKvCodec(name, dim);
      if (std::string(name).find("g64") != std::string::npos && dim == 32) {
        EXPECT_FALSE(codec.ok()) << name;  // group 64 does not divide 32
        continue;
      }
      ASSERT_TRUE(codec.ok()) << name << " " << dim << ": " << codec.status().message();
      EXPECT_EQ(MustParse((*codec)->Name(), dim)->Name(), (*codec)->Name());
      const codec::GearFormat f = *codec::ParseGearFormat((*codec)->Name(), name);
      const int64_t tile = f.tile_tokens, bits = f.bits;
      EXPECT_EQ((*codec)->streaming().tile_tokens, tile);
      EXPECT_EQ((*codec)->streaming().flush_tokens, tile);
      EXPECT_EQ((*codec)->streaming().keep_tokens, 0);
      // The layout of codec_gear.cc written out: base codes and f16 scale +
      // min per channel (or per token group), A, B, outlier slots, header,
      // padded to whole rows.
      const int64_t params = f.per_channel ? 4 * dim : tile * (dim / f.group) * 4;
      const int64_t slots = (f.outlier_permille * tile * dim + 999) / 1000;
      const int64_t bytes =
          tile * dim * bits / 8 + params + 2 * tile * f.rank + 2 * f.rank * dim + 4 * slots + 4;
      EXPECT_EQ((*codec)->RowBytes(), static_cast<size_t>((bytes + tile - 1) / tile)) << name;
    }
  }
  // The figures docs/ARCHITECTURE.md quotes (bytes per token and KV head).
  EXPECT_EQ(MustParse("gear2-c64-rank4-iter3-out2", 64)->RowBytes(), 42u);
  EXPECT_EQ(MustParse("gear2-g32-t64-rank4-iter3-out2", 64)->RowBytes(), 46u);
  EXPECT_EQ(MustParse("gear4-c64-rank4-iter3-out2", 64)->RowBytes(), 58u);
  EXPECT_EQ(MustParse("gear4-g32-t64-rank4-iter3-out2", 64)->RowBytes(), 62u);
  EXPECT_EQ(MustParse("gear2", 64)->Name(), "gear2-c64-rank4-iter3-out2");
  EXPECT_EQ(MustParse("gear4-g32-out0.5-rank2", 64)->Name(), "gear4-g32-t64-rank2-iter3-out0.5");
  EXPECT_EQ(MustParse("gear2-r128", 64)->streaming().flush_tokens, 128);
  for (const char* bad : {"gear3", "gear2-c48", "gear2-rank17", "gear2-iter0", "gear2-out11",
                          "gear2-out1.25", "gear2-c64-t64", "gear2-rank4-rank2", "gear2-g32-c64",
                          "gear2-x", "gear2-r96", "gear2-c128-rank4"}) {
    const int64_t dim = std::string(bad) == "gear2-c128-rank4" ? 1024 : 64;  // 128 * 1024 > 2^16
    EXPECT_FALSE(ParseKvCodec(bad, dim).ok()) << bad;
  }
  EXPECT_FALSE(ParseKvCodec("gear2", 48).ok());
  auto gear2 = ExpandKvScheme("gear2");
  ASSERT_TRUE(gear2.ok());
  EXPECT_EQ(gear2->k_type, "gear2-c64-rank4-iter3-out2");
  EXPECT_EQ(gear2->v_type, "gear2-g32-t64-rank4-iter3-out2");
  EXPECT_EQ(ExpandKvScheme("gear4")->v_type, "gear4-g32-t64-rank4-iter3-out2");
}

// Encoding is a pure function of the input: twice, and on both paths, the
// same bytes; Decode is bit-identical on both paths.
TEST(GearCodec, EncodeIsDeterministicAndDecodeMatchesReference) {
  std::mt19937 rng(1);
  for (const char* name : {"gear2", "gear4-g32", "gear2-g64-t32-rank8-iter5-out5"}) {
    for (int64_t dim : {64, 128}) {
      const auto fast = MustParse(name, dim, CodecPath::kSimd);
      const auto ref = MustParse(name, dim, CodecPath::kReference);
      const int64_t n = 3 * fast->streaming().tile_tokens;
      const std::vector<float> x = OutlierKeys(n, dim, 10, rng);
      const auto a = EncodeAll(*fast, x, n), b = EncodeAll(*fast, x, n), c = EncodeAll(*ref, x, n);
      EXPECT_EQ(a, b) << name;
      EXPECT_EQ(a, c) << name;
      const auto xa = DecodeAll(*fast, a, n), xc = DecodeAll(*ref, c, n);
      ASSERT_EQ(std::memcmp(xa.data(), xc.data(), xa.size() * 4), 0) << name;
    }
  }
}

// With rank 0 and no outliers GEAR is its base quantizer: the same values as
// the per-channel / per-token int codec (the base region is their layout).
TEST(GearCodec, WithoutLowRankAndOutliersEqualsTheBaseCodec) {
  std::mt19937 rng(2);
  const std::vector<float> x = OutlierKeys(128, 64, 0, rng);
  const auto pairs = {std::pair{"gear2-c64-rank0-out0", "int2-c64-asym"},
                      std::pair{"gear4-g32-t64-rank0-out0", "int4-g32-asym"}};
  for (const auto& [gear_name, int_name] : pairs) {
    const auto gear = MustParse(gear_name, 64), base = MustParse(int_name, 64);
    EXPECT_EQ(DecodeAll(*gear, EncodeAll(*gear, x, 128), 128),
              DecodeAll(*base, EncodeAll(*base, x, 128), 128))
        << gear_name;
  }
}

// Planted spikes (20 per tile, 82 slots at 2% of 64 x 64) are all chosen and
// come back exactly; reconstruction beats the base quantizer alone and stays
// under the bound derived from each channel's grid.
TEST(GearCodec, OutlierChannelKeysReconstructWithinTheBaseGridBound) {
  std::mt19937 rng(3);
  const int64_t dim = 64, n = 256;
  const std::vector<float> x = OutlierKeys(n, dim, 20, rng);
  const auto gear = MustParse("gear2-c64-rank4-iter3-out2", dim);
  const auto rows = EncodeAll(*gear, x, n);
  const auto back = DecodeAll(*gear, rows, n);
  auto parts = codec::GearDecodeParts(*gear, rows.data(), n);
  ASSERT_TRUE(parts.ok());
  int64_t spikes_exact = 0;
  double bound = 0;
  for (int64_t t0 = 0; t0 < n; t0 += 64) {
    for (int64_t c = 0; c < dim; ++c) {
      // Non-outlier values of the channel over the tile set its 2-bit grid.
      float lo = INFINITY, hi = -INFINITY;
      int64_t count = 0;
      for (int64_t t = t0; t < t0 + 64; ++t) {
        const size_t i = static_cast<size_t>(t * dim + c);
        if (parts->outlier_mask[i] != 0) {
          EXPECT_EQ(back[i], x[i]) << "outlier " << i << " not stored exactly";
          continue;
        }
        lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
        ++count;
      }
      // Half a step (max - min) / 3, widened by the f16 scale's relative
      // error (2^-11 of a step, at most 3 steps from the min: 6 half-step
      // units of 2^-11) and the f16 min's
      // (2^-11 |min|): the base error per value. The low-rank term is a
      // least-squares fit column by column, so it cannot increase the
      // residual's Frobenius norm beyond the f16 rounding of its B rows
      // (2^-11 relative, ~2^-22 in squared terms; the 1.001 below).
      const double half_step = (hi - lo) / 6.0 * (1 + 6 * 0x1p-11) + 0x1p-11 * std::fabs(lo);
      bound += static_cast<double>(count) * half_step * half_step;
    }
  }
  for (int64_t t0 = 0; t0 < n; t0 += 64) {
    for (int64_t t = t0; t < t0 + 64; ++t) {
      for (int64_t c = 0; c < dim; ++c) {
        const float v = x[t * dim + c];
        if ((v == 30.5f || v == -28.25f) && back[t * dim + c] == v) ++spikes_exact;
      }
    }
  }
  EXPECT_GE(spikes_exact, 4 * 20 - 4);  // spikes may coincide (same position twice)
  const double err = SquaredError(back, x);
  EXPECT_LE(err, bound * 1.001);
  // The base alone: a spike of ~30 in a channel of N(0, 1) stretches its
  // 2-bit step from ~5/3 to ~33/3, so the channel's 63 other values err by
  // ~11^2 / 12 ~ 10 each instead of ~0.23: ~60 spiked channels per tile make
  // the base's squared error ~30x GEAR's. Demand 4x.
  const auto base = MustParse("int2-c64-asym", dim);
  const double base_err = SquaredError(DecodeAll(*base, EncodeAll(*base, x, n), n), x);
  EXPECT_LT(err * 4, base_err) << "gear " << err << " base " << base_err;
}

// Rank-1 data u v^T: per channel (or per token) min/max grids scale with the
// data, so every channel with v_c > 0 (token with u_t > 0) sits on the same
// relative grid and its rounding error is the same vector scaled: the
// residual is rank 2 (one term per sign) up to the noise's effect. Noise of
// sigma 0.001 plus the f16 rounding of x (<= 0.001 at |x| < 4) against steps
// of ~0.3 (4-bit) to ~1.7 (2-bit) flips at most ~2 * 0.002 / 0.3 ~ 1.3% of
// roundings, each by one step: ~0.013 step^2 of residual energy per value
// left vs ~step^2 / 12 ~ 0.083 for the base, so rank 4 should leave < 20% of
// the base error; the test demands < 50%.
TEST(GearCodec, LowRankTermRemovesStructuredResidual) {
  std::mt19937 rng(4);
  const int64_t dim = 64, n = 128;
  std::uniform_real_distribution<float> magnitude(0.5f, 2.0f);
  std::vector<float> u(n), v(dim);
  for (float& e : u) e = magnitude(rng) * (rng() % 2 ? 1.0f : -1.0f);
  for (float& e : v) e = magnitude(rng) * (rng() % 2 ? 1.0f : -1.0f);
  const std::vector<float> noise = Normal(static_cast<size_t>(n * dim), rng, 0.001f);
  std::vector<float> x(static_cast<size_t>(n * dim));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < dim; ++c) x[t * dim + c] = RoundF16(u[t] * v[c] + noise[t * dim + c]);
  }
  for (const char* base : {"gear2-c64", "gear2-g64-t64", "gear4-g32-t64"}) {
    const auto plain = MustParse(std::string(base) + "-rank0-out0", dim);
    const auto low_rank = MustParse(std::string(base) + "-rank4-iter3-out0", dim);
    const double plain_err = SquaredError(DecodeAll(*plain, EncodeAll(*plain, x, n), n), x);
    const double low_rank_err =
        SquaredError(DecodeAll(*low_rank, EncodeAll(*low_rank, x, n), n), x);
    EXPECT_LT(low_rank_err, 0.5 * plain_err) << base << " " << low_rank_err << " vs " << plain_err;
  }
}

// Scores and AccumulateV against double math over Decode's output, for any
// prefix of tiles. The fast path sums the same quantities in another order:
// q . base (d products), (q B^T) A^T (r dots of d, then r products), and per
// outlier q_c (s - base - AB); Decode itself rounds base + AB once. Each
// part's f32 rounding is at most gamma_K times the sum of the absolute
// products it combines (recursive summation), K = d + 2r + 8 covering the
// longest chain; M below is that absolute sum.
void ExpectGearFusedMatchDecode(const KvCodec& codec, const std::vector<uint8_t>& rows, int64_t n,
                                int64_t group, std::mt19937& rng, const std::string& what) {
  const int64_t dim = codec.head_dim();
  const std::vector<float> x = DecodeAll(codec, rows, n);
  auto parts = codec::GearDecodeParts(codec, rows.data(), n);
  ASSERT_TRUE(parts.ok());
  // Per value: the magnitude every computed path of that value is bounded by.
  std::vector<double> mag(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    mag[i] = std::fabs(parts->base[i]) + parts->low_rank_abs[i] + std::fabs(x[i]);
    if (parts->outlier_mask[i] != 0) mag[i] *= 2;  // corrections: s - base - AB, then x^ = s
  }
  const double gamma = [&] {
    const double k = static_cast<double>(dim + 2 * 16 + 8 + n);
    return k * kEps / (1 - k * kEps);
  }();
  const std::vector<float> q = Normal(static_cast<size_t>(group * dim), rng);
  const int64_t stride = n + 3;
  const float scale = 0.125f;
  std::vector<float> scores(static_cast<size_t>(group * stride), -7.0f);
  codec.Scores(rows.data(), n, q.data(), group, scale, scores.data(), stride);
  // The base scores through an integer path, which quantizes q to int8 per
  // group first (codec_int_scores.h, codec_channel.cc): add that term's bound.
  auto format = codec::ParseGearFormat(codec.Name(), codec.Name());
  ASSERT_TRUE(format.ok());
  const bool int_query = !format->per_channel;
  for (int64_t h = 0; h < group; ++h) {
    for (int64_t t = 0; t < stride; ++t) {
      if (t >= n) {
        ASSERT_EQ(scores[h * stride + t], -7.0f) << what << ": Scores wrote past n";
        continue;
      }
      double exact = 0, m = 0;
      for (int64_t i = 0; i < dim; ++i) {
        exact += static_cast<double>(q[h * dim + i]) * x[t * dim + i];
        m += std::fabs(q[h * dim + i]) * mag[t * dim + i];
      }
      // A per-channel base scores through the per-channel integer path
      // (codec_channel.cc), whose tile starts the GEAR tile.
      const int64_t tile_tokens = codec.streaming().tile_tokens;
      const double query_bound =
          int_query ? int_scores_bounds::QuantizationBound(
                          format->Base(), dim, &parts->base[t * dim], &q[h * dim], scale)
                    : int_scores_bounds::ChannelScoreBound(
                          format->Base().bits, format->Base().symmetric, dim,
                          rows.data() + t / tile_tokens * tile_tokens * codec.RowBytes(),
                          &parts->base[t * dim], &q[h * dim], scale);
      ASSERT_NEAR(scores[h * stride + t], scale * exact, gamma * scale * m + query_bound + 1e-30)
          << what << " Scores h " << h << " t " << t;
    }
  }
  std::vector<float> p(static_cast<size_t>(group * stride));
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (float& e : p) e = unit(rng);
  const std::vector<float> acc0 = Normal(static_cast<size_t>(group * dim), rng);
  std::vector<float> acc = acc0;
  codec.AccumulateV(rows.data(), n, p.data(), group, stride, acc.data());
  for (int64_t h = 0; h < group; ++h) {
    for (int64_t i = 0; i < dim; ++i) {
      double exact = acc0[h * dim + i], m = std::fabs(exact);
      for (int64_t t = 0; t < n; ++t) {
        exact += static_cast<double>(p[h * stride + t]) * x[t * dim + i];
        m += p[h * stride + t] * mag[t * dim + i];
      }
      ASSERT_NEAR(acc[h * dim + i], exact, gamma * m + 1e-30)
          << what << " AccumulateV h " << h << " i " << i;
    }
  }
}

TEST(GearCodec, FusedKernelsMatchDecodeOnBothPaths) {
  std::mt19937 rng(5);
  for (const char* name : {"gear2", "gear4-g32", "gear2-g64-t32-rank8-iter2-out5", "gear4-c128"}) {
    for (int64_t dim : {32, 64, 128}) {
      if (!ParseKvCodec(name, dim).ok()) continue;
      const auto fast = MustParse(name, dim, CodecPath::kSimd);
      const auto ref = MustParse(name, dim, CodecPath::kReference);
      const int64_t tile = fast->streaming().tile_tokens;
      const int64_t n = 3 * tile;
      const std::vector<float> x = OutlierKeys(n, dim, 12, rng);
      const auto rows = EncodeAll(*fast, x, n);
      for (int64_t prefix : {int64_t{0}, int64_t{1}, int64_t{5}, tile - 1, tile, tile + 1, n}) {
        const int64_t group = 1 + static_cast<int64_t>(rng() % 8);
        const std::string what = std::string(name) + " dim " + std::to_string(dim) + " prefix " +
                                 std::to_string(prefix) + " group " + std::to_string(group);
        ExpectGearFusedMatchDecode(*fast, rows, prefix, group, rng, what + " simd");
        ExpectGearFusedMatchDecode(*ref, rows, prefix, group, rng, what + " ref");
      }
    }
  }
}

// The paged cache: appending token by token leaves the same stored state as
// one prefill (tiles encode once 64 tokens exist, from the same f16 inputs),
// and the planner's bytes are what the cache allocates.
TEST(GearCodec, CacheStreamsLikePrefillAndPlannerBytesAreAllocated) {
  std::mt19937 rng(6);
  const KvShape shape{2, 6, 2, 64};
  const int64_t tokens = 333;
  KvCacheOptions options;
  options.k_type = options.v_type = "gear2";
  options.max_tokens = tokens;
  options.num_threads = 1;
  auto layout = ComputeKvLayout(shape, options);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  EXPECT_EQ(layout->block_tokens, 64);  // 16 rounded up to the GEAR tile
  // K ring and V ring hold up to 64 f16 rows each, per layer and KV head.
  EXPECT_EQ(layout->staging_bytes, 2u * 2u * 2u * 64u * 128u);
  const auto k_codec = MustParse("gear2-c64-rank4-iter3-out2", 64);
  const auto v_codec = MustParse("gear2-g32-t64-rank4-iter3-out2", 64);
  EXPECT_EQ(layout->block_bytes, 2u * 2u * 64u * (k_codec->RowBytes() + v_codec->RowBytes()));
  options.memory_bytes = layout->side_bytes + 2 * layout->SequenceBytes(tokens);
  auto once = PagedKvCache::Create(shape, options);
  auto stepwise = PagedKvCache::Create(shape, options);
  ASSERT_TRUE(once.ok() && stepwise.ok());
  const int64_t row = shape.num_kv_heads * shape.head_dim;
  std::vector<std::vector<float>> k, v;
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    k.push_back(OutlierKeys(tokens * shape.num_kv_heads, shape.head_dim, 6, rng));
    v.push_back(Normal(static_cast<size_t>(tokens * row), rng));
  }
  for (auto* cache : {once->get(), stepwise->get()}) ASSERT_TRUE(cache->AddSequence(0).ok());
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    ASSERT_TRUE((*once)->Append(0, l, tokens, k[l].data(), k[l].data(), v[l].data()).ok());
  }
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      const float* kt = k[l].data() + t * row;
      ASSERT_TRUE((*stepwise)->Append(0, l, 1, kt, kt, v[l].data() + t * row).ok());
    }
  }
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    std::vector<float> k1(static_cast<size_t>(tokens * row)), v1(k1.size()), k2(k1.size()),
        v2(k1.size());
    ASSERT_TRUE((*once)->DecodeLayer(0, l, k1.data(), v1.data()).ok());
    ASSERT_TRUE((*stepwise)->DecodeLayer(0, l, k2.data(), v2.data()).ok());
    ASSERT_EQ(k1, k2) << "layer " << l;
    ASSERT_EQ(v1, v2) << "layer " << l;
    // 320 tokens in 5 encoded tiles are lossy; the 13 newest are f16 rows.
    for (int64_t i = 320 * row; i < tokens * row; ++i) ASSERT_EQ(v1[i], RoundF16(v[l][i]));
    const auto q = Normal(static_cast<size_t>(shape.num_heads * shape.head_dim), rng);
    std::vector<float> a(q.size()), b(q.size());
    ASSERT_TRUE((*once)->Attend(0, l, 1, q.data(), 0.125f, a.data()).ok());
    ASSERT_TRUE((*stepwise)->Attend(0, l, 1, q.data(), 0.125f, b.data()).ok());
    ASSERT_EQ(a, b);
  }
  // 333 tokens: 6 blocks of 64 each, plus the staging charged per sequence.
  EXPECT_EQ((*once)->BytesUsed(), layout->side_bytes + layout->SequenceBytes(tokens));
  EXPECT_EQ(layout->SequenceBytes(tokens),
            static_cast<size_t>(6 + layout->staging_blocks) * layout->block_bytes);
}

}  // namespace
}  // namespace kvq
