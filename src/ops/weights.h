// Weight storage as the ops layer sees it: a typed, row-major view of a
// Linear weight [rows = out_features, cols = in_features] or an embedding
// table [rows = vocab, cols = hidden], in whatever encoding the model file
// uses. The model layer maps its file dtypes onto WeightType; ops never
// depends on io.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "base/status.h"

namespace kvq::ops {

// Same order as io's DType (the model layer maps one onto the other). Every
// quantized type is ggml's block layout byte for byte; a block decodes as
// value = a * q + b with per-block (or per-sub-block) a, b described below.
enum class WeightType : uint8_t {
  kF32,
  kF16,     // IEEE binary16
  kBF16,    // bfloat16
  kQ8_0,    // 32 values: f16 d, 32 int8 q; d * q
  kQ4_0,    // 32 values: f16 d, 16 bytes of nibbles; d * (q - 8)
  kQ4_1,    // 32 values: f16 d, f16 m, nibbles; d * q + m
  kQ5_0,    // 32 values: f16 d, 32 high bits, nibbles; d * (q - 16)
  kQ5_1,    // 32 values: f16 d, f16 m, 32 high bits, nibbles; d * q + m
  kIQ4_NL,  // 32 values: f16 d, nibbles indexing a fixed table; d * table[q]
  kQ2_K,    // 256 values: 16 x 16, 4-bit scale and min per 16, 2-bit q
  kQ3_K,    // 256 values: 16 x 16, 6-bit signed scale per 16, 3-bit q - 4
  kQ4_K,    // 256 values: 8 x 32, 6-bit scale and min per 32, 4-bit q
  kQ5_K,    // 256 values: 8 x 32, 6-bit scale and min per 32, 5-bit q
  kQ6_K,    // 256 values: 16 x 16, int8 scale per 16, 6-bit q - 32
};

const char* WeightTypeName(WeightType type);

// Values per Q8_0 block; a Q8_0 row's cols must be a multiple of it.
inline constexpr int64_t kQ8_0BlockSize = 32;
// Values per small block (Q4_0 ... IQ4_NL) and per K-quant super-block.
inline constexpr int64_t kQBlock = 32;
inline constexpr int64_t kQKBlock = 256;

// ggml's block layouts, byte for byte (2-byte aligned). f16 fields are
// stored as their bits. Nibble blocks: byte j holds value j in its low and
// value j + 16 in its high nibble.
struct BlockQ8_0 {
  uint16_t d;                // f16 bits of the scale
  int8_t q[kQ8_0BlockSize];  // quantized values
};
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQBlock / 2];
};
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[kQBlock / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // bit j of the little-endian u32: 5th bit of value j
  uint8_t qs[kQBlock / 2];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQBlock / 2];
};
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQBlock / 2];
};
// Q2_K: per 128-value half h and 2-bit plane p (0..3), 32 values
// h*128 + p*32 + l take bits 2p of qs[h*32 + l]; scales[i] (i = value / 16)
// holds scale (low nibble) and min (high nibble); d * sc * q - dmin * mn.
struct BlockQ2_K {
  uint8_t scales[kQKBlock / 16];
  uint8_t qs[kQKBlock / 4];
  uint16_t d, dmin;
};
// Q3_K: as Q2_K for the low 2 bits; bit (h*4 + p) of hmask[l mod 32] set
// means "+0", clear means "-4"; 16 six-bit scales (minus 32) packed in 12
// bytes; d * (sc - 32) * q.
struct BlockQ3_K {
  uint8_t hmask[kQKBlock / 8];
  uint8_t qs[kQKBlock / 4];
  uint8_t scales[12];
  uint16_t d;
};
// Q4_K: sub-block j (32 values) takes the low (j even) or high (j odd)
// nibbles of qs[j/2 * 32 ...]; 8 six-bit scales and mins packed in 12
// bytes; (d * sc) * q - (dmin * mn).
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[kQKBlock / 2];
};
// Q5_K: Q4_K plus a 5th bit: bit j of qh[l] for value j*32 + l.
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQKBlock / 8];
  uint8_t qs[kQKBlock / 2];
};
// Q6_K: per 128-value half h, value h*128 + p*32 + l (p = 0..3) has its low
// nibble in ql[h*64 + (p & 1)*32 + l] (low nibble for p < 2, high for
// p >= 2) and its top 2 bits at bits 2p of qh[h*32 + l]; int8 scale per 16;
// (d * sc) * (q - 32).
struct BlockQ6_K {
  uint8_t ql[kQKBlock / 2];
  uint8_t qh[kQKBlock / 4];
  int8_t scales[kQKBlock / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ8_0) == 34, "must match ggml's block_q8_0");
static_assert(sizeof(BlockQ4_0) == 18, "must match ggml's block_q4_0");
static_assert(sizeof(BlockQ4_1) == 20, "must match ggml's block_q4_1");
static_assert(sizeof(BlockQ5_0) == 22, "must match ggml's block_q5_0");
static_assert(sizeof(BlockQ5_1) == 24, "must match ggml's block_q5_1");
static_assert(sizeof(BlockIQ4_NL) == 18, "must match ggml's block_iq4_nl");
static_assert(sizeof(BlockQ2_K) == 84, "must match ggml's block_q2_K");
static_assert(sizeof(BlockQ3_K) == 110, "must match ggml's block_q3_K");
static_assert(sizeof(BlockQ4_K) == 144, "must match ggml's block_q4_K");
static_assert(sizeof(BlockQ5_K) == 176, "must match ggml's block_q5_K");
static_assert(sizeof(BlockQ6_K) == 210, "must match ggml's block_q6_K");

// IQ4_NL's 16 levels (a property of the format).
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// Values per block of `type` (1 for F32/F16/BF16) and bytes per block.
int64_t BlockSize(WeightType type);
int64_t BlockBytes(WeightType type);

// Bytes one row of `cols` values occupies in `type` (cols a multiple of
// BlockSize).
int64_t RowBytes(WeightType type, int64_t cols);

// Q4_K/Q5_K's packed 6-bit scale and min of sub-block j (0..7).
inline void KScaleMin(const uint8_t* scales, int j, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *mn = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// All eight at once, one byte each (sc: scale j in byte j, mn likewise),
// on 32-bit words: bytes 0-3 are the low 6 bits of scales[0..3] and
// scales[4..7]; bytes 4-7 take a nibble of scales[8..11] and their top 2
// bits from the top of scales[0..3] (scales) or scales[4..7] (mins).
inline void KScalesMins(const uint8_t* scales, uint64_t* sc, uint64_t* mn) {
  static_assert(std::endian::native == std::endian::little, "byte j of a word is scales[j]");
  uint32_t a, b, c;
  std::memcpy(&a, scales, 4);
  std::memcpy(&b, scales + 4, 4);
  std::memcpy(&c, scales + 8, 4);
  constexpr uint32_t k6 = 0x3F3F3F3Fu, k4 = 0x0F0F0F0Fu, k2 = 0x03030303u;
  const uint32_t sc_high = (c & k4) | (((a >> 6) & k2) << 4);
  const uint32_t mn_high = ((c >> 4) & k4) | (((b >> 6) & k2) << 4);
  *sc = (a & k6) | static_cast<uint64_t>(sc_high) << 32;
  *mn = (b & k6) | static_cast<uint64_t>(mn_high) << 32;
}

// Q3_K's 6-bit scale i (0..15), minus 32.
inline int Q3KScale(const uint8_t* scales, int i) {
  const int low = i < 8 ? scales[i] & 0xF : scales[i - 8] >> 4;
  const int high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// All sixteen at once (out[i] = Q3KScale(scales, i)), on 32-bit words:
// scale i takes a nibble of scales[i % 8] (low for i < 8) and 2 bits of
// scales[8 + i % 4] (bits 2 * (i / 4)).
inline void Q3KScales(const uint8_t* scales, int8_t* out) {
  static_assert(std::endian::native == std::endian::little, "byte j of a word is scales[j]");
  uint32_t a, b, c;
  std::memcpy(&a, scales, 4);
  std::memcpy(&b, scales + 4, 4);
  std::memcpy(&c, scales + 8, 4);
  constexpr uint32_t k4 = 0x0F0F0F0Fu, k2 = 0x03030303u;
  const uint32_t words[4] = {(a & k4) | ((c & k2) << 4), (b & k4) | (((c >> 2) & k2) << 4),
                             ((a >> 4) & k4) | (((c >> 4) & k2) << 4),
                             ((b >> 4) & k4) | (((c >> 6) & k2) << 4)};
  uint8_t biased[16];
  std::memcpy(biased, words, 16);
  for (int i = 0; i < 16; ++i) out[i] = static_cast<int8_t>(biased[i] - 32);
}

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

// Checks what the kernels assume: non-null data, positive shape, cols a
// multiple of BlockSize(type). Kernels themselves do not re-check (hot path).
Status ValidateWeightView(const WeightView& w);

// x[n] -> n / 32 Q8_0 blocks with ggml's rounding (d = amax / 127 stored as
// f16; q = round(x / d) using the f32 d, ties away from zero). n % 32 == 0.
void QuantizeRowQ8_0(const float* x, int64_t n, BlockQ8_0* out);

// Scalar truth for decoding one row: out[w.cols] = row `row` of w as f32.
// Bit-exact with ggml's dequantize_row_* (same f32 operations in the same
// order: products such as d * sc are formed in f32 first; ggml-base is
// built without FMA contraction). Every product a * q is exact in f32
// except Q6_K's (d * sc) * q, which rounds once, as in ggml.
void DequantizeRowRef(const WeightView& w, int64_t row, float* out);

}  // namespace kvq::ops
