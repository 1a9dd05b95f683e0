// Weight storage as the ops layer sees it: a typed, row-major view of a
// Linear weight [rows = out_features, cols = in_features] or an embedding
// table [rows = vocab, cols = hidden], in whatever encoding the model file
// uses. The model layer maps its file dtypes onto WeightType; ops never
// depends on io.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace kvq::ops {

enum class WeightType : uint8_t {
  kF32,
  kF16,   // IEEE binary16
  kBF16,  // bfloat16
  kQ8_0,  // ggml Q8_0 blocks: f16 scale d, then 32 int8 q; value = d * q
};

const char* WeightTypeName(WeightType type);

// Values per Q8_0 block; a Q8_0 row's cols must be a multiple of it.
inline constexpr int64_t kQ8_0BlockSize = 32;

// ggml's block_q8_0 layout, byte for byte (34 bytes, 2-byte aligned).
struct BlockQ8_0 {
  uint16_t d;                // f16 bits of the scale
  int8_t q[kQ8_0BlockSize];  // quantized values
};
static_assert(sizeof(BlockQ8_0) == 34, "must match ggml's block_q8_0");

// Bytes one row of `cols` values occupies in `type`.
int64_t RowBytes(WeightType type, int64_t cols);

struct WeightView {
  WeightType type = WeightType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  // rows * RowBytes(type, cols) bytes, row-major, rows contiguous. Only
  // 2-byte alignment is assumed (GGUF/safetensors offsets), so kernels use
  // unaligned loads.
  const void* data = nullptr;

  int64_t row_bytes() const { return RowBytes(type, cols); }
  int64_t bytes() const { return rows * row_bytes(); }
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + r * row_bytes();
  }
};

// Checks what the kernels assume: non-null data, positive shape, Q8_0 cols a
// multiple of 32. Kernels themselves do not re-check (hot path).
Status ValidateWeightView(const WeightView& w);

// x[n] -> n / 32 Q8_0 blocks with ggml's rounding (d = amax / 127 stored as
// f16; q = round(x / d) using the f32 d, ties away from zero). n % 32 == 0.
void QuantizeRowQ8_0(const float* x, int64_t n, BlockQ8_0* out);

// Scalar truth for decoding one row: out[w.cols] = row `row` of w as f32.
void DequantizeRowRef(const WeightView& w, int64_t row, float* out);

}  // namespace kvq::ops
