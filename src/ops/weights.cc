#include "ops/weights.h"

#include <cmath>
#include <cstring>
#include <iterator>
#include <string>

#include "base/fp16.h"
#include "ops/matvec_int8.h"

namespace kvq::ops {

namespace {

struct TypeInfo {
  const char* name;
  int64_t block_size;   // values per block
  int64_t block_bytes;  // bytes per block
};

// Indexed by WeightType.
constexpr TypeInfo kTypes[] = {
    {"f32", 1, 4},
    {"f16", 1, 2},
    {"bf16", 1, 2},
    {"q8_0", kQ8_0BlockSize, sizeof(BlockQ8_0)},
    {"q4_0", kQBlock, sizeof(BlockQ4_0)},
    {"q4_1", kQBlock, sizeof(BlockQ4_1)},
    {"q5_0", kQBlock, sizeof(BlockQ5_0)},
    {"q5_1", kQBlock, sizeof(BlockQ5_1)},
    {"iq4_nl", kQBlock, sizeof(BlockIQ4_NL)},
    {"q2_k", kQKBlock, sizeof(BlockQ2_K)},
    {"q3_k", kQKBlock, sizeof(BlockQ3_K)},
    {"q4_k", kQKBlock, sizeof(BlockQ4_K)},
    {"q5_k", kQKBlock, sizeof(BlockQ5_K)},
    {"q6_k", kQKBlock, sizeof(BlockQ6_K)},
};
static_assert(std::size(kTypes) == static_cast<size_t>(WeightType::kQ6_K) + 1,
              "one entry per WeightType");

const TypeInfo& Info(WeightType type) {
  const auto i = static_cast<size_t>(type);
  return kTypes[i < std::size(kTypes) ? i : 0];
}

}  // namespace

const char* WeightTypeName(WeightType type) { return Info(type).name; }
int64_t BlockSize(WeightType type) { return Info(type).block_size; }
int64_t BlockBytes(WeightType type) { return Info(type).block_bytes; }

int64_t RowBytes(WeightType type, int64_t cols) {
  return cols / BlockSize(type) * BlockBytes(type);
}

Status ValidateWeightView(const WeightView& w) {
  if (w.data == nullptr) return Status::Error("weight view has no data");
  if (w.rows <= 0 || w.cols <= 0) {
    return Status::Error("weight view has non-positive shape [" + std::to_string(w.rows) + ", " +
                         std::to_string(w.cols) + "]");
  }
  if (w.cols % BlockSize(w.type) != 0) {
    return Status::Error(std::string(WeightTypeName(w.type)) + " weight has " +
                         std::to_string(w.cols) + " columns, not a multiple of " +
                         std::to_string(BlockSize(w.type)));
  }
  return Status::Ok();
}

void QuantizeRowQ8_0(const float* x, int64_t n, BlockQ8_0* out) {
  for (int64_t b = 0; b < n / kQ8_0BlockSize; ++b) {
    out[b].d = F32ToF16(QuantizeBlockQ8(x + b * kQ8_0BlockSize, out[b].q));
  }
}

namespace {

// The reference decoders below spell out ggml's f32 arithmetic: an int
// converted to float, then the same multiplications and additions in the
// same order (see weights.h).

template <class Block>
const Block* Blocks(const uint8_t* row) {
  return reinterpret_cast<const Block*>(row);
}

void DecodeQ4_0(const uint8_t* row, int64_t cols, float* out) {
  for (int64_t b = 0; b < cols / kQBlock; ++b, out += kQBlock) {
    const BlockQ4_0& blk = Blocks<BlockQ4_0>(row)[b];
    const float d = F16ToF32(blk.d);
    for (int j = 0; j < kQBlock / 2; ++j) {
      out[j] = static_cast<float>((blk.qs[j] & 0xF) - 8) * d;
      out[j + 16] = static_cast<float>((blk.qs[j] >> 4) - 8) * d;
    }
  }
}

void DecodeQ4_1(const uint8_t* row, int64_t cols, float* out) {
  for (int64_t b = 0; b < cols / kQBlock; ++b, out += kQBlock) {
    const BlockQ4_1& blk = Blocks<BlockQ4_1>(row)[b];
    const float d = F16ToF32(blk.d), m = F16ToF32(blk.m);
    for (int j = 0; j < kQBlock / 2; ++j) {
      out[j] = static_cast<float>(blk.qs[j] & 0xF) * d + m;
      out[j + 16] = static_cast<float>(blk.qs[j] >> 4) * d + m;
    }
  }
}

// 5-bit values of a Q5_0/Q5_1 block, 0..31.
template <class Block>
void Q5Values(const Block& blk, int q[kQBlock]) {
  uint32_t qh;
  std::memcpy(&qh, blk.qh, 4);
  for (int j = 0; j < kQBlock / 2; ++j) {
    q[j] = (blk.qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
    q[j + 16] = (blk.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
  }
}

void DecodeQ5_0(const uint8_t* row, int64_t cols, float* out) {
  int q[kQBlock];
  for (int64_t b = 0; b < cols / kQBlock; ++b, out += kQBlock) {
    const BlockQ5_0& blk = Blocks<BlockQ5_0>(row)[b];
    const float d = F16ToF32(blk.d);
    Q5Values(blk, q);
    for (int j = 0; j < kQBlock; ++j) out[j] = static_cast<float>(q[j] - 16) * d;
  }
}

void DecodeQ5_1(const uint8_t* row, int64_t cols, float* out) {
  int q[kQBlock];
  for (int64_t b = 0; b < cols / kQBlock; ++b, out += kQBlock) {
    const BlockQ5_1& blk = Blocks<BlockQ5_1>(row)[b];
    const float d = F16ToF32(blk.d), m = F16ToF32(blk.m);
    Q5Values(blk, q);
    for (int j = 0; j < kQBlock; ++j) out[j] = static_cast<float>(q[j]) * d + m;
  }
}

void DecodeIQ4_NL(const uint8_t* row, int64_t cols, float* out) {
  for (int64_t b = 0; b < cols / kQBlock; ++b, out += kQBlock) {
    const BlockIQ4_NL& blk = Blocks<BlockIQ4_NL>(row)[b];
    const float d = F16ToF32(blk.d);
    for (int j = 0; j < kQBlock / 2; ++j) {
      out[j] = d * static_cast<float>(kIQ4NLValues[blk.qs[j] & 0xF]);
      out[j + 16] = d * static_cast<float>(kIQ4NLValues[blk.qs[j] >> 4]);
    }
  }
}

void DecodeQ2_K(const uint8_t* row, int64_t cols, float* out) {
  for (int64_t b = 0; b < cols / kQKBlock; ++b, out += kQKBlock) {
    const BlockQ2_K& blk = Blocks<BlockQ2_K>(row)[b];
    const float d = F16ToF32(blk.d), dmin = F16ToF32(blk.dmin);
    for (int i = 0; i < kQKBlock; ++i) {
      const int h = i / 128, p = i % 128 / 32, l = i % 32;
      const uint8_t sc = blk.scales[i / 16];
      const float dl = d * static_cast<float>(sc & 0xF);
      const float ml = dmin * static_cast<float>(sc >> 4);
      out[i] = dl * static_cast<float>((blk.qs[h * 32 + l] >> (2 * p)) & 3) - ml;
    }
  }
}

void DecodeQ3_K(const uint8_t* row, int64_t cols, float* out) {
  for (int64_t b = 0; b < cols / kQKBlock; ++b, out += kQKBlock) {
    const BlockQ3_K& blk = Blocks<BlockQ3_K>(row)[b];
    const float d = F16ToF32(blk.d);
    for (int i = 0; i < kQKBlock; ++i) {
      const int h = i / 128, p = i % 128 / 32, l = i % 32;
      const float dl = d * static_cast<float>(Q3KScale(blk.scales, i / 16));
      const int low = (blk.qs[h * 32 + l] >> (2 * p)) & 3;
      const int high = (blk.hmask[l] >> (h * 4 + p)) & 1;
      out[i] = dl * static_cast<float>(low - (high ? 0 : 4));
    }
  }
}

// Q4_K and Q5_K: (d * sc) * q - (dmin * mn) per 32-value sub-block.
template <bool kFifthBit, class Block>
void DecodeQ45_K(const uint8_t* row, int64_t cols, float* out) {
  for (int64_t b = 0; b < cols / kQKBlock; ++b, out += kQKBlock) {
    const Block& blk = Blocks<Block>(row)[b];
    const float d = F16ToF32(blk.d), dmin = F16ToF32(blk.dmin);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      KScaleMin(blk.scales, j, &sc, &mn);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
      const uint8_t* qs = blk.qs + j / 2 * 32;
      for (int l = 0; l < 32; ++l) {
        int q = j % 2 == 0 ? qs[l] & 0xF : qs[l] >> 4;
        if constexpr (kFifthBit) q += ((blk.qh[l] >> j) & 1) << 4;
        out[j * 32 + l] = d1 * static_cast<float>(q) - m1;
      }
    }
  }
}

void DecodeQ6_K(const uint8_t* row, int64_t cols, float* out) {
  for (int64_t b = 0; b < cols / kQKBlock; ++b, out += kQKBlock) {
    const BlockQ6_K& blk = Blocks<BlockQ6_K>(row)[b];
    const float d = F16ToF32(blk.d);
    for (int i = 0; i < kQKBlock; ++i) {
      const int h = i / 128, p = i % 128 / 32, l = i % 32;
      const uint8_t lo = blk.ql[h * 64 + (p & 1) * 32 + l];
      const int q = (p < 2 ? lo & 0xF : lo >> 4) | (((blk.qh[h * 32 + l] >> (2 * p)) & 3) << 4);
      out[i] = d * static_cast<float>(blk.scales[i / 16]) * static_cast<float>(q - 32);
    }
  }
}

}  // namespace

void DequantizeRowRef(const WeightView& w, int64_t row, float* out) {
  const uint8_t* p = w.row(row);
  switch (w.type) {
    case WeightType::kF32: {
      const float* f = reinterpret_cast<const float*>(p);
      for (int64_t i = 0; i < w.cols; ++i) out[i] = f[i];
      return;
    }
    case WeightType::kF16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
      for (int64_t i = 0; i < w.cols; ++i) out[i] = F16ToF32(h[i]);
      return;
    }
    case WeightType::kBF16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
      for (int64_t i = 0; i < w.cols; ++i) out[i] = Bf16ToF32(h[i]);
      return;
    }
    case WeightType::kQ8_0: {
      const BlockQ8_0* blocks = reinterpret_cast<const BlockQ8_0*>(p);
      for (int64_t b = 0; b < w.cols / kQ8_0BlockSize; ++b) {
        const float d = F16ToF32(blocks[b].d);
        for (int64_t j = 0; j < kQ8_0BlockSize; ++j) {
          out[b * kQ8_0BlockSize + j] = d * static_cast<float>(blocks[b].q[j]);
        }
      }
      return;
    }
    case WeightType::kQ4_0:
      return DecodeQ4_0(p, w.cols, out);
    case WeightType::kQ4_1:
      return DecodeQ4_1(p, w.cols, out);
    case WeightType::kQ5_0:
      return DecodeQ5_0(p, w.cols, out);
    case WeightType::kQ5_1:
      return DecodeQ5_1(p, w.cols, out);
    case WeightType::kIQ4_NL:
      return DecodeIQ4_NL(p, w.cols, out);
    case WeightType::kQ2_K:
      return DecodeQ2_K(p, w.cols, out);
    case WeightType::kQ3_K:
      return DecodeQ3_K(p, w.cols, out);
    case WeightType::kQ4_K:
      return DecodeQ45_K<false, BlockQ4_K>(p, w.cols, out);
    case WeightType::kQ5_K:
      return DecodeQ45_K<true, BlockQ5_K>(p, w.cols, out);
    case WeightType::kQ6_K:
      return DecodeQ6_K(p, w.cols, out);
  }
}

}  // namespace kvq::ops
