// GGUF v3 (llama.cpp's model file format): reader over a memory map, and a
// writer that produces files llama.cpp loads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "io/mapped_file.h"
#include "io/tensor.h"

namespace kvq {

enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
const char* GgufTypeName(GgufType type);
inline bool GgufTypeIsSigned(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 ||
         t == GgufType::kInt64;
}
inline bool GgufTypeIsUnsigned(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 ||
         t == GgufType::kUint64;
}

// Limits the reader enforces and the writer respects (gguf.md).
inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr uint32_t kGgufMaxDims = 4;
inline constexpr uint64_t kGgufMaxAlignment = uint64_t{1} << 30;
inline bool GgufAlignmentIsValid(uint64_t a) {
  return a != 0 && (a & (a - 1)) == 0 && a <= kGgufMaxAlignment;
}

// One metadata value. Scalars use the field matching their type family;
// arrays hold their elements (which may themselves be arrays).
struct GgufValue {
  GgufType type = GgufType::kUint8;
  uint64_t as_uint = 0;                      // kUint*, kBool
  int64_t as_int = 0;                        // kInt*
  double as_float = 0;                       // kFloat*
  std::string as_string;                     // kString
  GgufType element_type = GgufType::kUint8;  // kArray
  std::vector<GgufValue> elements;           // kArray
};

class GgufFile {
 public:
  // Maps and parses `path`. Every error message starts with the path.
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses bytes the caller keeps alive (fuzzing, tests). `name` prefixes errors.
  static StatusOr<std::unique_ptr<GgufFile>> Parse(const uint8_t* data, size_t size,
                                                   const std::string& name);

  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  const std::string& name() const { return name_; }

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* Find(std::string_view key) const;  // nullptr if absent
  // Typed getters: error if absent or of an incompatible type.
  StatusOr<std::string> GetString(std::string_view key) const;
  StatusOr<int64_t> GetInt(std::string_view key) const;   // any integer type
  StatusOr<double> GetFloat(std::string_view key) const;  // any float or integer type
  StatusOr<bool> GetBool(std::string_view key) const;
  StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  StatusOr<std::vector<double>> GetFloatArray(std::string_view key) const;

  // Tensors in file order, data pointing into the map.
  const std::vector<TensorRef>& tensors() const { return tensors_; }
  const TensorRef* FindTensor(std::string_view name) const;  // nullptr if absent
  // File offset where the tensor data section starts (clamped to the file size
  // for vocabulary-only files that end before it).
  size_t data_offset() const { return data_offset_; }

 private:
  GgufFile() = default;
  Status ParseImpl(const uint8_t* data, size_t size);
  size_t data_offset_ = 0;
  std::unique_ptr<MappedFile> map_;  // null when parsed from caller bytes
  std::string name_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<TensorRef> tensors_;
};

// Builds a GGUF v3 file in memory order: add metadata and tensors, then Write.
class GgufWriter {
 public:
  void SetString(std::string key, std::string value);
  void SetUint32(std::string key, uint32_t value);
  void SetInt32(std::string key, int32_t value);
  void SetFloat32(std::string key, float value);
  void SetBool(std::string key, bool value);
  void SetStringArray(std::string key, std::vector<std::string> values);
  void SetInt32Array(std::string key, std::vector<int32_t> values);
  void SetFloat32Array(std::string key, std::vector<float> values);
  void SetValue(std::string key, GgufValue value);  // any type, incl. nested arrays
  // `shape` outermost first, as in TensorRef; bytes are copied.
  Status AddTensor(std::string name, DType dtype, std::vector<int64_t> shape, const void* data,
                   size_t nbytes);
  // Like AddTensor, but the bytes are produced by `fill` (given a buffer of the
  // tensor's byte size, zeroed) while Write streams the file, so multi-GB
  // models are never held in memory at once.
  Status AddTensorFn(std::string name, DType dtype, std::vector<int64_t> shape,
                     std::function<void(uint8_t* out)> fill);
  Status Write(const std::string& path) const;

 private:
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  struct PendingTensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::function<void(uint8_t* out)> fill;
    size_t nbytes() const;
  };
  std::vector<PendingTensor> tensors_;
};

}  // namespace kvq
