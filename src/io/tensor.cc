#include "io/tensor.h"

#include <iterator>

namespace kvq {

namespace {

struct DTypeInfo {
  const char* name;
  int64_t block_size;   // values per block
  int64_t block_bytes;  // bytes per block
};

// Indexed by DType; the byte counts are ggml's (ggml-common.h) and
// tests/model checks them against the ops layer's block structs.
constexpr DTypeInfo kDTypes[] = {
    {"F32", 1, 4},      {"F16", 1, 2},      {"BF16", 1, 2},     {"Q8_0", 32, 34},
    {"Q4_0", 32, 18},   {"Q4_1", 32, 20},   {"Q5_0", 32, 22},   {"Q5_1", 32, 24},
    {"IQ4_NL", 32, 18}, {"Q2_K", 256, 84},  {"Q3_K", 256, 110}, {"Q4_K", 256, 144},
    {"Q5_K", 256, 176}, {"Q6_K", 256, 210},
};
static_assert(std::size(kDTypes) == static_cast<size_t>(DType::kQ6_K) + 1, "one entry per DType");

const DTypeInfo* Info(DType dtype) {
  const auto i = static_cast<size_t>(dtype);
  return i < std::size(kDTypes) ? &kDTypes[i] : nullptr;
}

}  // namespace

const char* DTypeName(DType dtype) {
  const DTypeInfo* info = Info(dtype);
  return info ? info->name : "?";
}

int64_t DTypeBlockSize(DType dtype) {
  const DTypeInfo* info = Info(dtype);
  return info ? info->block_size : 0;
}

int64_t DTypeBlockBytes(DType dtype) {
  const DTypeInfo* info = Info(dtype);
  return info ? info->block_bytes : 0;
}

size_t DTypeBytes(DType dtype, int64_t count) {
  const DTypeInfo* info = Info(dtype);
  if (count < 0 || info == nullptr || count % info->block_size != 0) return 0;
  return static_cast<size_t>(count / info->block_size) * static_cast<size_t>(info->block_bytes);
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
