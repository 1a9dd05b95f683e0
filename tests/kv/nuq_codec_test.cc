// KVQuant pieces: the NUQ codecs (SIMD == scalar twin, fused kernels ==
// decode-then-math, outliers exact, error bounds), the weighted 1-D k-means,
// the calibration file (round trip, clear errors) and a kvquant cache (K
// before RoPE) against AttentionRef on its decoded keys with RoPE applied.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/fp16.h"
#include "hwy/tests/hwy_gtest.h"
#include "kv/attention_ref.h"
#include "kv/codec.h"
#include "kv/kv_calibration.h"
#include "kv/kv_factory.h"
#include "kv/kv_test_util.h"
#include "kv/paged_cache.h"
#include "ops/rope.h"

namespace kvq {
namespace {

// Keys with fixed outlier channels (3, 17, 40: offset 20) and values in a
// bounded range (uniform in +-sigma_c around mu_c), plus one spike per row
// in a random channel: what per-channel normalization and the outlier slot
// are for. x: [n, heads, dim].
std::vector<float> SyntheticKeys(int64_t n, int64_t heads, int64_t dim, std::mt19937& rng) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int64_t> channel(0, dim - 1);
  std::vector<float> x(static_cast<size_t>(n * heads * dim));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* row = &x[(t * heads + h) * dim];
      for (int64_t c = 0; c < dim; ++c) {
        const float mu = (c == 3 || c == 17 || c == 40) ? 20.0f : 0.1f * (c % 5);
        const float sigma = 0.5f + 0.05f * (c % 7);
        row[c] = mu + sigma * unit(rng);
      }
      row[channel(rng)] += 50.0f;
    }
  }
  return x;
}

// A calibration for one layer and `heads` KV heads from data x.
KvCalibration CalibrationFrom(const std::vector<float>& x, int64_t n, int64_t heads, int64_t dim,
                              const std::vector<int>& bits) {
  KvCalibration c;
  c.source = "test";
  c.num_layers = 1;
  c.num_heads = heads * 2;
  c.num_kv_heads = heads;
  c.head_dim = dim;
  c.tokens = n;
  c.k_offset.resize(static_cast<size_t>(heads * dim));
  c.k_scale.resize(c.k_offset.size());
  KeyChannelRanges(x.data(), n, heads, dim, 1, c.k_offset.data(), c.k_scale.data());
  for (int b : bits) {
    for (bool is_v : {false, true}) {
      NuqFitInput in;
      in.bits = b;
      in.is_v = is_v;
      in.n = n;
      in.kv_heads = heads;
      in.head_dim = dim;
      in.x = x.data();
      in.k_offset = c.k_offset.data();
      in.k_scale = c.k_scale.data();
      auto levels = FitNuqLevels(in);
      EXPECT_TRUE(levels.ok()) << levels.status().message();
      (is_v ? c.codebooks[b].v : c.codebooks[b].k) = *levels;
    }
  }
  return c;
}

std::unique_ptr<KvCodec> MakeCalibrated(const std::string& name, int64_t dim, CodecPath path,
                                        const KvCalibration& c) {
  auto codec = ParseKvCodec(name, dim, path);
  EXPECT_TRUE(codec.ok()) << codec.status().message();
  const bool is_v = name.find("-v") != std::string::npos;
  const Status set = (*codec)->SetCalibration(c, 0, 0, is_v);
  EXPECT_TRUE(set.ok()) << set.message();
  return std::move(codec).value();
}

TEST(NuqCodec, NamesAndLayout) {
  auto k = ParseKvCodec("nuq3-k-s1-prerope", 64);
  ASSERT_TRUE(k.ok()) << k.status().message();
  EXPECT_EQ((*k)->Name(), "nuq3-k-o1-s1-prerope");
  // 64 * 3 / 8 = 24 code bytes, 1 slot (ceil 0.64): f16 value + channel = 27 -> 28.
  EXPECT_EQ((*k)->RowBytes(), 28u);
  auto v = ParseKvCodec("nuq2-v-o2", 128);
  ASSERT_TRUE(v.ok());
  // 32 code bytes + scale/offset 4 + 3 slots (ceil 2.56) * 3 = 45 -> 48.
  EXPECT_EQ((*v)->RowBytes(), 48u);
  EXPECT_TRUE((*v)->NeedsCalibrationFile());
  for (const char* bad : {"nuq5-k", "nuq3", "nuq3-x", "nuq3-k-o11", "nuq3-k-o1-o2", "nuq3-k-g32"}) {
    EXPECT_FALSE(ParseKvCodec(bad, 64).ok()) << bad;
  }
  EXPECT_FALSE(ParseKvCodec("nuq3-k", 48).ok());   // not a multiple of 32
  EXPECT_FALSE(ParseKvCodec("nuq3-k", 512).ok());  // channel index beyond a byte
}

// Every compiled Highway target (AVX-512, AVX2, SSE4, ... as the machine
// supports), like the other codecs' SIMD tests.
class NuqSimdTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(NuqSimdTest);

TEST_P(NuqSimdTest, DecodeIsBitExactAndFusedKernelsMatchDecode) {
  std::mt19937 rng(1);
  for (int64_t dim : {32, 64, 128, 256}) {
    const int64_t n = 37;  // odd: the two-row Scores path and its tail
    const auto x = SyntheticKeys(n, 1, dim, rng);
    const KvCalibration c = CalibrationFrom(x, n, 1, dim, {2, 3, 4});
    for (int bits : {2, 3, 4}) {
      for (const char* side : {"k", "v"}) {
        for (int outliers : {0, 1, 5}) {
          const std::string name =
              "nuq" + std::to_string(bits) + "-" + side + "-o" + std::to_string(outliers);
          auto fast = MakeCalibrated(name, dim, CodecPath::kSimd, c);
          auto ref = MakeCalibrated(name, dim, CodecPath::kReference, c);
          std::vector<uint8_t> rows(n * fast->RowBytes()), rows_ref(rows.size());
          fast->Encode(x.data(), n, rows.data());
          ref->Encode(x.data(), n, rows_ref.data());
          ASSERT_EQ(rows, rows_ref) << name;
          std::vector<float> a(static_cast<size_t>(n * dim)), b(a.size());
          fast->Decode(rows.data(), n, a.data());
          ref->Decode(rows.data(), n, b.data());
          ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << name;
          // Fused kernels: SIMD vs the double-accumulating reference on the
          // same decoded values. f32 sums of dim products in any order:
          // |error| <= gamma_(dim+2) * sum |q_i x_i| (recursive summation),
          // gamma_k = k 2^-24 / (1 - k 2^-24); the same for each AccumulateV
          // output over n terms plus the start value.
          for (int64_t group : {1, 3, 7, 9}) {
            const auto q = Normal(static_cast<size_t>(group * dim), rng);
            const int64_t stride = n + 2;
            std::vector<float> s_fast(group * stride, -7.0f), s_ref(s_fast.size(), -7.0f);
            fast->Scores(rows.data(), n, q.data(), group, 0.125f, s_fast.data(), stride);
            ref->Scores(rows.data(), n, q.data(), group, 0.125f, s_ref.data(), stride);
            const double gamma_s = (dim + 2) * 0x1p-24 / (1 - (dim + 2) * 0x1p-24);
            for (int64_t h = 0; h < group; ++h) {
              for (int64_t t = 0; t < n; ++t) {
                double abs_sum = 0;
                for (int64_t i = 0; i < dim; ++i)
                  abs_sum += std::fabs(q[h * dim + i] * a[t * dim + i]);
                ASSERT_NEAR(s_fast[h * stride + t], s_ref[h * stride + t],
                            gamma_s * 0.125 * abs_sum + 1e-30)
                    << name << " h " << h << " t " << t;
              }
              ASSERT_EQ(s_fast[h * stride + n], -7.0f) << name << ": wrote past n";
            }
            std::vector<float> p(group * stride);
            std::uniform_real_distribution<float> unit(0.0f, 1.0f);
            for (float& v : p) v = unit(rng);
            const auto acc0 = Normal(static_cast<size_t>(group * dim), rng);
            std::vector<float> acc_fast = acc0, acc_ref = acc0;
            fast->AccumulateV(rows.data(), n, p.data(), group, stride, acc_fast.data());
            ref->AccumulateV(rows.data(), n, p.data(), group, stride, acc_ref.data());
            const double gamma_v = (n + 2) * 0x1p-24 / (1 - (n + 2) * 0x1p-24);
            for (int64_t h = 0; h < group; ++h) {
              for (int64_t i = 0; i < dim; ++i) {
                double abs_sum = std::fabs(acc0[h * dim + i]);
                for (int64_t t = 0; t < n; ++t)
                  abs_sum += std::fabs(p[h * stride + t] * a[t * dim + i]);
                ASSERT_NEAR(acc_fast[h * dim + i], acc_ref[h * dim + i], gamma_v * abs_sum + 1e-30)
                    << name << " h " << h << " i " << i;
              }
            }
          }
        }
      }
    }
  }
}

TEST(NuqCodec, OutliersAreStoredExactly) {
  std::mt19937 rng(2);
  const int64_t dim = 128, n = 20;
  const auto calib = SyntheticKeys(64, 1, dim, rng);
  const KvCalibration c = CalibrationFrom(calib, 64, 1, dim, {3});
  for (const char* name : {"nuq3-k-o2", "nuq3-v-o2"}) {
    auto codec = MakeCalibrated(name, dim, CodecPath::kSimd, c);
    // 2% of 128 -> 3 slots; plant 3 values far outside everything else,
    // f16-representable so "exact" means bit-equal.
    std::vector<float> x = Normal(static_cast<size_t>(n * dim), rng);
    for (float& v : x) v = F16ToF32(F32ToF16(v));
    for (int64_t t = 0; t < n; ++t) {
      x[t * dim + (t * 7) % dim] = 1000.0f + t;
      x[t * dim + (t * 7 + 50) % dim] = -2048.0f;
      x[t * dim + (t * 7 + 90) % dim] = 4100.0f;  // a multiple of f16's spacing 4 there
    }
    std::vector<uint8_t> rows(n * codec->RowBytes());
    codec->Encode(x.data(), n, rows.data());
    std::vector<float> back(x.size());
    codec->Decode(rows.data(), n, back.data());
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t c2 : {(t * 7) % dim, (t * 7 + 50) % dim, (t * 7 + 90) % dim}) {
        EXPECT_EQ(back[t * dim + c2], x[t * dim + c2]) << name << " t " << t << " c " << c2;
      }
    }
  }
}

// The V split reads only the ends of the row's order by value, so the codec
// places them with partial sorts; this is the whole stable sort it must
// equal: outlier channels, scale and offset bit for bit, on rows full of
// ties, signed zeros, infinities and NaNs, at every width and percentage
// (up to slots that make the two ends overlap, which sort the row).
TEST(NuqCodec, ValueSplitEqualsTheStableSortOfTheRow) {
  const auto stable_split = [](const codec::NuqFormat& f, int64_t dim, const float* x) {
    auto key = [&](int64_t c) { return std::isnan(x[c]) ? INFINITY : x[c]; };
    std::vector<int64_t> order(static_cast<size_t>(dim));
    for (int64_t c = 0; c < dim; ++c) order[static_cast<size_t>(c)] = c;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const bool a_nan = std::isnan(x[a]), b_nan = std::isnan(x[b]);
      if (a_nan != b_nan) return b_nan;
      return !a_nan && x[a] < x[b];
    });
    std::vector<int64_t> outliers;
    int64_t lo = 0, hi = dim - 1;
    for (int64_t s = 0; s < f.Slots(dim) && lo < hi; ++s) {
      const float drop_hi = key(order[hi]) - key(order[hi - 1]);
      const float drop_lo = key(order[lo + 1]) - key(order[lo]);
      outliers.push_back(!(drop_hi < drop_lo) ? order[hi--] : order[lo++]);
    }
    std::sort(outliers.begin(), outliers.end());
    const float min = x[order[lo]], max = x[order[hi]];
    return std::make_tuple(outliers, F32ToF16((max - min) * 0.5f),
                           F32ToF16(min + (max - min) * 0.5f));
  };
  std::mt19937 rng(11);
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, 3.5f};
  int rows = 0;
  for (int64_t dim : {32, 64, 96, 128, 256}) {
    for (int64_t percent : {1, 3, 10}) {
      codec::NuqFormat f;
      f.is_v = true;
      f.outlier_percent = percent;
      for (int trial = 0; trial < 200; ++trial, ++rows) {
        std::vector<float> x(static_cast<size_t>(dim)), y(x.size());
        // Few distinct values make ties; some rows get specials.
        std::uniform_int_distribution<int> level(-3, 3), pick(0, 7), odds(0, 9);
        for (float& v : x) v = odds(rng) == 0 ? specials[pick(rng)] : 0.5f * level(rng);
        codec::NuqRowSplit split;
        codec::NuqSplitRowRef(f, dim, x.data(), nullptr, nullptr, y.data(), &split);
        const auto [outliers, scale_bits, offset_bits] = stable_split(f, dim, x.data());
        ASSERT_EQ(split.slots, static_cast<int64_t>(outliers.size())) << dim << " " << percent;
        for (size_t s = 0; s < outliers.size(); ++s) {
          ASSERT_EQ(split.channels[s], outliers[s]) << "row " << rows << " slot " << s;
        }
        ASSERT_EQ(split.scale_bits, scale_bits) << "row " << rows;
        ASSERT_EQ(split.offset_bits, offset_bits) << "row " << rows;
      }
    }
  }
}

TEST(NuqCodec, KMeansFindsObviousClusters) {
  // Three tight clusters; with k = 3 the optimum is each cluster's weighted
  // mean, and quantile starts put one centre in each.
  std::vector<float> values, weights;
  const float centres[] = {-0.75f, 0.125f, 0.5f};
  for (int i = 0; i < 300; ++i) {
    const int cluster = i % 3;
    values.push_back(centres[cluster] + ((i / 3) % 5 - 2) * 0.01f);
    weights.push_back(1.0f + (i / 3) % 2);
  }
  const std::vector<double> got = WeightedKMeans1D(values, weights, 3);
  ASSERT_EQ(got.size(), 3u);
  for (int cluster = 0; cluster < 3; ++cluster) {
    double sw = 0, swx = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      if (static_cast<int>(i % 3) != cluster) continue;
      sw += weights[i];
      swx += static_cast<double>(weights[i]) * values[i];
    }
    // Prefix sums in double over 300 points: ~1e-15 relative.
    EXPECT_NEAR(got[cluster], swx / sw, 1e-12);
  }
  // Weights move the centre: one point of weight 3 and one of weight 1 -> 3/4 of the way.
  const std::vector<double> one = WeightedKMeans1D({0.0f, 1.0f}, {1.0f, 3.0f}, 1);
  EXPECT_NEAR(one[0], 0.75, 1e-15);
}

TEST(NuqCodec, ReconstructionBeatsUniformIntAndStaysWithinBound) {
  std::mt19937 rng(3);
  const int64_t dim = 64, heads = 1, train = 2048, test = 256;
  const auto x_train = SyntheticKeys(train, heads, dim, rng);
  const auto x_test = SyntheticKeys(test, heads, dim, rng);
  const KvCalibration c = CalibrationFrom(x_train, train, heads, dim, {2, 3, 4});
  auto mse = [&](const KvCodec& codec) {
    std::vector<uint8_t> rows(test * codec.RowBytes());
    codec.Encode(x_test.data(), test, rows.data());
    std::vector<float> back(x_test.size());
    codec.Decode(rows.data(), test, back.data());
    double sum = 0;
    for (size_t i = 0; i < back.size(); ++i) sum += std::pow(back[i] - x_test[i], 2);
    return sum / back.size();
  };
  double mean_scale2 = 0;
  for (float s : c.k_scale) mean_scale2 += static_cast<double>(s) * s / dim;
  for (int bits : {2, 3, 4}) {
    auto nuq = MakeCalibrated("nuq" + std::to_string(bits) + "-k", dim, CodecPath::kSimd, c);
    const double nuq_mse = mse(*nuq);
    // Bound: inliers lie in [-1, 1] after normalization up to the 0.5%
    // quantile cut (for uniform data it clips at most 1% of the half-range,
    // 0.01), the spike is a slot; uniform levels would leave at most half a
    // step, 1 / (2^b - 1), per element, and k-means (started from quantiles,
    // then only lowering its weighted error) lands at or below that on data
    // this close to uniform: MSE <= mean(scale^2) * (1/(2^b-1) + 0.01)^2.
    const double step_bound = 1.0 / ((1 << bits) - 1) + 0.01;
    EXPECT_LT(nuq_mse, mean_scale2 * step_bound * step_bound) << bits;
    if (bits != 3) {
      auto uniform = ParseKvCodec("int" + std::to_string(bits) + "-g32-asym", dim);
      ASSERT_TRUE(uniform.ok());
      EXPECT_LT(nuq_mse, mse(**uniform)) << "nuq" << bits << " vs int" << bits;
    }
  }
}

// Writes `c` to a temporary file; returns its path.
std::string WriteTemp(const KvCalibration& c, const std::string& stem) {
  const std::string path = ::testing::TempDir() + "/" + stem + ".safetensors";
  const Status saved = SaveKvCalibration(c, path);
  EXPECT_TRUE(saved.ok()) << saved.message();
  return path;
}

TEST(KvCalibrationFile, RoundTripAndClearErrors) {
  std::mt19937 rng(4);
  const auto x = SyntheticKeys(200, 2, 64, rng);
  KvCalibration c = CalibrationFrom(x, 200, 2, 64, {2, 4});
  c.method = "q2";
  c.model = "synthetic";
  const std::string path = WriteTemp(c, "calib_roundtrip");
  auto loaded = LoadKvCalibration(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->k_offset, c.k_offset);
  EXPECT_EQ(loaded->k_scale, c.k_scale);
  EXPECT_EQ(loaded->codebooks.at(2).k, c.codebooks.at(2).k);
  EXPECT_EQ(loaded->codebooks.at(4).v, c.codebooks.at(4).v);
  EXPECT_EQ(loaded->BitsList(), "2,4");
  EXPECT_EQ(loaded->method, "q2");
  EXPECT_EQ(loaded->num_kv_heads, 2);

  KvShape shape{1, 4, 2, 64};
  EXPECT_TRUE(loaded->CheckShape(shape).ok());
  KvShape other{3, 4, 2, 128};
  const Status mismatch = loaded->CheckShape(other);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.message().find("num_layers 1 (model 3)"), std::string::npos)
      << mismatch.message();
  EXPECT_NE(mismatch.message().find("head_dim 64 (model 128)"), std::string::npos);
  auto missing_bits = loaded->ForBits(3);
  ASSERT_FALSE(missing_bits.ok());
  EXPECT_NE(missing_bits.status().message().find("2,4 bits, not 3"), std::string::npos)
      << missing_bits.status().message();

  EXPECT_FALSE(LoadKvCalibration(path + ".absent").ok());
  // Truncated: the header promises more bytes than the file has.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = path + ".cut";
  std::ofstream(cut, std::ios::binary).write(bytes.data(), bytes.size() / 2);
  EXPECT_FALSE(LoadKvCalibration(cut).ok());
  // Unsorted levels are rejected with the tensor's name.
  KvCalibration bad = c;
  std::swap(bad.codebooks[2].k[0], bad.codebooks[2].k[3]);
  auto unsorted = LoadKvCalibration(WriteTemp(bad, "calib_unsorted"));
  ASSERT_FALSE(unsorted.ok());
  EXPECT_NE(unsorted.status().message().find("nuq2.k.levels"), std::string::npos);

  // The cache: no file, wrong bits, wrong shape are errors naming the cause.
  KvCacheOptions options;
  options.k_type = options.v_type = "kvquant3";
  options.max_tokens = 64;
  auto inv_freq = ops::RopeInvFreq(64, 10000.0f, ops::RopeScaling{});
  ASSERT_TRUE(inv_freq.ok());
  shape.rope_inv_freq = *inv_freq;
  auto no_file = PagedKvCache::Create(shape, options);
  ASSERT_FALSE(no_file.ok());
  EXPECT_NE(no_file.status().message().find("--kv-calibration"), std::string::npos);
  options.calibration_path = path;
  auto no_bits = PagedKvCache::Create(shape, options);
  ASSERT_FALSE(no_bits.ok());
  EXPECT_NE(no_bits.status().message().find("not 3"), std::string::npos)
      << no_bits.status().message();
  options.k_type = options.v_type = "kvquant2";
  EXPECT_TRUE(PagedKvCache::Create(shape, options).ok());
  KvShape two_layers = shape;
  two_layers.num_layers = 2;
  auto wrong_shape = PagedKvCache::Create(two_layers, options);
  ASSERT_FALSE(wrong_shape.ok());
  EXPECT_NE(wrong_shape.status().message().find("num_layers 1 (model 2)"), std::string::npos);
}

TEST(KvQuantCache, PreRopeAttentionMatchesReferenceOnDecodedRopedKeys) {
  std::mt19937 rng(5);
  KvShape shape{1, 6, 2, 64};
  auto inv_freq = ops::RopeInvFreq(64, 10000.0f, ops::RopeScaling{});
  ASSERT_TRUE(inv_freq.ok());
  shape.rope_inv_freq = *inv_freq;
  const int64_t tokens = 150, row = 2 * 64;
  const auto k_pre = SyntheticKeys(tokens, 2, 64, rng);
  const auto v = Normal(static_cast<size_t>(tokens * row), rng);
  std::vector<int32_t> positions(tokens);
  for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>(t);
  std::vector<float> k = k_pre;
  ops::RopeRef(shape.rope_layout, inv_freq->data(), positions.data(), tokens, 2, 64, k.data());
  KvCalibration c = CalibrationFrom(k_pre, tokens, 2, 64, {3});
  c.num_heads = 6;
  // Values get their own codebook (fitted on V).
  NuqFitInput in;
  in.bits = 3;
  in.is_v = true;
  in.n = tokens;
  in.kv_heads = 2;
  in.head_dim = 64;
  in.x = v.data();
  c.codebooks[3].v = *FitNuqLevels(in);
  KvCacheOptions options;
  options.k_type = options.v_type = "kvquant3";
  options.max_tokens = tokens;
  options.num_threads = 2;
  options.calibration_path = WriteTemp(c, "calib_cache");
  auto cache = PagedKvCache::Create(shape, options);
  ASSERT_TRUE(cache.ok()) << cache.status().message();
  ASSERT_TRUE((*cache)->AddSequence(0).ok());
  // Two appends (prefill, then single tokens) as a forward pass would.
  ASSERT_TRUE((*cache)->Append(0, 0, 140, k_pre.data(), k.data(), v.data()).ok());
  for (int64_t t = 140; t < tokens; ++t) {
    ASSERT_TRUE((*cache)->Append(0, 0, 1, &k_pre[t * row], &k[t * row], &v[t * row]).ok());
  }
  const int64_t n = 9;
  const auto q = Normal(static_cast<size_t>(n * 6 * 64), rng);
  std::vector<float> out(q.size()), expected(q.size()), exact(q.size());
  ASSERT_TRUE((*cache)->Attend(0, 0, n, q.data(), 0.125f, out.data()).ok());
  std::vector<float> dk(k.size()), dv(v.size());
  ASSERT_TRUE((*cache)->DecodeLayer(0, 0, dk.data(), dv.data()).ok());
  // The first token is a sink: kept in f16, so it decodes to f16(k_pre).
  for (int64_t i = 0; i < row; ++i) EXPECT_EQ(dk[i], F16ToF32(F32ToF16(k_pre[i])));
  ops::RopeRef(shape.rope_layout, inv_freq->data(), positions.data(), tokens, 2, 64, dk.data());
  AttentionRef(q.data(), dk.data(), dv.data(), n, tokens, 6, 2, 64, 0.125f, expected.data());
  AttentionRef(q.data(), k.data(), v.data(), n, tokens, 6, 2, 64, 0.125f, exact.data());
  double err = 0, norm = 0, quant_err = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    err += std::pow(out[i] - expected[i], 2);
    quant_err += std::pow(out[i] - exact[i], 2);
    norm += std::pow(expected[i], 2);
  }
  // Same keys and values on both sides; the cache's RoPE (ops::Rope, f32
  // angles) vs RopeRef differ by a few f32 ulps of keys up to ~70 (outlier
  // channel 20 + spike 50), i.e. ~1e-5 absolute in scores of size ~10: NMSE
  // of the outputs ~1e-10; 1e-8 leaves margin and fails on any wrong
  // position, head or token (NMSE >~ 1e-3).
  EXPECT_LT(err / norm, 1e-8);
  // And the quantization itself is visible but small at 3 bits.
  EXPECT_GT(quant_err, err);
}

TEST(KvQuantCache, TokenByTokenEqualsPrefill) {
  // Every input is rounded to f16 before encoding (the staging rule) and
  // NUQ rows are per token, so one prefill and token-by-token appends store
  // the same bytes: decoded layers must be equal bit for bit.
  std::mt19937 rng(6);
  KvShape shape{1, 4, 2, 64};
  auto inv_freq = ops::RopeInvFreq(64, 10000.0f, ops::RopeScaling{});
  ASSERT_TRUE(inv_freq.ok());
  shape.rope_inv_freq = *inv_freq;
  const int64_t tokens = 40, row = 2 * 64;
  const auto k = SyntheticKeys(tokens, 2, 64, rng);
  const auto v = Normal(static_cast<size_t>(tokens * row), rng);
  KvCalibration c = CalibrationFrom(k, tokens, 2, 64, {2});
  c.num_heads = 4;
  KvCacheOptions options;
  options.k_type = options.v_type = "kvquant2";
  options.max_tokens = tokens;
  options.calibration_path = WriteTemp(c, "calib_stream");
  auto prefill = PagedKvCache::Create(shape, options);
  auto stepwise = PagedKvCache::Create(shape, options);
  ASSERT_TRUE(prefill.ok() && stepwise.ok());
  ASSERT_TRUE((*prefill)->AddSequence(0).ok() && (*stepwise)->AddSequence(0).ok());
  ASSERT_TRUE((*prefill)->Append(0, 0, tokens, k.data(), k.data(), v.data()).ok());
  for (int64_t t = 0; t < tokens; ++t) {
    ASSERT_TRUE((*stepwise)->Append(0, 0, 1, &k[t * row], &k[t * row], &v[t * row]).ok());
  }
  std::vector<float> ka(k.size()), va(v.size()), kb(k.size()), vb(v.size());
  ASSERT_TRUE((*prefill)->DecodeLayer(0, 0, ka.data(), va.data()).ok());
  ASSERT_TRUE((*stepwise)->DecodeLayer(0, 0, kb.data(), vb.data()).ok());
  EXPECT_EQ(0, std::memcmp(ka.data(), kb.data(), ka.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)));
}

}  // namespace
}  // namespace kvq
