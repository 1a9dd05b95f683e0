// The block-quantized weight types beyond Q8_0 (Q4_0 ... Q6_K, IQ4_NL):
// layouts and hand-decoded blocks against DequantizeRowRef, then every fast
// kernel (DequantizeRows, Embed, Matvec, MatvecBatch, MatmulPacked, Matmul)
// against its scalar twin on every compiled SIMD target. Bit-exactness of
// DequantizeRowRef with ggml itself is tested through llama.cpp on real
// model files (tests/conformance/llamacpp_dequant_test.cc).
#include <array>
#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include "ops/matmul.h"
#include "ops/matvec.h"
#include "ops_test_util.h"

namespace kvq::ops {
namespace {

using opstest::kEps;
using opstest::kGroupTypes;
using opstest::kTinyAbs;
using opstest::MakeRandomBlocks;
using opstest::TestWeight;

// The f16 fields sit where HalfFieldOffsets (used to build test blocks) says.
static_assert(offsetof(BlockQ4_1, m) == 2 && offsetof(BlockQ5_1, qh) == 4);
static_assert(offsetof(BlockQ2_K, d) == 80 && offsetof(BlockQ2_K, dmin) == 82);
static_assert(offsetof(BlockQ3_K, d) == 108 && offsetof(BlockQ6_K, d) == 208);
static_assert(offsetof(BlockQ4_K, qs) == 16 && offsetof(BlockQ5_K, qs) == 48);

std::vector<float> DecodeRow(const void* blocks, WeightType type, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(cols));
  DequantizeRowRef(WeightView{type, 1, cols, blocks}, 0, out.data());
  return out;
}

TEST(QuantLayoutTest, HandBuiltBlocksDecodeAsSpecified) {
  {  // Q4_0: d * (q - 8), value j in the low nibble of byte j, j + 16 high.
    BlockQ4_0 b{F32ToF16(0.5f), {}};
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    const std::vector<float> v = DecodeRow(&b, WeightType::kQ4_0, 32);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(v[j], (j - 8) * 0.5f);
      EXPECT_EQ(v[j + 16], (7 - j) * 0.5f);
    }
  }
  {  // Q5_0: bit j of qh is value j's fifth bit.
    BlockQ5_0 b{F32ToF16(1.0f), {0x01, 0x00, 0x00, 0x80}, {}};
    const std::vector<float> v = DecodeRow(&b, WeightType::kQ5_0, 32);
    EXPECT_EQ(v[0], 0.0f);
    EXPECT_EQ(v[1], -16.0f);
    EXPECT_EQ(v[31], 0.0f);
  }
  {  // Q4_K: sub-block j (scale j + 1, min 2 for j < 4) from nibbles.
    BlockQ4_K b{F32ToF16(1.0f), F32ToF16(0.5f), {}, {}};
    for (int j = 0; j < 4; ++j) {
      b.scales[j] = static_cast<uint8_t>(j + 1);
      b.scales[j + 4] = 2;
    }
    for (int i = 0; i < 128; ++i) b.qs[i] = 0x53;  // low 3, high 5
    const std::vector<float> v = DecodeRow(&b, WeightType::kQ4_K, 256);
    EXPECT_EQ(v[0], 1.0f * 3 - 1.0f);    // sub-block 0: low nibble, scale 1
    EXPECT_EQ(v[32], 2.0f * 5 - 1.0f);   // sub-block 1: high nibble, scale 2
    EXPECT_EQ(v[100], 4.0f * 5 - 1.0f);  // sub-block 3
    EXPECT_EQ(v[200], 0.0f);             // sub-blocks 4..7: scale and min 0
  }
  {  // Q6_K: value h*128 + p*32 + l, scale i = value / 16, q - 32.
    BlockQ6_K b{};
    b.d = F32ToF16(2.0f);
    for (int i = 0; i < 16; ++i) b.scales[i] = static_cast<int8_t>(i - 8);
    for (int i = 0; i < 128; ++i) b.ql[i] = 0x21;  // low nibble 1, high 2
    for (int i = 0; i < 64; ++i) b.qh[i] = 0xE4;   // planes 0, 1, 2, 3
    const std::vector<float> v = DecodeRow(&b, WeightType::kQ6_K, 256);
    for (int i = 0; i < 256; ++i) {
      const int p = i % 128 / 32;
      const int q = (p < 2 ? 1 : 2) | (p << 4);
      ASSERT_EQ(v[i], 2.0f * static_cast<float>(i / 16 - 8) * static_cast<float>(q - 32)) << i;
    }
  }
}

// Packed scale bytes for the word-at-a-time unpackers: the patterns where
// the packing's fields meet (all bits set, alternating bits, nibbles, the
// 2-bit tops) and random blocks.
std::vector<std::array<uint8_t, 12>> ScaleByteBlocks(uint32_t seed) {
  std::vector<std::array<uint8_t, 12>> blocks;
  for (uint8_t fill : {0x00, 0xFF, 0xC0, 0x3F, 0xAA, 0x55, 0x0F, 0xF0}) {
    std::array<uint8_t, 12> s;
    s.fill(fill);
    blocks.push_back(s);
  }
  std::mt19937 rng(seed);
  for (int i = 0; i < 2000; ++i) {
    std::array<uint8_t, 12> s;
    for (uint8_t& b : s) b = static_cast<uint8_t>(rng());
    blocks.push_back(s);
  }
  return blocks;
}

// The eight-at-once unpacking the integer kernels use equals the
// per-sub-block one.
TEST(QuantLayoutTest, KScalesMinsEqualsKScaleMin) {
  for (const auto& s : ScaleByteBlocks(7)) {
    uint64_t sc, mn;
    KScalesMins(s.data(), &sc, &mn);
    for (int j = 0; j < 8; ++j) {
      uint8_t want_sc, want_mn;
      KScaleMin(s.data(), j, &want_sc, &want_mn);
      ASSERT_EQ((sc >> (8 * j)) & 0xFF, want_sc) << "scale " << j;
      ASSERT_EQ((mn >> (8 * j)) & 0xFF, want_mn) << "min " << j;
    }
  }
}

TEST(QuantLayoutTest, Q3KScalesEqualsQ3KScale) {
  for (const auto& s : ScaleByteBlocks(9)) {
    int8_t all[16];
    Q3KScales(s.data(), all);
    for (int j = 0; j < 16; ++j) ASSERT_EQ(all[j], Q3KScale(s.data(), j)) << "scale " << j;
  }
}

TEST(QuantLayoutTest, RowBytesAndValidation) {
  EXPECT_EQ(RowBytes(WeightType::kQ4_1, 576), 18 * 20);
  EXPECT_EQ(RowBytes(WeightType::kQ6_K, 4864), 19 * 210);
  float data[64] = {};
  for (WeightType type : kGroupTypes) {
    const int64_t block = BlockSize(type);
    EXPECT_TRUE(ValidateWeightView({type, 2, block, data}).ok()) << WeightTypeName(type);
    const Status bad = ValidateWeightView({type, 2, block + 16, data});
    EXPECT_FALSE(bad.ok()) << WeightTypeName(type);
    EXPECT_NE(bad.message().find(WeightTypeName(type)), std::string::npos) << bad.message();
  }
  EXPECT_FALSE(ValidateWeightView({WeightType::kQ4_K, 2, 896, data}).ok());  // 896 % 256 != 0
}

class QuantKernelTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(QuantKernelTest);

TEST_P(QuantKernelTest, DequantizeRowsAndEmbedAreBitExact) {
  std::mt19937 rng(21);
  for (WeightType type : kGroupTypes) {
    const int64_t rows = 13, cols = 3 * BlockSize(type) + (BlockSize(type) == 32 ? 32 : 0);
    const TestWeight w = MakeRandomBlocks(rng, type, rows, cols, 3.0f);
    std::vector<float> out(static_cast<size_t>(rows * cols));
    DequantizeRows(w.view(), 0, rows, out.data());
    // Bit for bit (memcmp tells -0 from +0, which == does not).
    ASSERT_EQ(std::memcmp(out.data(), w.decoded.data(), out.size() * 4), 0) << WeightTypeName(type);
    DequantizeRows(w.view(), 4, 3, out.data());
    EXPECT_TRUE(std::equal(out.begin(), out.begin() + 3 * cols, w.decoded.begin() + 4 * cols));
    const int32_t ids[] = {0, 12, 5, 5, 7};
    std::vector<float> emb(5 * cols), emb_ref(5 * cols);
    Embed(w.view(), ids, 5, emb.data());
    EmbedRef(w.view(), ids, 5, emb_ref.data());
    EXPECT_EQ(std::memcmp(emb.data(), emb_ref.data(), emb.size() * 4), 0) << WeightTypeName(type);
  }
}

// Every kernel sums the exact f32 products w_i x_i the reference sums
// (weights decode bit-exactly, see quant_decode-inl.h) in some order, so the
// recursive-summation bound applies per output: gamma_(cols+1) sum|w x|,
// one more rounding for the reference's double -> f32 and a margin of two;
// underflow adds the absolute term.
void ExpectNearRef(const TestWeight& w, const std::vector<float>& x, int64_t n,
                   const std::vector<float>& y, const char* what) {
  std::vector<float> ref(static_cast<size_t>(n * w.rows));
  MatmulRef(w.view(), x.data(), n, ref.data());
  const double k = static_cast<double>(w.cols + 4);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < w.rows; ++r) {
      double abs_sum = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) {
        abs_sum += std::fabs(static_cast<double>(w.decoded[r * w.cols + c]) * x[t * w.cols + c]);
      }
      const double bound = k * kEps / (1.0 - k * kEps) * abs_sum + 2.0 * k * kTinyAbs;
      ASSERT_NEAR(y[t * w.rows + r], ref[t * w.rows + r], bound)
          << what << " " << WeightTypeName(w.type) << " n " << n << " [" << w.rows << ", " << w.cols
          << "] token " << t << " row " << r;
    }
  }
}

TEST_P(QuantKernelTest, MatvecAndBatchNearReference) {
  std::mt19937 rng(22);
  for (WeightType type : kGroupTypes) {
    const bool k_quant = BlockSize(type) == kQKBlock;
    const std::vector<int64_t> cols_list =
        k_quant ? std::vector<int64_t>{256, 768, 1536} : std::vector<int64_t>{32, 96, 576};
    for (int64_t rows : {1, 3, 17, 67}) {
      for (int64_t cols : cols_list) {
        const TestWeight w = MakeRandomBlocks(rng, type, rows, cols, 0.1f);
        for (int64_t n : {1, 2, 3, 5, 9}) {
          const std::vector<float> x = opstest::RandomVector(rng, n * cols, 2.0f);
          std::vector<float> y(static_cast<size_t>(n * rows), std::nanf(""));
          for (int threads : {1, 2}) {
            ThreadPool pool(threads);
            if (n == 1) {
              Matvec(w.view(), x.data(), y.data(), pool);
              ExpectNearRef(w, x, 1, y, "Matvec");
            }
            MatvecBatch(w.view(), x.data(), n, y.data(), pool);
            ExpectNearRef(w, x, n, y, "MatvecBatch");
          }
        }
      }
    }
  }
}

TEST_P(QuantKernelTest, PackedAndRoutedMatmulNearReference) {
  std::mt19937 rng(23);
  for (WeightType type : kGroupTypes) {
    const bool k_quant = BlockSize(type) == kQKBlock;
    // Columns that end inside a 128-column panel depth and start panels in
    // the middle of a K-quant super-block; rows that leave a partial panel.
    const int64_t cols = k_quant ? 768 : 160;
    for (int64_t rows : {5, 67}) {
      const TestWeight w = MakeRandomBlocks(rng, type, rows, cols, 0.1f);
      for (int64_t n : {1, 7, 33}) {
        const std::vector<float> x = opstest::RandomVector(rng, n * cols, 1.5f);
        std::vector<float> y(static_cast<size_t>(n * rows), std::nanf(""));
        MatmulWorkspace ws;
        ThreadPool two_threads(2), one_thread(1);
        MatmulPacked(w.view(), x.data(), n, y.data(), two_threads, &ws);
        ExpectNearRef(w, x, n, y, "MatmulPacked");
        Matmul(w.view(), x.data(), n, y.data(), one_thread, &ws, DecodeArith::kExactF32);
        ExpectNearRef(w, x, n, y, "Matmul");
      }
    }
  }
}

}  // namespace
}  // namespace kvq::ops
