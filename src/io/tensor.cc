#include "io/tensor.h"

namespace kvq {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kQ8_0:
      return "Q8_0";
  }
  return "?";
}

size_t DTypeBytes(DType dtype, int64_t count) {
  if (count < 0) return 0;
  const size_t n = static_cast<size_t>(count);
  switch (dtype) {
    case DType::kF32:
      return n * 4;
    case DType::kF16:
    case DType::kBF16:
      return n * 2;
    case DType::kQ8_0:
      return n % 32 == 0 ? n / 32 * 34 : 0;
  }
  return 0;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t TensorRef::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace kvq
