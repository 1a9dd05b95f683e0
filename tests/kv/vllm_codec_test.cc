// vLLM's formats (codec_vllm.cc) and HF's quanto cache (codec_quanto.cc):
// the quantization math on hand-made rows (values chosen so the expected
// codes follow from vLLM's formulas by hand), edge rows, refusals, the
// rotation, and the SIMD kernels against the scalar twin. The registry walk
// (registry_test.cc) runs every name through the generic checks too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
#include "kv/codec_formats.h"
#include "kv/codec_registry.h"
#include "kv/kv_calibration.h"
#include "kv/kv_policy.h"
#include "kv_test_util.h"

namespace kvq {
namespace {

float ScaleAt(const std::vector<uint8_t>& row, size_t at) {
  float s;
  std::memcpy(&s, row.data() + at, sizeof s);
  return s;
}

std::vector<float> RoundTrip(const KvCodec& codec, const std::vector<float>& x) {
  std::vector<uint8_t> row(codec.RowBytes());
  codec.Encode(x.data(), 1, row.data());
  std::vector<float> back(x.size());
  codec.Decode(row.data(), 1, back.data());
  return back;
}

TEST(VllmInt8PerTokenHead, CodesFollowVllmsRounding) {
  const int64_t dim = 16;
  auto codec = MustParse("int8_per_token_head", dim);
  ASSERT_NE(codec, nullptr);
  EXPECT_EQ(codec->RowBytes(), 16u + 4u);
  // absmax 127 -> scale exactly 1: codes are the values rounded half away from zero.
  std::vector<float> x = {127, -63.5, 2.5, -2.5, 0.49f, 0, -127, 1.5, 0, 0, 0, 0, 0, 0, 0, 0};
  std::vector<uint8_t> row(codec->RowBytes());
  codec->Encode(x.data(), 1, row.data());
  const int8_t want[] = {127, -64, 3, -3, 0, 0, -127, 2};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(static_cast<int8_t>(row[i]), want[i]) << i;
  EXPECT_EQ(ScaleAt(row, 16), 1.0f);
  // All zeros: scale is vLLM's floor 1e-6, every code 0, decodes to 0.
  std::vector<float> zeros(dim, 0.0f);
  codec->Encode(zeros.data(), 1, row.data());
  EXPECT_EQ(ScaleAt(row, 16), 1e-6f);
  for (float v : RoundTrip(*codec, zeros)) EXPECT_EQ(v, 0.0f);
  // Huge values stay finite, within half a step (absmax / 254) of the input.
  std::vector<float> huge(dim, 3e38f);
  huge[1] = -1e38f;
  const auto back = RoundTrip(*codec, huge);
  for (int64_t i = 0; i < dim; ++i) {
    EXPECT_TRUE(std::isfinite(back[i]));
    EXPECT_LE(std::fabs(back[i] - huge[i]), 3e38 / 254 * 1.0001) << i;
  }
  // NaN: ignored by the maximum, stored as -128 (Triton's clamp); inf makes
  // the scale inf and the row non-finite.
  std::vector<float> with_nan(dim, 1.0f);
  with_nan[3] = std::numeric_limits<float>::quiet_NaN();
  codec->Encode(with_nan.data(), 1, row.data());
  EXPECT_EQ(static_cast<int8_t>(row[3]), -128);
  EXPECT_EQ(static_cast<int8_t>(row[0]), 127);
  std::vector<float> with_inf(dim, 1.0f);
  with_inf[0] = std::numeric_limits<float>::infinity();
  for (float v : RoundTrip(*codec, with_inf)) EXPECT_FALSE(std::isfinite(v));
}

TEST(VllmFp8PerTokenHead, ScaleAndSaturation) {
  const int64_t dim = 32;
  auto codec = MustParse("fp8_per_token_head", dim);
  ASSERT_NE(codec, nullptr);
  std::mt19937 rng(1);
  std::vector<float> x = Normal(dim, rng);
  x[0] = 448.0f;  // absmax 448 -> scale 1: codes are plain E4M3 casts
  std::vector<uint8_t> row(codec->RowBytes());
  codec->Encode(x.data(), 1, row.data());
  EXPECT_EQ(ScaleAt(row, dim), 1.0f);
  for (int64_t i = 0; i < dim; ++i) {
    EXPECT_EQ(row[i], codec::Fp8EncodeRef(x[i], codec::kE4M3)) << i;
  }
  x[5] = std::numeric_limits<float>::quiet_NaN();
  codec->Encode(x.data(), 1, row.data());
  EXPECT_EQ(row[5], 0xFE) << "NaN clamps to -448 as Triton's clamp does";
}

TEST(VllmFp8Tensor, UncalibratedScaleIsOneAndSaturates) {
  auto codec = MustParse("fp8_e4m3-t1", 16);
  ASSERT_NE(codec, nullptr);
  EXPECT_FALSE(codec->NeedsCalibration());
  EXPECT_EQ(*codec::VllmCodecTensorScale(*codec), 1.0f);
  std::vector<float> x(16, 0.0f);
  x[0] = 500.0f;  // beyond 448: saturates (__NV_SATFINITE)
  x[1] = -std::numeric_limits<float>::infinity();
  x[2] = std::numeric_limits<float>::quiet_NaN();
  x[3] = 0.3f;
  const auto back = RoundTrip(*codec, x);
  EXPECT_EQ(back[0], 448.0f);
  EXPECT_EQ(back[1], -448.0f);
  EXPECT_TRUE(std::isnan(back[2]));
  EXPECT_EQ(back[3], codec::Fp8DecodeRef(codec::Fp8EncodeRef(0.3f, codec::kE4M3), codec::kE4M3));
  auto e5m2 = MustParse("fp8_e5m2-t1", 16);
  ASSERT_NE(e5m2, nullptr);
  EXPECT_EQ(RoundTrip(*e5m2, x)[0], 512.0f);
}

TEST(VllmFp8Tensor, CalibratedScalesComeFromTheFileAndErrorsNameTheCause) {
  auto codec = MustParse("fp8_e4m3-tcal", 16);
  ASSERT_NE(codec, nullptr);
  EXPECT_TRUE(codec->NeedsCalibrationFile());
  KvCalibration c;
  c.source = "test";
  c.num_layers = 2;
  const Status none = codec->SetCalibration(c, 0, 0, false);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("no fp8 scales"), std::string::npos) << none.message();
  c.fp8_k_scale = {0.5f, 0.25f};
  c.fp8_v_scale = {2.0f, 4.0f};
  ASSERT_TRUE(codec->SetCalibration(c, 1, 0, true).ok());
  EXPECT_EQ(*codec::VllmCodecTensorScale(*codec), 4.0f);
  std::vector<float> x(16, 96.0f);
  EXPECT_EQ(RoundTrip(*codec, x)[0], 96.0f);  // 96 / 4 = 24 is exact in E4M3
  x.assign(16, 100.0f);                       // 25: a tie, to even (24)
  EXPECT_EQ(RoundTrip(*codec, x)[0], 96.0f);
  EXPECT_FALSE(codec->SetCalibration(c, 2, 0, false).ok());
  c.fp8_k_scale[0] = 0.0f;
  EXPECT_FALSE(codec->SetCalibration(c, 0, 0, false).ok());
}

TEST(VllmInt4PerTokenHead, RotationSignsAndHadamard) {
  const auto signs = codec::VllmRhtSigns(128);
  ASSERT_EQ(signs.size(), 128u);
  int plus = 0;
  for (float s : signs) {
    ASSERT_TRUE(s == 1.0f || s == -1.0f);
    plus += s > 0;
  }
  EXPECT_GT(plus, 40);  // a fair coin: 64 +- 3 sigma
  EXPECT_LT(plus, 88);
  const auto prefix = codec::VllmRhtSigns(64);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), signs.begin()));
  // The butterfly is H x with H[i][j] = (-1)^popcount(i & j), unnormalized.
  std::mt19937 rng(2);
  const int64_t d = 32;
  std::vector<float> x = Normal(d, rng), y = x;
  codec::VllmHadamard(y.data(), d);
  for (int64_t i = 0; i < d; ++i) {
    double want = 0;
    for (int64_t j = 0; j < d; ++j) want += (__builtin_popcountll(i & j) & 1 ? -1.0 : 1.0) * x[j];
    EXPECT_NEAR(y[i], want, 1e-5 * d) << i;
  }
}

// The signs torch draws for vLLM (bench/vllm_rht_signs.py, run in the peers'
// venv, wrote tests/golden/vllm_rht_signs.txt): kvq's mt19937 reading of
// torch.bernoulli must give the same diagonal at every width.
TEST(VllmInt4PerTokenHead, RotationSignsEqualTorchs) {
  std::ifstream golden(std::string(KVQ_SOURCE_DIR) + "/tests/golden/vllm_rht_signs.txt");
  ASSERT_TRUE(golden) << "tests/golden/vllm_rht_signs.txt missing";
  std::string line;
  int widths = 0;
  while (std::getline(golden, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    int64_t dim = 0;
    std::string want;
    ASSERT_TRUE(fields >> dim >> want) << line;
    ASSERT_EQ(static_cast<int64_t>(want.size()), dim) << line;
    const auto signs = codec::VllmRhtSigns(dim);
    std::string got;
    for (float s : signs) got += s > 0 ? '+' : '-';
    EXPECT_EQ(got, want) << "dim " << dim;
    ++widths;
  }
  EXPECT_EQ(widths, 5);
}

TEST(VllmInt4PerTokenHead, LayoutBoundAndRefusals) {
  const int64_t dim = 64;
  auto codec = MustParse("int4_per_token_head", dim, CodecPath::kReference);
  ASSERT_NE(codec, nullptr);
  EXPECT_EQ(codec->RowBytes(), 32u + 4u);
  // The rotation is the cache's (KvCodec::RotationMatrix): M = H D / sqrt(d),
  // orthonormal, and sqrt(d) M x is the butterfly's H D x.
  const float* m = codec->RotationMatrix();
  ASSERT_NE(m, nullptr);
  for (int64_t i = 0; i < dim; ++i) {
    for (int64_t j = 0; j < dim; ++j) {
      double dot = 0;
      for (int64_t k = 0; k < dim; ++k) dot += double{m[i * dim + k]} * m[j * dim + k];
      ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-6) << i << " " << j;
    }
  }
  const auto signs = codec::VllmRhtSigns(dim);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> x = Normal(dim, rng, trial % 2 ? 0.01f : 30.0f);
    std::vector<float> z(dim), y(dim);  // z = M x (what the cache stores), y = H D x
    for (int64_t i = 0; i < dim; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < dim; ++j) sum += double{m[i * dim + j]} * x[j];
      z[i] = static_cast<float>(sum);
      y[i] = x[i] * signs[i];
    }
    codec::VllmHadamard(y.data(), dim);
    float norm = 0;
    for (float v : y) norm = std::max(norm, std::fabs(v));
    for (int64_t i = 0; i < dim; ++i) ASSERT_NEAR(z[i] * 8.0f, y[i], 1e-5f * norm) << i;
    std::vector<uint8_t> row(codec->RowBytes());
    codec->Encode(z.data(), 1, row.data());
    // The rotated row's range bounds the error: every rotated coordinate is
    // within one step s (rounding of the value and of the zero-point, and
    // the clamp at the ends), so ||x - x^|| = ||z - z^|| = ||e|| / sqrt(d) <= s.
    const float lo = *std::min_element(y.begin(), y.end());
    const float hi = *std::max_element(y.begin(), y.end());
    const double step = (hi - lo) / 15.0;
    uint32_t bits;
    std::memcpy(&bits, row.data() + dim / 2, 4);
    const float zp = static_cast<float>(bits & 0xF);
    // zp from the butterfly's row: the cache's y differs from it by rounding
    // only, which moves -lo / s by far less than the distance to a tie here.
    EXPECT_EQ(zp, std::clamp(std::round(-lo / static_cast<float>(step)), 0.0f, 15.0f)) << trial;
    const auto back = RoundTrip(*codec, z);
    double err = 0;
    for (int64_t i = 0; i < dim; ++i) err += (back[i] - z[i]) * (back[i] - z[i]);
    EXPECT_LE(std::sqrt(err), step * (1 + 1e-4)) << trial;
  }
  for (int64_t bad : {96, 48, 6}) {
    auto refused = ParseKvCodec("int4_per_token_head", bad);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("power of two"), std::string::npos);
  }
}

class VllmSimdTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(VllmSimdTest);

// SIMD against the scalar twin with more query heads than one pass holds
// (the int4 path accumulates in the rotated domain in chunks of 8 heads),
// on every SIMD target (int4's nibbles are unpacked per vector width).
TEST_P(VllmSimdTest, KernelsMatchTheScalarTwin) {
  std::mt19937 rng(5);
  for (const char* name : {"int8_per_token_head", "fp8_per_token_head", "int4_per_token_head",
                           "fp8_e4m3-t1", "fp8_e5m2-t1"}) {
    for (int64_t dim : {64, 128}) {
      auto fast = MustParse(name, dim, CodecPath::kSimd);
      auto ref = MustParse(name, dim, CodecPath::kReference);
      ASSERT_TRUE(fast && ref);
      const int64_t n = 37, group = 11;
      const auto x = Normal(static_cast<size_t>(n * dim), rng, 3.0f);
      std::vector<uint8_t> rows(n * fast->RowBytes()), rows_ref(rows.size());
      fast->Encode(x.data(), n, rows.data());
      ref->Encode(x.data(), n, rows_ref.data());
      ASSERT_EQ(rows, rows_ref) << name;
      const auto q = Normal(static_cast<size_t>(group * dim), rng);
      std::vector<float> s(group * n), s_ref(group * n);
      fast->Scores(rows.data(), n, q.data(), group, 0.125f, s.data(), n);
      ref->Scores(rows.data(), n, q.data(), group, 0.125f, s_ref.data(), n);
      std::vector<float> p = Normal(static_cast<size_t>(group * n), rng);
      std::vector<float> acc(group * dim, 0.5f), acc_ref = acc;
      fast->AccumulateV(rows.data(), n, p.data(), group, n, acc.data());
      ref->AccumulateV(rows.data(), n, p.data(), group, n, acc_ref.data());
      // f32 sums of dim (and for int4 a 2 log2(dim)-deep transform) terms
      // against double: relative 1e-4 of the magnitudes is ample and still
      // catches a wrong sign, code or scale.
      EXPECT_LT(Nmse(s, s_ref), 1e-8) << name << " " << dim;
      EXPECT_LT(Nmse(acc, acc_ref), 1e-8) << name << " " << dim;
    }
  }
}

TEST(HfQuanto, NamesSchemesAndStreaming) {
  auto codec = MustParse("quanto4-g64-res128", 64);
  ASSERT_NE(codec, nullptr);
  EXPECT_EQ(codec->Name(), "quanto4-g64-res128");
  EXPECT_EQ(codec->RowBytes(), MustParse("int4-g64-asym", 64)->RowBytes());
  EXPECT_EQ(codec->streaming().keep_tokens, 0);
  EXPECT_EQ(codec->streaming().flush_tokens, 128);
  EXPECT_EQ(MustParse("quanto2", 64)->Name(), "quanto2-g64-res128");
  auto channel = MustParse("quanto4-c64-res128", 64);
  ASSERT_NE(channel, nullptr);
  EXPECT_EQ(channel->streaming().tile_tokens, 64);
  EXPECT_EQ(channel->streaming().flush_tokens, 128);
  EXPECT_EQ(MustParse("quanto4-g64-res0", 64)->streaming().flush_tokens, 1);
  for (const char* bad :
       {"quanto8", "quanto4-g64-r16", "quanto4-c64-res100", "quanto4-g48", "quanto4-foo"}) {
    EXPECT_FALSE(ParseKvCodec(bad, 64).ok()) << bad;
  }
  EXPECT_FALSE(ParseKvCodec("quanto4-g128", 64).ok()) << "a group larger than head_dim";
  auto scheme = ExpandKvScheme("hf-quanto-int4");
  ASSERT_TRUE(scheme.ok());
  EXPECT_EQ(scheme->k_type, "quanto4-g64-res128");
  EXPECT_EQ(scheme->v_type, "quanto4-g64-res128");
  // The same codes as int4-g64-asym: HF's quantizer is kvq's asym one.
  std::mt19937 rng(7);
  const auto x = Normal(64 * 3, rng);
  auto plain = MustParse("int4-g64-asym", 64);
  std::vector<uint8_t> a(3 * codec->RowBytes()), b(a.size());
  codec->Encode(x.data(), 3, a.data());
  plain->Encode(x.data(), 3, b.data());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace kvq
