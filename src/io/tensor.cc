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

Status CheckTensorBytes(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                        size_t nbytes, bool allow_zero_dims) {
  int64_t count = 1;
  for (int64_t d : shape) {
    const bool bad_dim = allow_zero_dims ? d < 0 : d <= 0;
    if (bad_dim || __builtin_mul_overflow(count, d, &count)) {
      return Status::Error("tensor '" + name + "': invalid shape " + ShapeString(shape));
    }
  }
  if (DTypeBytes(dtype, count) != nbytes) {
    return Status::Error("tensor '" + name + "': " + std::to_string(nbytes) + " bytes given, " +
                         DTypeName(dtype) + " " + ShapeString(shape) + " needs " +
                         std::to_string(DTypeBytes(dtype, count)));
  }
  return Status::Ok();
}

}  // namespace kvq
