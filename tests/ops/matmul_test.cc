// Matmul (routing), MatmulRowwise, MatvecBatch's tiles, MatmulPacked (register-blocked
// GEMM over decoded weight panels) and MatmulSgemm (OpenBLAS over decoded
// weight panels) against MatmulRef, on every compiled SIMD target.
#include "ops/matmul.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "ops/matvec.h"
#include "ops_test_util.h"

namespace kvq::ops {
namespace {

using opstest::kEps;
using opstest::kTinyAbs;
using opstest::MakeWeight;
using opstest::TestWeight;

class MatmulTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(MatmulTest);

enum class Path { kMatmul, kSgemm, kPacked, kRowwise };

// Both paths sum the same exact f32 products as the reference (every type
// decodes exactly to f32, Q8_0's d * q included) in some order (tiles,
// blocked sgemm, FMA), so the recursive-summation bound applies per output:
// |y - y_exact| <= gamma_(cols+1) sum|w x|, +1 rounding for the reference's
// final double -> f32, +2 margin; subnormal underflow adds the absolute term.
void ExpectMatmulNearRef(const TestWeight& w, int64_t n, int threads, std::mt19937& rng,
                         Path path) {
  const std::vector<float> x = opstest::RandomVector(rng, n * w.cols, 1.5f);
  std::vector<float> y(static_cast<size_t>(n * w.rows), std::nanf(""));
  std::vector<float> ref(static_cast<size_t>(n * w.rows));
  MatmulWorkspace ws;
  ThreadPool pool(threads);
  switch (path) {
    case Path::kMatmul:
      Matmul(w.view(), x.data(), n, y.data(), pool, &ws, DecodeArith::kExactF32);
      break;
    case Path::kSgemm:
      MatmulSgemm(w.view(), x.data(), n, y.data(), threads, &ws);
      break;
    case Path::kPacked:
      MatmulPacked(w.view(), x.data(), n, y.data(), pool, &ws);
      break;
    case Path::kRowwise:
      MatmulRowwise(w.view(), x.data(), n, y.data(), pool, &ws, DecodeArith::kExactF32);
      break;
  }
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
          << WeightTypeName(w.type) << " n " << n << " [" << w.rows << ", " << w.cols << "] token "
          << t << " row " << r << " threads " << threads << " path " << static_cast<int>(path);
    }
  }
  // The workspace never holds a whole converted matrix: per thread either an
  // sgemm panel (MatmulPanelRows rows) or one packed panel (at most 64 rows x
  // 128 columns of f32 + alignment, < 64 KiB), plus MatmulPacked's repacked
  // activations (n rounded up to a tile of at most 8 tokens, x cols f32).
  const int64_t per_thread = std::max<int64_t>(MatmulPanelRows(w.cols) * w.cols * 4, 64 << 10);
  EXPECT_LE(ws.bytes(), threads * per_thread + (n + 7) * w.cols * 4);
}

TEST_P(MatmulTest, RandomShapesAllTypes) {
  std::mt19937 rng(21);
  struct Shape {
    int64_t rows, cols;
  };
  // 896 x 896 splits into several panels per thread; 17 rows is not a
  // multiple of the 16-row split; 33 rows with 2 threads leaves a short block.
  const Shape shapes[] = {{1, 64}, {17, 96}, {33, 128}, {896, 896}, {40, 4864}};
  for (WeightType type : opstest::kAllWeightTypes) {
    for (const Shape& s : shapes) {
      const TestWeight w =
          MakeWeight(type, s.rows, s.cols, opstest::RandomVector(rng, s.rows * s.cols, 0.5f));
      // 31/32 straddle the packed routing switch, 65 and 130 the 64-token
      // chunks of MatvecBatch.
      for (int64_t n : {1, 2, 5, 16, 31, 32, 65, 130}) {
        if (n * s.rows * s.cols > int64_t{8} << 20) continue;  // keep the reference quick
        for (int threads : {1, 2}) {
          ExpectMatmulNearRef(w, n, threads, rng, Path::kMatmul);
          ExpectMatmulNearRef(w, n, threads, rng, Path::kSgemm);
          ExpectMatmulNearRef(w, n, threads, rng, Path::kPacked);
          ExpectMatmulNearRef(w, n, threads, rng, Path::kRowwise);
        }
      }
    }
  }
}

TEST_P(MatmulTest, DenseOddColumns) {
  std::mt19937 rng(22);
  for (WeightType type : {WeightType::kF32, WeightType::kF16, WeightType::kBF16}) {
    const TestWeight w = MakeWeight(type, 19, 77, opstest::RandomVector(rng, 19 * 77, 1.0f));
    for (int threads : {1, 2}) {
      for (int64_t n : {5, 20, 37}) {
        ExpectMatmulNearRef(w, n, threads, rng, Path::kMatmul);
        ExpectMatmulNearRef(w, n, threads, rng, Path::kSgemm);
        ExpectMatmulNearRef(w, n, threads, rng, Path::kPacked);
      }
    }
  }
}

// MatmulPacked's edges: rows around the panel height (2..64 rows by target:
// 2, 4, 8 or 16 lanes x 2 or 4 vectors), columns around its 128-column depth
// blocks (Q8_0 only in whole 32-blocks), tokens around its tile width (6)
// and around the routing switch at 32.
TEST_P(MatmulTest, PackedTileEdges) {
  std::mt19937 rng(24);
  struct Shape {
    int64_t rows, cols;
  };
  const Shape dense[] = {{1, 1},   {3, 7},    {15, 129}, {16, 128}, {17, 257},
                         {63, 96}, {64, 130}, {65, 33},  {130, 300}};
  const Shape q8[] = {{1, 32}, {17, 128}, {63, 160}, {64, 256}, {65, 288}, {129, 96}};
  for (WeightType type : opstest::kAllWeightTypes) {
    const bool is_q8 = type == WeightType::kQ8_0;
    for (const Shape& s : is_q8 ? std::vector<Shape>(std::begin(q8), std::end(q8))
                                : std::vector<Shape>(std::begin(dense), std::end(dense))) {
      const TestWeight w =
          MakeWeight(type, s.rows, s.cols, opstest::RandomVector(rng, s.rows * s.cols, 0.5f));
      for (int64_t n : {1, 3, 4, 5, 6, 7, 11, 12, 13, 31, 32, 33}) {
        for (int threads : {1, 2}) {
          ExpectMatmulNearRef(w, n, threads, rng, Path::kPacked);
          ExpectMatmulNearRef(w, n, threads, rng, Path::kMatmul);
        }
      }
    }
  }
}

// Integer values make every path exact, so results must match bit for bit;
// one workspace is reused across shapes (growing and shrinking cols).
TEST_P(MatmulTest, IntegerValuesExactAllPathsReusedWorkspace) {
  std::mt19937 rng(23);
  MatmulWorkspace ws;
  ThreadPool pool(2);
  for (WeightType type : opstest::kAllWeightTypes) {
    for (int64_t cols : {4864, 64, 896}) {
      const std::vector<float> ints = opstest::RandomIntegers(rng, 48 * cols, 4);
      const TestWeight w = type == WeightType::kQ8_0 ? opstest::MakeIntegerQ8_0(48, cols, ints)
                                                     : MakeWeight(type, 48, cols, ints);
      for (int64_t n : {3, 70}) {
        const std::vector<float> x = opstest::RandomIntegers(rng, n * cols, 4);
        std::vector<float> y(n * 48), y2(n * 48), y3(n * 48), ref(n * 48);
        Matmul(w.view(), x.data(), n, y.data(), pool, &ws, DecodeArith::kExactF32);
        MatmulSgemm(w.view(), x.data(), n, y2.data(), 2, &ws);
        MatmulPacked(w.view(), x.data(), n, y3.data(), pool, &ws);
        MatmulRef(w.view(), x.data(), n, ref.data());
        EXPECT_EQ(y, ref) << WeightTypeName(type) << " " << cols << " n " << n;
        EXPECT_EQ(y2, ref) << WeightTypeName(type) << " " << cols << " n " << n;
        EXPECT_EQ(y3, ref) << WeightTypeName(type) << " " << cols << " n " << n;
      }
    }
  }
}

}  // namespace
}  // namespace kvq::ops
