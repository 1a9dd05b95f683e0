// Format-independent view of one stored tensor (GGUF or safetensors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace kvq {

// Weight storage types kvq reads. Q8_0: blocks of 32 values, one f16 scale
// then 32 int8 (34 bytes), exactly as GGUF/ggml stores it.
enum class DType : uint8_t { kF32, kF16, kBF16, kQ8_0 };

const char* DTypeName(DType dtype);
// Bytes used by `count` consecutive elements; Q8_0 requires count % 32 == 0
// (returns 0 otherwise).
size_t DTypeBytes(DType dtype, int64_t count);

// "[896, 64]": shapes in error messages.
std::string ShapeString(const std::vector<int64_t>& shape);

// Checks that `nbytes` is exactly what `dtype` x `shape` needs, with every
// dimension positive (or non-negative when `allow_zero_dims`, as safetensors
// permits) and no overflow. Errors name the tensor.
Status CheckTensorBytes(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                        size_t nbytes, bool allow_zero_dims);

struct TensorRef {
  std::string name;
  DType dtype = DType::kF32;
  // Outermost dimension first (PyTorch order): a Linear weight is
  // [out_features, in_features]. GGUF's ne[] is reversed into this order.
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into a mapped file
  size_t nbytes = 0;

  int64_t NumElements() const;
};

}  // namespace kvq
