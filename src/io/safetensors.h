// safetensors (Hugging Face's weight format): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}}, then raw data.
// Readers for single files and for sharded folders (model.safetensors.index.json),
// and a small writer for tests and tools.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "io/mapped_file.h"
#include "io/tensor.h"

namespace kvq {

class SafetensorsFile {
 public:
  // Maps and parses `path`; every error message starts with the path.
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Parses bytes the caller keeps alive (fuzzing, tests). `name` prefixes errors.
  static StatusOr<std::unique_ptr<SafetensorsFile>> Parse(const uint8_t* data, size_t size,
                                                          const std::string& name);

  const std::string& name() const { return name_; }
  // Tensors in data order. Data points into the map and is only byte-aligned
  // in general (the header length is arbitrary): read elements with memcpy.
  const std::vector<TensorRef>& tensors() const { return tensors_; }
  const TensorRef* Find(std::string_view name) const;  // nullptr if absent
  // The header's "__metadata__" string pairs (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  Status ParseImpl(const uint8_t* data, size_t size);
  std::unique_ptr<MappedFile> map_;  // null when parsed from caller bytes
  std::string name_;
  std::vector<TensorRef> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a Hugging Face model folder: `model.safetensors`, or the
// shards named by `model.safetensors.index.json` (which wins when present).
struct SafetensorsSet {
  std::vector<std::unique_ptr<SafetensorsFile>> files;  // own the maps
  std::vector<TensorRef> tensors;                       // every tensor, shard order
};
StatusOr<SafetensorsSet> OpenSafetensorsFolder(const std::string& dir);

// Writes one safetensors file. Tensors are laid out in the order added; the
// data section starts 64-byte aligned (the header is padded with spaces).
class SafetensorsWriter {
 public:
  // `shape` outermost first; F32/F16/BF16 only. Bytes are copied.
  Status AddTensor(std::string name, DType dtype, std::vector<int64_t> shape, const void* data,
                   size_t nbytes);
  // Bytes produced by `fill` while Write streams the file.
  Status AddTensorFn(std::string name, DType dtype, std::vector<int64_t> shape,
                     std::function<void(uint8_t* out)> fill);
  void SetMetadata(std::string key, std::string value);  // "__metadata__" entries
  Status Write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    size_t nbytes;
    std::function<void(uint8_t* out)> fill;
  };
  std::vector<PendingTensor> tensors_;
  std::vector<std::pair<std::string, std::string>> metadata_;
};

}  // namespace kvq
