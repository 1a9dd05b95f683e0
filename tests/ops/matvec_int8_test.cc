// The integer-dot matvec against its scalar twin on every compiled SIMD
// target (AVX3_DL included, as matvec_int8.cc builds it), and the
// activation quantizers on hand-worked blocks (tests/conformance compares
// them with ggml's own).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1
#endif

#include "ops/matvec_int8.h"

#include <cmath>
#include <limits>
#include <string>

#include "ops/matmul.h"
#include "ops/matvec.h"
#include "ops_test_util.h"

namespace kvq::ops {
namespace {

using opstest::kEps;
using opstest::kTinyAbs;

class MatvecInt8Test : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(MatvecInt8Test);

const WeightType kIntTypes[] = {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_1,
                                WeightType::kQ5_0, WeightType::kQ5_1, WeightType::kIQ4_NL,
                                WeightType::kQ2_K, WeightType::kQ3_K, WeightType::kQ4_K,
                                WeightType::kQ5_K, WeightType::kQ6_K};

// Random block bytes; Q8_0 (not among MakeRandomBlocks' types) gets random
// quants and scales the same way.
opstest::TestWeight RandomWeight(std::mt19937& rng, WeightType type, int64_t rows, int64_t cols,
                                 float scale) {
  if (type != WeightType::kQ8_0) return opstest::MakeRandomBlocks(rng, type, rows, cols, scale);
  opstest::TestWeight w{type, rows, cols, {}, {}};
  w.bytes.resize(static_cast<size_t>(rows * RowBytes(type, cols)));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : w.bytes) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> dist(-scale, scale);
  auto* blocks = reinterpret_cast<BlockQ8_0*>(w.bytes.data());
  for (int64_t b = 0; b < rows * cols / kQ8_0BlockSize; ++b) blocks[b].d = F32ToF16(dist(rng));
  return w;
}

// Kernel vs twin. Both form the same exact integer dot products and the
// same f32 scale products (d_w * d_x, m_w * s_x, dmin_w * d_x); they differ
// only in how the f32 terms are summed: the kernel multiplies each of the 8
// int32 lanes of a block by its scale product (one rounding each; the
// lanes are exact in f32, |lane| < 2^24) and adds them in vector lanes,
// then across lanes; the twin sums exact products in double and rounds
// once. With at most cols / 4 + cols / 32 + 8 terms on any path, the
// standard summation bound |error| <= gamma_k * sum|term| holds with
// k = cols / 2 + 16, where sum|term| <= abs_terms (MatvecInt8Ref). The
// absolute part covers a rounding in the subnormal range per operation.
void ExpectKernelNearTwin(const opstest::TestWeight& w, const std::vector<float>& x, int64_t n,
                          int threads, const std::string& what) {
  const int64_t act_bytes = Int8ActRowBytes(w.type, w.cols);
  std::vector<uint8_t> acts(static_cast<size_t>(n * act_bytes));
  QuantizeActs(w.type, x.data(), n, w.cols, acts.data());
  std::vector<float> y(static_cast<size_t>(n * w.rows), std::nanf(""));
  ThreadPool pool(threads);
  MatvecInt8(w.view(), acts.data(), n, y.data(), pool);
  std::vector<float> ref(static_cast<size_t>(w.rows));
  std::vector<double> abs_terms(static_cast<size_t>(w.rows));
  const double k = static_cast<double>(w.cols / 2 + 16);
  for (int64_t t = 0; t < n; ++t) {
    MatvecInt8Ref(w.view(), acts.data() + t * act_bytes, ref.data(), abs_terms.data());
    for (int64_t r = 0; r < w.rows; ++r) {
      const double bound = k * kEps / (1.0 - k * kEps) * abs_terms[r] + 4.0 * k * kTinyAbs;
      ASSERT_NEAR(y[t * w.rows + r], ref[r], bound)
          << WeightTypeName(w.type) << " [" << w.rows << ", " << w.cols << "] token " << t
          << " row " << r << " threads " << threads << " " << what;
    }
  }
}

TEST_P(MatvecInt8Test, RandomShapesAllTypes) {
  std::mt19937 rng(2024);
  for (WeightType type : kIntTypes) {
    const int64_t bs = BlockSize(type);
    for (int64_t rows : {1, 3, 4, 5, 17, 70}) {
      for (int64_t blocks : {1, 2, 3, 7, 28}) {
        const int64_t cols = blocks * bs;
        if (rows * cols > 70 * 28 * 32 && bs == kQKBlock && blocks > 3) continue;
        const auto w = RandomWeight(rng, type, rows, cols, 0.5f);
        for (int64_t n : {1, 3}) {
          const std::vector<float> x = opstest::RandomVector(rng, n * cols, 2.0f);
          for (int threads : {1, 2}) ExpectKernelNearTwin(w, x, n, threads, "random");
        }
      }
    }
  }
}

// Rows with a block of weights set to zero (all-zero quants and scales)
// and x with zero, huge, tiny and subnormal blocks.
TEST_P(MatvecInt8Test, EdgeValues) {
  std::mt19937 rng(77);
  for (WeightType type : kIntTypes) {
    const int64_t cols = 3 * BlockSize(type), rows = 7;
    auto w = RandomWeight(rng, type, rows, cols, 1.0f);
    // Row 2: all bytes zero (d = 0: an all-zero block of every type).
    std::fill(w.bytes.begin() + 2 * RowBytes(type, cols),
              w.bytes.begin() + 3 * RowBytes(type, cols), uint8_t{0});
    // Q8_0 stores d = amax / 127 as f16, which caps amax near 65504 * 127
    // (beyond it d is inf, as in ggml); Q8_1's s = d * sum(q) (up to
    // 32 amax) caps it at 65504 / 32; Q8_K's d is f32.
    const ActQuant aq = Int8ActQuant(type);
    const float huge = aq == ActQuant::kQ8_K ? 1.0e30f : aq == ActQuant::kQ8_1 ? 2.0e3f : 8.0e6f;
    const std::vector<std::pair<const char*, float>> scales = {{"zero", 0.0f},
                                                               {"unit", 1.0f},
                                                               {"huge", huge},
                                                               {"tiny", 1.0e-30f},
                                                               {"subnormal", 1.0e-40f}};
    for (const auto& [name, scale] : scales) {
      std::vector<float> x = opstest::RandomVector(rng, cols, 1.0f);
      for (float& v : x) v *= scale;
      x[5] = scale;  // the block's maximum magnitude, exactly
      ExpectKernelNearTwin(w, x, 1, 1, name);
    }
    // Every x at the same magnitude: all quants +-127.
    std::vector<float> x(static_cast<size_t>(cols));
    for (int64_t i = 0; i < cols; ++i) x[i] = i % 3 == 0 ? -3.0f : 3.0f;
    ExpectKernelNearTwin(w, x, 1, 2, "max quants");
  }
}

// Exact inputs: power-of-two scales and integer activations make every f32
// term and sum exact, so the kernel must equal the twin bit for bit
// (catches a dropped block or lane a tolerance could hide).
TEST_P(MatvecInt8Test, ExactWhenTermsAreExact) {
  std::mt19937 rng(3);
  for (WeightType type : kIntTypes) {
    const int64_t cols = 4 * BlockSize(type), rows = 9;
    auto w = RandomWeight(rng, type, rows, cols, 1.0f);
    // Every f16 field (d, m, dmin) set to 1/2 or -1/4.
    const int64_t nblocks = rows * cols / BlockSize(type);
    std::vector<int64_t> offs = opstest::HalfFieldOffsets(type);
    if (type == WeightType::kQ8_0) offs = {0};
    for (int64_t b = 0; b < nblocks; ++b) {
      for (int64_t off : offs) {
        const uint16_t h = F32ToF16(b % 2 ? 0.5f : -0.25f);
        std::memcpy(w.bytes.data() + b * BlockBytes(type) + off, &h, 2);
      }
    }
    // x whose every block has amax 127: d_x = 1 (q8_0 / q8_1) or -1 (q8_K).
    // Small integers keep every partial sum well inside f32's exact range.
    std::vector<float> x = opstest::RandomIntegers(rng, cols, 3);
    for (int64_t i = 0; i < cols; i += 32) x[i] = 127.0f;
    const int64_t act_bytes = Int8ActRowBytes(type, cols);
    std::vector<uint8_t> acts(static_cast<size_t>(act_bytes));
    QuantizeActs(type, x.data(), 1, cols, acts.data());
    std::vector<float> y(rows), ref(rows);
    ThreadPool one_thread(1);
    MatvecInt8(w.view(), acts.data(), 1, y.data(), one_thread);
    MatvecInt8Ref(w.view(), acts.data(), ref.data(), nullptr);
    EXPECT_EQ(y, ref) << WeightTypeName(type);
  }
}

// A batch of activation rows gives each row's result bit for bit as the
// row alone would: the kernel takes tokens in tiles, and which tile (or the
// remainder) a token lands in must not change its sums. A decode step's
// logits then do not depend on how many sequences share the step.
TEST_P(MatvecInt8Test, BatchEqualsOneRowAtATime) {
  std::mt19937 rng(11);
  for (WeightType type : kIntTypes) {
    const int64_t cols = 3 * BlockSize(type), rows = 13;
    const auto w = RandomWeight(rng, type, rows, cols, 0.5f);
    const int64_t act_bytes = Int8ActRowBytes(type, cols);
    for (int64_t n : {2, 3, 5, 8}) {
      const std::vector<float> x = opstest::RandomVector(rng, n * cols, 2.0f);
      std::vector<uint8_t> acts(static_cast<size_t>(n * act_bytes));
      QuantizeActs(type, x.data(), n, cols, acts.data());
      for (int threads : {1, 2}) {
        std::vector<float> batch(static_cast<size_t>(n * rows)), one(static_cast<size_t>(rows));
        ThreadPool pool(threads);
        MatvecInt8(w.view(), acts.data(), n, batch.data(), pool);
        for (int64_t t = 0; t < n; ++t) {
          MatvecInt8(w.view(), acts.data() + t * act_bytes, 1, one.data(), pool);
          for (int64_t r = 0; r < rows; ++r) {
            ASSERT_EQ(batch[t * rows + r], one[r])
                << WeightTypeName(type) << " n " << n << " token " << t << " row " << r;
          }
        }
      }
    }
  }
}

// MatmulRowwise gives each row of any batch, past every packed-GEMM
// threshold (PackedMinTokens: 32, Q4_K 48, Q6_K 64) too, bit for bit what
// Matmul gives that row alone, under both decode arithmetics and on the
// types of either path (dense types and Q8_0 take MatvecBatch).
TEST_P(MatvecInt8Test, RowwiseEqualsMatmulOneRowAtATime) {
  std::mt19937 rng(12);
  std::vector<WeightType> types(std::begin(kIntTypes), std::end(kIntTypes));
  types.insert(types.end(), {WeightType::kF32, WeightType::kF16, WeightType::kBF16});
  for (WeightType type : types) {
    const bool dense = BlockSize(type) == 1;
    const int64_t cols = dense ? 77 : 2 * BlockSize(type), rows = 13;
    const auto w =
        dense ? opstest::MakeWeight(type, rows, cols, opstest::RandomVector(rng, rows * cols, 0.5f))
              : RandomWeight(rng, type, rows, cols, 0.5f);
    for (DecodeArith arith : {DecodeArith::kInt8Dot, DecodeArith::kExactF32}) {
      for (int64_t n : {2, 33, 49, 70}) {
        const std::vector<float> x = opstest::RandomVector(rng, n * cols, 2.0f);
        for (int threads : {1, 2}) {
          ThreadPool pool(threads);
          MatmulWorkspace ws;
          std::vector<float> batch(static_cast<size_t>(n * rows)), one(static_cast<size_t>(rows));
          MatmulRowwise(w.view(), x.data(), n, batch.data(), pool, &ws, arith);
          for (int64_t t = 0; t < n; ++t) {
            Matmul(w.view(), x.data() + t * cols, 1, one.data(), pool, &ws, arith);
            for (int64_t r = 0; r < rows; ++r) {
              ASSERT_EQ(batch[t * rows + r], one[r])
                  << WeightTypeName(type) << " arith " << static_cast<int>(arith) << " n " << n
                  << " token " << t << " row " << r << " threads " << threads;
            }
          }
        }
      }
    }
  }
}

// Hand-worked blocks: amax 127 gives d = 1, so q = x rounded; Q8_1 and
// Q8_0 round ties away from zero, Q8_K to even, with d = 1 / (-127 / max).
TEST(QuantizeActsTest, HandWorkedBlocks) {
  std::vector<float> x(256, 0.0f);
  x[0] = -2.5f, x[1] = 3.5f, x[2] = 127.0f, x[3] = -0.4f, x[17] = 1.5f;
  BlockQ8_1 q1;
  QuantizeRowQ8_1(x.data(), 32, &q1);
  EXPECT_EQ(F16ToF32(q1.d), 1.0f);
  EXPECT_EQ(q1.qs[0], -3);
  EXPECT_EQ(q1.qs[1], 4);
  EXPECT_EQ(q1.qs[2], 127);
  EXPECT_EQ(q1.qs[3], 0);
  EXPECT_EQ(q1.qs[17], 2);
  EXPECT_EQ(F16ToF32(q1.s), -3 + 4 + 127 + 2);  // d * sum, d = 1
  BlockQ8_K qk;
  QuantizeRowQ8_K(x.data(), 256, &qk);
  EXPECT_EQ(qk.d, -1.0f);  // max = 127 > 0: iscale = -1
  EXPECT_EQ(qk.qs[0], 2);  // -(-2.5) = 2.5 -> 2 (even)
  EXPECT_EQ(qk.qs[1], -4);
  EXPECT_EQ(qk.qs[2], -127);
  EXPECT_EQ(qk.qs[3], 0);
  EXPECT_EQ(qk.qs[17], -2);  // -1.5 -> -2 (even)
  EXPECT_EQ(qk.bsums[0], 2 - 4 - 127);
  EXPECT_EQ(qk.bsums[1], -2);
  for (int i = 2; i < 16; ++i) EXPECT_EQ(qk.bsums[i], 0);
  // A negative maximum flips the sign of d, not of the quants' meaning.
  x[2] = -127.0f;
  QuantizeRowQ8_K(x.data(), 256, &qk);
  EXPECT_EQ(qk.d, 1.0f);
  EXPECT_EQ(qk.qs[0], -2);
  // Zero and non-finite blocks give zero quants (never undefined casts).
  std::vector<float> z(256, 0.0f);
  QuantizeRowQ8_K(z.data(), 256, &qk);
  EXPECT_EQ(qk.d, 0.0f);
  for (int j = 0; j < 256; ++j) ASSERT_EQ(qk.qs[j], 0);
  z[7] = std::numeric_limits<float>::infinity();
  QuantizeRowQ8_1(z.data(), 32, &q1);
  for (int j = 0; j < 32; ++j) ASSERT_EQ(q1.qs[j], 0);
}

TEST(QuantizeActsTest, FormatsAndSizes) {
  EXPECT_EQ(Int8ActQuant(WeightType::kF16), ActQuant::kNone);
  EXPECT_EQ(Int8ActQuant(WeightType::kQ4_1), ActQuant::kQ8_1);
  EXPECT_EQ(Int8ActQuant(WeightType::kQ6_K), ActQuant::kQ8_K);
  EXPECT_EQ(Int8ActQuant(WeightType::kQ5_0), ActQuant::kQ8_0);
  EXPECT_EQ(Int8ActRowBytes(WeightType::kQ4_K, 512), 2 * 292);
  EXPECT_EQ(Int8ActRowBytes(WeightType::kQ5_1, 64), 2 * 36);
  EXPECT_EQ(Int8ActRowBytes(WeightType::kIQ4_NL, 64), 2 * 34);
}

// Matmul's routing: kInt8Dot takes the integer path exactly on the
// Int8DotIsFaster types (bit-identical to quantizing and calling
// MatvecInt8), kExactF32 never; from PackedMinTokens rows (32; on the
// integer path 48 for Q4_K, 64 for Q6_K) every call is MatmulPacked's, bit
// for bit. Without a workspace below 32 rows too.
TEST(MatmulDecodeArithTest, RoutesByTypeChoiceAndRows) {
  std::mt19937 rng(11);
  for (WeightType type : kIntTypes) {
    const int64_t integer_rows = type == WeightType::kQ4_K   ? 48
                                 : type == WeightType::kQ6_K ? 64
                                                             : kPackedMinTokens;
    EXPECT_EQ(PackedMinTokens(type, DecodeArith::kInt8Dot), integer_rows);
    EXPECT_EQ(PackedMinTokens(type, DecodeArith::kExactF32), kPackedMinTokens);
    const int64_t rows = 37, cols = 2 * kQKBlock;
    const auto w = RandomWeight(rng, type, rows, cols, 0.5f);
    for (int64_t n : {3, 31, 32, 47, 48, 63, 64}) {
      const std::string what = std::string(WeightTypeName(type)) + " n " + std::to_string(n);
      const std::vector<float> x = opstest::RandomVector(rng, n * cols, 1.0f);
      std::vector<uint8_t> acts(static_cast<size_t>(n * Int8ActRowBytes(type, cols)));
      QuantizeActs(type, x.data(), n, cols, acts.data());
      std::vector<float> int8(n * rows), exact(n * rows), packed(n * rows), y(n * rows);
      MatmulWorkspace ws;
      ThreadPool pool(2);
      MatvecInt8(w.view(), acts.data(), n, int8.data(), pool);
      MatvecBatch(w.view(), x.data(), n, exact.data(), pool);
      MatmulPacked(w.view(), x.data(), n, packed.data(), pool, &ws);
      Matmul(w.view(), x.data(), n, y.data(), pool, &ws, DecodeArith::kInt8Dot);
      const bool int8_route =
          Int8DotIsFaster(type) && n < PackedMinTokens(type, DecodeArith::kInt8Dot);
      EXPECT_EQ(y, int8_route ? int8 : n >= kPackedMinTokens ? packed : exact) << what;
      if (n < kPackedMinTokens) {
        std::vector<float> y_null(n * rows);
        Matmul(w.view(), x.data(), n, y_null.data(), pool, nullptr, DecodeArith::kInt8Dot);
        EXPECT_EQ(y_null, y) << what;
      }
      Matmul(w.view(), x.data(), n, y.data(), pool, &ws, DecodeArith::kExactF32);
      EXPECT_EQ(y, n >= kPackedMinTokens ? packed : exact) << what;
    }
  }
}

}  // namespace
}  // namespace kvq::ops
