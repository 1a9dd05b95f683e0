// Format-independent view of one stored tensor (GGUF or safetensors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace kvq {

// Weight storage types kvq reads. The block-quantized ones are ggml's
// layouts byte for byte (ops/weights.h describes each): blocks of 32 values
// (Q4_0 18 bytes, Q4_1 20, Q5_0 22, Q5_1 24, Q8_0 34, IQ4_NL 18) or
// super-blocks of 256 (Q2_K 84, Q3_K 110, Q4_K 144, Q5_K 176, Q6_K 210).
enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kIQ4_NL,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
};

const char* DTypeName(DType dtype);
// Values per block (1 for F32/F16/BF16, 32 or 256 for quantized types) and
// the bytes one block occupies.
int64_t DTypeBlockSize(DType dtype);
int64_t DTypeBlockBytes(DType dtype);
// True for the block-quantized types (safetensors cannot store them).
inline bool DTypeIsQuantized(DType dtype) { return DTypeBlockSize(dtype) > 1; }
// Bytes used by `count` consecutive elements; block types require count to
// be a multiple of their block size (returns 0 otherwise).
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
