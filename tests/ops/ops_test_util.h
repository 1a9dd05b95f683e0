// Shared helpers for the ops tests: random data, weight encodings built from
// f32 values, and the per-SIMD-target test fixture.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "base/fp16.h"
#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
#include "ops/weights.h"

namespace kvq::ops::opstest {

// f32 unit roundoff: every correctly rounded f32 op has relative error <= it.
inline constexpr double kEps = 1.0 / (1 << 24);
// Smallest positive f32 subnormal; absolute error of one rounding in the
// subnormal range is at most half of it.
inline constexpr double kTinyAbs = 1.401298464324817e-45;

// Uniform values in [-scale, scale].
inline std::vector<float> RandomVector(std::mt19937& rng, int64_t n, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

// Integers in [-range, range]: products and partial sums stay exact in f32,
// so fast and reference results must agree bit for bit whatever the
// summation order (catches indexing and tail bugs a tolerance could hide).
inline std::vector<float> RandomIntegers(std::mt19937& rng, int64_t n, int range) {
  std::uniform_int_distribution<int> dist(-range, range);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = static_cast<float>(dist(rng));
  return v;
}

// A weight matrix in a given encoding, owning its bytes, plus the f32 values
// it decodes to (the exact operand the kernels see).
struct TestWeight {
  WeightType type;
  int64_t rows, cols;
  std::vector<uint8_t> bytes;  // [rows * RowBytes(type, cols)]
  std::vector<float> decoded;  // [rows, cols]

  WeightView view() const { return WeightView{type, rows, cols, bytes.data()}; }
};

// Encodes values[rows, cols] as `type` (rounding to nearest for 16-bit
// types, ggml quantization for Q8_0).
inline TestWeight MakeWeight(WeightType type, int64_t rows, int64_t cols,
                             const std::vector<float>& values) {
  TestWeight w{type, rows, cols, {}, {}};
  w.bytes.resize(static_cast<size_t>(rows * RowBytes(type, cols)));
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = values.data() + r * cols;
    uint8_t* dst = w.bytes.data() + r * RowBytes(type, cols);
    for (int64_t c = 0; c < cols; ++c) {
      if (type == WeightType::kF32) std::memcpy(dst + 4 * c, src + c, 4);
      if (type == WeightType::kF16 || type == WeightType::kBF16) {
        const uint16_t h = type == WeightType::kF16 ? F32ToF16(src[c]) : F32ToBf16(src[c]);
        std::memcpy(dst + 2 * c, &h, 2);
      }
    }
    if (type == WeightType::kQ8_0) QuantizeRowQ8_0(src, cols, reinterpret_cast<BlockQ8_0*>(dst));
  }
  w.decoded.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) DequantizeRowRef(w.view(), r, w.decoded.data() + r * cols);
  return w;
}

// Q8_0 weight whose blocks all have scale 1 and the given integer q, so
// decoded values are exactly the integers.
inline TestWeight MakeIntegerQ8_0(int64_t rows, int64_t cols, const std::vector<float>& ints) {
  TestWeight w{WeightType::kQ8_0, rows, cols, {}, ints};
  w.bytes.resize(static_cast<size_t>(rows * RowBytes(WeightType::kQ8_0, cols)));
  auto* blocks = reinterpret_cast<BlockQ8_0*>(w.bytes.data());
  for (int64_t b = 0; b < rows * cols / kQ8_0BlockSize; ++b) {
    blocks[b].d = F32ToF16(1.0f);
    for (int64_t j = 0; j < kQ8_0BlockSize; ++j) {
      blocks[b].q[j] = static_cast<int8_t>(ints[static_cast<size_t>(b * kQ8_0BlockSize + j)]);
    }
  }
  return w;
}

// The block types with group decoders (everything but F32/F16/BF16/Q8_0).
inline const WeightType kGroupTypes[] = {
    WeightType::kQ4_0, WeightType::kQ4_1, WeightType::kQ5_0, WeightType::kQ5_1, WeightType::kIQ4_NL,
    WeightType::kQ2_K, WeightType::kQ3_K, WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K};

// Byte offsets of the f16 fields (d, then m/dmin if any) inside a block.
inline std::vector<int64_t> HalfFieldOffsets(WeightType type) {
  switch (type) {
    case WeightType::kQ4_0:
    case WeightType::kQ5_0:
    case WeightType::kIQ4_NL:
      return {0};
    case WeightType::kQ4_1:
    case WeightType::kQ5_1:
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
      return {0, 2};
    case WeightType::kQ2_K:
      return {80, 82};
    case WeightType::kQ3_K:
      return {108};
    case WeightType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

// A block-quantized weight with uniformly random quant bytes (every bit
// pattern of values, scales and mins occurs) and finite random f16 block
// scales of magnitude up to `scale` (negative ones included: the decoders
// must not assume a sign). `decoded` comes from DequantizeRowRef.
inline TestWeight MakeRandomBlocks(std::mt19937& rng, WeightType type, int64_t rows, int64_t cols,
                                   float scale) {
  TestWeight w{type, rows, cols, {}, {}};
  w.bytes.resize(static_cast<size_t>(rows * RowBytes(type, cols)));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : w.bytes) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> dist(-scale, scale);
  const int64_t blocks = rows * cols / BlockSize(type);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t off : HalfFieldOffsets(type)) {
      const uint16_t h = F32ToF16(dist(rng));
      std::memcpy(w.bytes.data() + b * BlockBytes(type) + off, &h, 2);
    }
  }
  w.decoded.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) DequantizeRowRef(w.view(), r, w.decoded.data() + r * cols);
  return w;
}

inline const WeightType kAllWeightTypes[] = {WeightType::kF32, WeightType::kF16, WeightType::kBF16,
                                             WeightType::kQ8_0};

}  // namespace kvq::ops::opstest
