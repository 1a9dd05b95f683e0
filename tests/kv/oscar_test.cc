// OSCAR (oscar-int2, scheme oscar2) and QuaRot-INT2 (quarot-int2), codec_oscar.cc: the fitted
// rotations (orthogonal, equal variance per rotated coordinate), the codes'
// error bounds, the fitted rotation beating Hadamard on planted correlated
// outlier channels, the cache's per-(layer, KV head) rotation hook against
// AttentionRef, exact planner bytes, and calibration files of format 1 and 2.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "io/safetensors.h"
#include "kv/attention_ref.h"
#include "kv/codec_int_scores.h"
#include "kv/codec_registry.h"
#include "kv/kv_calibration.h"
#include "kv/kv_factory.h"
#include "kv/kv_test_util.h"
#include "kv/paged_cache.h"
#include "test_util.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

// A random symmetric positive semi-definite matrix A Aᵀ / n, A [dim, n].
std::vector<double> RandomCovariance(int64_t dim, std::mt19937& rng) {
  const std::vector<float> a = Normal(static_cast<size_t>(dim * 2 * dim), rng);
  std::vector<double> cov(static_cast<size_t>(dim * dim), 0.0);
  for (int64_t i = 0; i < dim; ++i) {
    for (int64_t j = 0; j < dim; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < 2 * dim; ++k) sum += double{a[i * 2 * dim + k]} * a[j * 2 * dim + k];
      cov[i * dim + j] = sum / static_cast<double>(2 * dim);
    }
  }
  return cov;
}

// y = m x (row-major m [dim, dim]) in double.
std::vector<float> Apply(const std::vector<float>& m, const float* x, int64_t dim, bool transpose) {
  std::vector<float> y(static_cast<size_t>(dim));
  for (int64_t i = 0; i < dim; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < dim; ++j) {
      sum += double{transpose ? m[j * dim + i] : m[i * dim + j]} * x[j];
    }
    y[i] = static_cast<float>(sum);
  }
  return y;
}

TEST(OscarRotation, EigenDecompositionReconstructsTheMatrix) {
  std::mt19937 rng(1);
  for (int64_t dim : {2, 17, 64}) {
    const std::vector<double> a = RandomCovariance(dim, rng);
    std::vector<double> values, u;
    SymmetricEigen(a, dim, &values, &u);
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < dim; ++i) {
      if (i > 0) {
        EXPECT_LE(values[i - 1], values[i]) << "ascending";
      }
      for (int64_t j = 0; j < dim; ++j) {
        double sum = 0;
        for (int64_t k = 0; k < dim; ++k) sum += u[i * dim + k] * values[k] * u[j * dim + k];
        worst = std::max(worst, std::fabs(sum - a[i * dim + j]));
        scale = std::max(scale, std::fabs(a[i * dim + j]));
      }
    }
    // Jacobi in double: backward error ~ dim * 2^-52 * |A|; 1e-10 is far
    // above that and far below any real mistake (O(|A|)).
    EXPECT_LE(worst, 1e-10 * scale) << dim;
  }
}

// The fitted M is orthogonal, and M Σ Mᵀ has every diagonal entry equal to
// tr(Σ) / d: U decorrelates and the Hadamard matrix spreads each eigen-
// direction evenly, which is the property the codes benefit from.
TEST(OscarRotation, FittedMatricesAreOrthogonalAndEqualizeVariance) {
  std::mt19937 rng(2);
  for (int64_t dim : {32, 64, 128}) {
    const std::vector<double> cov = RandomCovariance(dim, rng);
    auto m = FitOscarRotation(cov, dim);
    ASSERT_TRUE(m.ok()) << m.status().message();
    // f32 entries of an exactly orthogonal matrix: |M Mᵀ - I| ~ sqrt(d) 2^-24.
    EXPECT_LE(OrthogonalityError(m->data(), dim), 1e-5) << dim;
    double trace = 0;
    for (int64_t i = 0; i < dim; ++i) trace += cov[i * dim + i];
    for (int64_t i = 0; i < dim; ++i) {
      double var = 0;  // (M Σ Mᵀ)_ii
      for (int64_t a = 0; a < dim; ++a) {
        for (int64_t b = 0; b < dim; ++b)
          var += double{(*m)[i * dim + a]} * cov[a * dim + b] * (*m)[i * dim + b];
      }
      // f32 rounding of M: relative error ~1e-6 per entry.
      EXPECT_NEAR(var, trace / static_cast<double>(dim), 1e-4 * trace / static_cast<double>(dim))
          << "dim " << dim << " coordinate " << i;
    }
  }
  EXPECT_FALSE(FitOscarRotation(std::vector<double>(48 * 48, 0.0), 48).ok());  // not 2^k
  std::vector<double> nan_cov(64 * 64, 0.0);
  nan_cov[3] = std::nan("");
  EXPECT_FALSE(FitOscarRotation(nan_cov, 64).ok());
}

struct CodeCase {
  const char* name;
  int64_t group;  // 0: min(128, dim)
  int clip;
};

// x^ = u s + lo with u = clamp(round((x - lo) / s), 0, 3), lo = f16(r min),
// s = f16(r (max - min) / 3): inside [lo, lo + 3 s] the error is at most
// s / 2, outside it is the distance to the nearer end; plus f32 rounding of
// u s + lo (a few ulps of the larger of |x|, |lo|, 3 s).
TEST(OscarCodec, CodesStayWithinTheirErrorBound) {
  std::mt19937 rng(3);
  for (int64_t dim : {32, 64, 128}) {
    for (const CodeCase& c :
         {CodeCase{"quarot-int2", 0, 100}, CodeCase{"quarot-int2-g32-clip90", 32, 90},
          CodeCase{"oscar-int2-clip80", 0, 80}, CodeCase{"oscar-int2-g64", 64, 100}}) {
      if (c.group > dim) continue;
      SCOPED_TRACE(std::string(c.name) + " dim " + std::to_string(dim));
      auto simd = MustParse(c.name, dim, CodecPath::kSimd);
      auto ref = MustParse(c.name, dim, CodecPath::kReference);
      ASSERT_TRUE(simd && ref);
      const int64_t n = 37, group = c.group > 0 ? c.group : std::min<int64_t>(128, dim);
      std::vector<float> x = Normal(static_cast<size_t>(n * dim), rng, 3.0f);
      x[5] = 40.0f;  // an outlier the clipping cuts
      x[static_cast<size_t>(dim + 1)] = -25.0f;
      ASSERT_EQ(simd->RowBytes(), static_cast<size_t>(dim / 4 + 4 * (dim / group)));
      std::vector<uint8_t> rows(n * simd->RowBytes()), rows_ref(rows.size());
      simd->Encode(x.data(), n, rows.data());
      ref->Encode(x.data(), n, rows_ref.data());
      EXPECT_EQ(rows, rows_ref);
      std::vector<float> y(x.size()), y_ref(x.size());
      simd->Decode(rows.data(), n, y.data());
      ref->Decode(rows.data(), n, y_ref.data());
      EXPECT_EQ(y, y_ref);
      const float r = static_cast<float>(c.clip) / 100.0f;
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t g0 = 0; g0 < dim; g0 += group) {
          const float* xg = &x[static_cast<size_t>(t * dim + g0)];
          float lo_raw = xg[0], hi_raw = xg[0];
          for (int64_t i = 1; i < group; ++i) {
            lo_raw = std::min(lo_raw, xg[i]);
            hi_raw = std::max(hi_raw, xg[i]);
          }
          const float lo = F16ToF32(F32ToF16(lo_raw * r));
          const float s = F16ToF32(F32ToF16((hi_raw * r - lo_raw * r) / 3.0f));
          const float hi = lo + 3.0f * s;
          for (int64_t i = 0; i < group; ++i) {
            const float v = xg[i], got = y[static_cast<size_t>(t * dim + g0 + i)];
            const double outside = v < lo ? lo - v : (v > hi ? v - hi : 0.0);
            const double slack = 4 * kEps * (std::fabs(v) + std::fabs(lo) + 3 * s);
            EXPECT_LE(std::fabs(got - v), outside + s / 2 + slack) << "t " << t << " i " << g0 + i;
          }
        }
      }
    }
  }
}

// The calibration file for `rotations` [layers, kv_heads, d, d] (K and V),
// with the NUQ part a format needs (unit channel ranges, 2-bit levels).
KvCalibration MakeCalibration(int64_t layers, int64_t heads, int64_t kv_heads, int64_t dim,
                              const std::vector<float>& k_rot, const std::vector<float>& v_rot) {
  KvCalibration c;
  c.source = "test";
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = dim;
  c.k_offset.assign(static_cast<size_t>(layers * kv_heads * dim), 0.0f);
  c.k_scale.assign(c.k_offset.size(), 1.0f);
  for (int64_t l = 0; l < layers; ++l) {
    for (float level : {-1.0f, -0.3f, 0.3f, 1.0f}) {
      c.codebooks[2].k.push_back(level);
      c.codebooks[2].v.push_back(level);
    }
  }
  c.rotation_objective = "test";
  c.k_rotation = k_rot;
  c.v_rotation = v_rot;
  return c;
}

// Rows with 4 planted outlier channels driven by one latent (outlier
// channels of real keys move together) on N(0, 1) noise. A data-free
// Hadamard H D maps that direction onto coordinates unevenly (sums of four
// +-1 terms: some coordinates get 4x the latent's share, some none), so a
// few rotated coordinates carry most of the energy and set every row's
// range; the fitted rotation gives each coordinate the same variance
// (FittedMatricesAreOrthogonalAndEqualizeVariance), so its rows' ranges are
// smaller and the INT2 step with them.
TEST(OscarCodec, FittedRotationBeatsHadamardOnPlantedOutlierChannels) {
  std::mt19937 rng(4);
  const int64_t dim = 64, n = 4000;
  std::vector<float> x = Normal(static_cast<size_t>(n * dim), rng);
  const int64_t channels[4] = {3, 17, 40, 58};
  const float signs[4] = {1, -1, 1, 1};
  std::normal_distribution<float> latent(0.0f, 1.0f);
  for (int64_t t = 0; t < n; ++t) {
    const float z = 2.0f + latent(rng);  // a mean, as outlier channels have
    for (int c = 0; c < 4; ++c)
      x[static_cast<size_t>(t * dim + channels[c])] += 8.0f * signs[c] * z;
  }
  std::vector<double> cov(static_cast<size_t>(dim * dim), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t a = 0; a < dim; ++a) {
      for (int64_t b = 0; b < dim; ++b)
        cov[a * dim + b] += double{x[t * dim + a]} * x[t * dim + b] / n;
    }
  }
  auto fitted = FitOscarRotation(cov, dim);
  ASSERT_TRUE(fitted.ok());
  const KvCalibration calibration = MakeCalibration(1, 1, 1, dim, *fitted, *fitted);
  auto quarot = MustParse("quarot-int2", dim);
  auto oscar = MustParse("oscar-int2", dim);
  ASSERT_TRUE(quarot && oscar);
  ASSERT_TRUE(oscar->SetCalibration(calibration, 0, 0, false).ok());
  auto mse = [&](const KvCodec& codec) {
    const std::vector<float> m(codec.RotationMatrix(), codec.RotationMatrix() + dim * dim);
    std::vector<uint8_t> row(codec.RowBytes());
    std::vector<float> decoded(static_cast<size_t>(dim));
    double err = 0;
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<float> y = Apply(m, &x[t * dim], dim, false);
      codec.Encode(y.data(), 1, row.data());
      codec.Decode(row.data(), 1, decoded.data());
      const std::vector<float> back = Apply(m, decoded.data(), dim, true);
      for (int64_t i = 0; i < dim; ++i) err += std::pow(back[i] - x[t * dim + i], 2.0);
    }
    return err / static_cast<double>(n * dim);
  };
  const double hadamard = mse(*quarot), calibrated = mse(*oscar);
  std::printf("planted outliers, INT2 MSE per value: Hadamard %.4f, fitted %.4f\n", hadamard,
              calibrated);
  // Measured ratio ~0.6; 0.85 still fails if the fit brings no real gain
  // (the two are equal in distribution only when the channels are independent).
  EXPECT_LT(calibrated, 0.85 * hadamard);
}

// Different random rotations per (layer, K/V, KV head), so a head or side
// mixed up in the cache shows. An oscar-int2 cache (clip 100: plain int2 codes)
// must equal an int2-g64-asym cache fed M_k(g) k and M_v(g) v per KV head g,
// queried with M_k(g) q per query head of g and its output mapped back by
// M_v(g)ᵀ: the codes are the same bytes (its encoder is int2's at clip 100), and
// the rotations here run in double with f32 rounding as the cache's do, so
// the only difference allowed is f32 rounding of the output (1e-12).
TEST(OscarCodec, CacheRotatesEveryKvHeadByItsOwnMatrices) {
  std::mt19937 rng(5);
  const KvShape shape{2, 8, 2, 64};
  const int64_t dim = 64, layers = 2, kv = 2, heads = 8, group = 4;
  std::vector<float> k_rot, v_rot;
  for (int64_t i = 0; i < layers * kv * 2; ++i) {
    auto m = FitOscarRotation(RandomCovariance(dim, rng), dim);
    ASSERT_TRUE(m.ok());
    std::vector<float>& dst = i % 2 == 0 ? k_rot : v_rot;
    dst.insert(dst.end(), m->begin(), m->end());
  }
  const std::string path = test_util::TestPath("oscar_test", "rot.safetensors");
  ASSERT_TRUE(SaveKvCalibration(MakeCalibration(layers, heads, kv, dim, k_rot, v_rot), path).ok());
  auto matrix = [&](const std::vector<float>& all, int64_t l, int64_t g) {
    return std::vector<float>(all.begin() + (l * kv + g) * dim * dim,
                              all.begin() + (l * kv + g + 1) * dim * dim);
  };
  // rows [count, row_heads, dim] of `all`'s matrices of layer l, in place.
  auto rotate = [&](const std::vector<float>& all, int64_t l, std::vector<float>& x,
                    int64_t row_heads, int64_t per_matrix, bool transpose) {
    for (size_t r = 0; r < x.size() / dim; ++r) {
      const auto m = matrix(all, l, static_cast<int64_t>(r) % row_heads / per_matrix);
      const auto y = Apply(m, &x[r * dim], dim, transpose);
      std::copy(y.begin(), y.end(), x.begin() + static_cast<int64_t>(r) * dim);
    }
  };
  for (const char* suffix : {"", "-r16-s2"}) {
    SCOPED_TRACE(suffix);
    KvCacheOptions options;
    options.max_tokens = 128;
    options.num_threads = 2;
    options.k_type = options.v_type = std::string("oscar-int2") + suffix;
    options.calibration_path = path;
    auto oscar = MakeKvCache(shape, options);
    options.k_type = options.v_type = std::string("int2-g64-asym") + suffix;
    auto plain = MakeKvCache(shape, options);
    ASSERT_TRUE(oscar.ok() && plain.ok()) << oscar.status().message();
    ASSERT_TRUE((*oscar)->AddSequence(0).ok() && (*plain)->AddSequence(0).ok());
    for (int64_t n : {45, 1, 20}) {
      for (int64_t l = 0; l < layers; ++l) {
        auto k = Normal(static_cast<size_t>(n * kv * dim), rng);
        auto v = Normal(k.size(), rng);
        ASSERT_TRUE((*oscar)->Append(0, l, n, k.data(), k.data(), v.data()).ok());
        rotate(k_rot, l, k, kv, 1, false);
        rotate(v_rot, l, v, kv, 1, false);
        ASSERT_TRUE((*plain)->Append(0, l, n, k.data(), k.data(), v.data()).ok());
      }
      for (int64_t l = 0; l < layers; ++l) {
        auto q = Normal(static_cast<size_t>(n * heads * dim), rng);
        std::vector<float> out(q.size()), expected(q.size());
        ASSERT_TRUE((*oscar)->Attend(0, l, n, q.data(), 0.125f, out.data()).ok());
        rotate(k_rot, l, q, heads, group, false);
        ASSERT_TRUE((*plain)->Attend(0, l, n, q.data(), 0.125f, expected.data()).ok());
        rotate(v_rot, l, expected, heads, group, true);
        EXPECT_LE(Nmse(out, expected), 1e-12) << "layer " << l << " n " << n;
      }
    }
  }
  fs::remove(path);
}

// Every byte kvq plan prints comes from ComputeKvLayout: rows of int2-g64-
// asym (16 code bytes + f16 scale + f16 min at head_dim 64), the f16 sink
// and window rows per sequence, and each codec's f32 rotation as side data.
TEST(OscarCodec, PlannerCountsRowsWindowsAndRotationsExactly) {
  const KvShape shape{3, 9, 3, 64};
  for (const char* scheme : {"oscar2", "quarot2"}) {
    KvCacheOptions options;
    options.k_type = options.v_type = scheme;
    options.max_tokens = 1024;
    auto layout = ComputeKvLayout(shape, options);
    ASSERT_TRUE(layout.ok()) << layout.status().message();
    EXPECT_EQ(layout->k_row_bytes, 20u);
    EXPECT_EQ(layout->v_row_bytes, 20u);
    EXPECT_EQ(layout->block_bytes, size_t{3 * 3 * (20 + 20) * 16});
    // layers x K/V x KV heads x (256 window + 1 being flushed + 64 sinks) f16 rows
    EXPECT_EQ(layout->staging_bytes, size_t{3 * 2 * 3 * (256 + 1 + 64) * 128});
    EXPECT_EQ(layout->codec_side_bytes, size_t{3 * 3 * 2 * 64 * 64 * 4});
  }
}

TEST(OscarCalibration, FormatOneFilesStillLoadAndFormatTwoRoundTrips) {
  const int64_t layers = 1, kv = 1, dim = 32;
  // A file as kvq wrote them before the rotations (format 1).
  const std::string v1 = test_util::TestPath("oscar_test", "v1.safetensors");
  {
    SafetensorsWriter w;
    w.SetMetadata("format", "kvq-kvquant-calibration/1");
    for (const char* key : {"num_layers", "num_kv_heads"}) w.SetMetadata(key, "1");
    w.SetMetadata("num_heads", "2");
    w.SetMetadata("head_dim", "32");
    w.SetMetadata("bits", "2");
    w.SetMetadata("tokens", "100");
    w.SetMetadata("outlier_percent", "1");
    w.SetMetadata("method", "q2");
    w.SetMetadata("qnorm", "0");
    w.SetMetadata("model", "old");
    const std::vector<float> zeros(32, 0.0f), ones(32, 1.0f), levels{-1, -0.3f, 0.3f, 1};
    ASSERT_TRUE(w.AddTensor("k.channel_offset", DType::kF32, {1, 1, 32}, zeros.data(), 128).ok());
    ASSERT_TRUE(w.AddTensor("k.channel_scale", DType::kF32, {1, 1, 32}, ones.data(), 128).ok());
    ASSERT_TRUE(w.AddTensor("nuq2.k.levels", DType::kF32, {1, 4}, levels.data(), 16).ok());
    ASSERT_TRUE(w.AddTensor("nuq2.v.levels", DType::kF32, {1, 4}, levels.data(), 16).ok());
    ASSERT_TRUE(w.Write(v1).ok());
  }
  auto old = LoadKvCalibration(v1);
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_EQ(old->format_version, 1);
  EXPECT_TRUE(old->rotation_objective.empty());
  EXPECT_TRUE(old->k_rotation.empty());
  const KvShape shape{layers, 2, kv, dim};
  KvCacheOptions options;
  options.max_tokens = 32;
  options.calibration_path = v1;
  options.k_type = "nuq2-k-o1";
  options.v_type = "nuq2-v-o1";
  EXPECT_TRUE(MakeKvCache(shape, options).ok());  // the NUQ part serves as before
  options.k_type = options.v_type = "oscar2";
  auto no_rotation = MakeKvCache(shape, options);
  ASSERT_FALSE(no_rotation.ok());
  EXPECT_NE(no_rotation.status().message().find("no OSCAR rotations"), std::string::npos)
      << no_rotation.status().message();

  std::mt19937 rng(6);
  auto m = FitOscarRotation(RandomCovariance(dim, rng), dim);
  ASSERT_TRUE(m.ok());
  const std::string v2 = test_util::TestPath("oscar_test", "v2.safetensors");
  KvCalibration c = MakeCalibration(layers, 2, kv, dim, *m, *m);
  ASSERT_TRUE(SaveKvCalibration(c, v2).ok());
  auto loaded = LoadKvCalibration(v2);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->format_version, 2);
  EXPECT_EQ(loaded->rotation_objective, "test");
  EXPECT_EQ(loaded->k_rotation, *m);
  options.calibration_path = v2;
  EXPECT_TRUE(MakeKvCache(shape, options).ok());

  c.v_rotation[0] += 0.5f;  // no longer orthogonal: refused with the tensor's name
  ASSERT_TRUE(SaveKvCalibration(c, v2).ok());
  auto bad = LoadKvCalibration(v2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("oscar.v.rotation"), std::string::npos)
      << bad.status().message();
  fs::remove(v1);
  fs::remove(v2);
}

TEST(OscarCodec, NamesParseAndBadOptionsAreErrors) {
  for (const char* bad :
       {"oscar-int2-g48", "oscar-int2-clip101", "oscar-int2-clip40", "quarot-int2-g64-g64",
        "oscar-int2-x", "oscar-int3", "oscar", "quarot2-int2"}) {
    EXPECT_FALSE(ParseKvCodecSpec(bad).ok()) << bad;
  }
  EXPECT_FALSE(ParseKvCodec("quarot-int2", 48).ok());       // not a power of two
  EXPECT_FALSE(ParseKvCodec("quarot-int2-g128", 64).ok());  // group larger than the row
  auto spec = ParseKvCodecSpec("quarot-int2-s64-clip96-r256");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->Name(), "quarot-int2-clip96-r256-s64");
  EXPECT_DOUBLE_EQ(*spec->ExactBits(128), 2.25);
  EXPECT_DOUBLE_EQ(*spec->ExactBits(64), 2.5);
}

}  // namespace
}  // namespace kvq
