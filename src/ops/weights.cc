#include "ops/weights.h"

#include <cmath>
#include <string>

#include "base/fp16.h"

namespace kvq::ops {

const char* WeightTypeName(WeightType type) {
  switch (type) {
    case WeightType::kF32:
      return "f32";
    case WeightType::kF16:
      return "f16";
    case WeightType::kBF16:
      return "bf16";
    case WeightType::kQ8_0:
      return "q8_0";
  }
  return "unknown";
}

int64_t RowBytes(WeightType type, int64_t cols) {
  switch (type) {
    case WeightType::kF32:
      return cols * 4;
    case WeightType::kF16:
    case WeightType::kBF16:
      return cols * 2;
    case WeightType::kQ8_0:
      return cols / kQ8_0BlockSize * static_cast<int64_t>(sizeof(BlockQ8_0));
  }
  return 0;
}

Status ValidateWeightView(const WeightView& w) {
  if (w.data == nullptr) return Status::Error("weight view has no data");
  if (w.rows <= 0 || w.cols <= 0) {
    return Status::Error("weight view has non-positive shape [" + std::to_string(w.rows) + ", " +
                         std::to_string(w.cols) + "]");
  }
  if (w.type == WeightType::kQ8_0 && w.cols % kQ8_0BlockSize != 0) {
    return Status::Error("q8_0 weight has " + std::to_string(w.cols) +
                         " columns, not a multiple of 32");
  }
  return Status::Ok();
}

void QuantizeRowQ8_0(const float* x, int64_t n, BlockQ8_0* out) {
  for (int64_t b = 0; b < n / kQ8_0BlockSize; ++b) {
    const float* xb = x + b * kQ8_0BlockSize;
    float amax = 0.0f;
    for (int64_t j = 0; j < kQ8_0BlockSize; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = F32ToF16(d);
    for (int64_t j = 0; j < kQ8_0BlockSize; ++j) {
      out[b].q[j] = static_cast<int8_t>(std::round(xb[j] * id));
    }
  }
}

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
  }
}

}  // namespace kvq::ops
