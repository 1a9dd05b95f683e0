// GGUF writer: metadata, tensor infos and tensor data packed in the layout
// llama.cpp requires (each tensor offset aligned and equal to the running
// total of the padded tensors before it).
#include <cerrno>
#include <cstring>
#include <fstream>

#include "io/gguf.h"

namespace kvq {
namespace {

// ggml's type ids (ggml.h).
uint32_t DTypeToGgml(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kQ8_0:
      return 8;
    case DType::kBF16:
      return 30;
    case DType::kQ4_0:
      return 2;
    case DType::kQ4_1:
      return 3;
    case DType::kQ5_0:
      return 6;
    case DType::kQ5_1:
      return 7;
    case DType::kQ2_K:
      return 10;
    case DType::kQ3_K:
      return 11;
    case DType::kQ4_K:
      return 12;
    case DType::kQ5_K:
      return 13;
    case DType::kQ6_K:
      return 14;
    case DType::kIQ4_NL:
      return 20;
  }
  return 0;
}

GgufValue Scalar(GgufType type) {
  GgufValue v;
  v.type = type;
  return v;
}

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}
void PutString(std::string* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

// Serializes `v`'s payload (not its type tag). Arrays must be homogeneous.
Status PutValue(std::string* out, const GgufValue& v, const std::string& key) {
  switch (v.type) {
    case GgufType::kUint8:
      Put<uint8_t>(out, static_cast<uint8_t>(v.as_uint));
      break;
    case GgufType::kInt8:
      Put<int8_t>(out, static_cast<int8_t>(v.as_int));
      break;
    case GgufType::kUint16:
      Put<uint16_t>(out, static_cast<uint16_t>(v.as_uint));
      break;
    case GgufType::kInt16:
      Put<int16_t>(out, static_cast<int16_t>(v.as_int));
      break;
    case GgufType::kUint32:
      Put<uint32_t>(out, static_cast<uint32_t>(v.as_uint));
      break;
    case GgufType::kInt32:
      Put<int32_t>(out, static_cast<int32_t>(v.as_int));
      break;
    case GgufType::kFloat32:
      Put<float>(out, static_cast<float>(v.as_float));
      break;
    case GgufType::kBool:
      Put<uint8_t>(out, v.as_uint != 0);
      break;
    case GgufType::kString:
      PutString(out, v.as_string);
      break;
    case GgufType::kUint64:
      Put<uint64_t>(out, v.as_uint);
      break;
    case GgufType::kInt64:
      Put<int64_t>(out, v.as_int);
      break;
    case GgufType::kFloat64:
      Put<double>(out, v.as_float);
      break;
    case GgufType::kArray:
      Put<uint32_t>(out, static_cast<uint32_t>(v.element_type));
      Put<uint64_t>(out, v.elements.size());
      for (const GgufValue& e : v.elements) {
        if (e.type != v.element_type) {
          return Status::Error("metadata key '" + key + "': array of " +
                               GgufTypeName(v.element_type) + " holds a " + GgufTypeName(e.type) +
                               " element");
        }
        KVQ_RETURN_IF_ERROR(PutValue(out, e, key));
      }
      break;
    default:
      return Status::Error("metadata key '" + key + "': invalid value type");
  }
  return Status::Ok();
}

}  // namespace

void GgufWriter::SetString(std::string key, std::string value) {
  GgufValue v = Scalar(GgufType::kString);
  v.as_string = std::move(value);
  SetValue(std::move(key), std::move(v));
}
void GgufWriter::SetUint32(std::string key, uint32_t value) {
  GgufValue v = Scalar(GgufType::kUint32);
  v.as_uint = value;
  SetValue(std::move(key), std::move(v));
}
void GgufWriter::SetInt32(std::string key, int32_t value) {
  GgufValue v = Scalar(GgufType::kInt32);
  v.as_int = value;
  SetValue(std::move(key), std::move(v));
}
void GgufWriter::SetFloat32(std::string key, float value) {
  GgufValue v = Scalar(GgufType::kFloat32);
  v.as_float = value;
  SetValue(std::move(key), std::move(v));
}
void GgufWriter::SetBool(std::string key, bool value) {
  GgufValue v = Scalar(GgufType::kBool);
  v.as_uint = value;
  SetValue(std::move(key), std::move(v));
}
void GgufWriter::SetStringArray(std::string key, std::vector<std::string> values) {
  GgufValue v = Scalar(GgufType::kArray);
  v.element_type = GgufType::kString;
  v.elements.reserve(values.size());
  for (std::string& s : values) {
    GgufValue e = Scalar(GgufType::kString);
    e.as_string = std::move(s);
    v.elements.push_back(std::move(e));
  }
  SetValue(std::move(key), std::move(v));
}
void GgufWriter::SetInt32Array(std::string key, std::vector<int32_t> values) {
  GgufValue v = Scalar(GgufType::kArray);
  v.element_type = GgufType::kInt32;
  v.elements.reserve(values.size());
  for (int32_t x : values) {
    GgufValue e = Scalar(GgufType::kInt32);
    e.as_int = x;
    v.elements.push_back(std::move(e));
  }
  SetValue(std::move(key), std::move(v));
}
void GgufWriter::SetFloat32Array(std::string key, std::vector<float> values) {
  GgufValue v = Scalar(GgufType::kArray);
  v.element_type = GgufType::kFloat32;
  v.elements.reserve(values.size());
  for (float x : values) {
    GgufValue e = Scalar(GgufType::kFloat32);
    e.as_float = x;
    v.elements.push_back(std::move(e));
  }
  SetValue(std::move(key), std::move(v));
}
void GgufWriter::SetValue(std::string key, GgufValue value) {
  // Setting a key twice replaces it: GGUF forbids duplicate keys.
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

Status GgufWriter::AddTensor(std::string name, DType dtype, std::vector<int64_t> shape,
                             const void* data, size_t nbytes) {
  KVQ_RETURN_IF_ERROR(CheckTensorBytes(name, dtype, shape, nbytes, /*allow_zero_dims=*/false));
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  return AddTensorFn(std::move(name), dtype, std::move(shape),
                     [copy = std::vector<uint8_t>(bytes, bytes + nbytes)](uint8_t* out) {
                       std::memcpy(out, copy.data(), copy.size());
                     });
}

Status GgufWriter::AddTensorFn(std::string name, DType dtype, std::vector<int64_t> shape,
                               std::function<void(uint8_t* out)> fill) {
  if (shape.empty() || shape.size() > kGgufMaxDims) {
    return Status::Error("tensor '" + name + "': rank " + std::to_string(shape.size()) +
                         " (supported: 1 to 4)");
  }
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d <= 0 || __builtin_mul_overflow(count, d, &count)) {
      return Status::Error("tensor '" + name + "': invalid shape " + ShapeString(shape));
    }
  }
  if (shape.back() % DTypeBlockSize(dtype) != 0) {
    return Status::Error("tensor '" + name + "': " + DTypeName(dtype) + " row length " +
                         std::to_string(shape.back()) + " is not a multiple of " +
                         std::to_string(DTypeBlockSize(dtype)));
  }
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) return Status::Error("duplicate tensor name '" + name + "'");
  }
  tensors_.push_back({std::move(name), dtype, std::move(shape), std::move(fill)});
  return Status::Ok();
}

size_t GgufWriter::PendingTensor::nbytes() const {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return DTypeBytes(dtype, count);
}

Status GgufWriter::Write(const std::string& path) const {
  size_t alignment = kGgufDefaultAlignment;
  for (const auto& [k, v] : metadata_) {
    if (k != "general.alignment") continue;
    const uint64_t a = GgufTypeIsSigned(v.type) ? static_cast<uint64_t>(v.as_int) : v.as_uint;
    if (!(GgufTypeIsSigned(v.type) || GgufTypeIsUnsigned(v.type)) || !GgufAlignmentIsValid(a)) {
      return Status::Error(path + ": general.alignment must be a power of two");
    }
    alignment = static_cast<size_t>(a);
  }
  std::string header;
  header.append("GGUF", 4);
  Put<uint32_t>(&header, 3);
  Put<uint64_t>(&header, tensors_.size());
  Put<uint64_t>(&header, metadata_.size());
  for (const auto& [k, v] : metadata_) {
    PutString(&header, k);
    Put<uint32_t>(&header, static_cast<uint32_t>(v.type));
    Status st = PutValue(&header, v, k);
    if (!st.ok()) return st.WithContext(path);
  }
  // Tensors are packed in order, each padded to the alignment: the layout
  // llama.cpp requires (it checks each offset against the running total).
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    PutString(&header, t.name);
    Put<uint32_t>(&header, static_cast<uint32_t>(t.shape.size()));
    for (size_t d = t.shape.size(); d-- > 0;) Put<int64_t>(&header, t.shape[d]);
    Put<uint32_t>(&header, DTypeToGgml(t.dtype));
    Put<uint64_t>(&header, offset);
    offset += (t.nbytes() + alignment - 1) / alignment * alignment;
  }
  header.resize((header.size() + alignment - 1) / alignment * alignment, '\0');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::Error(path + ": cannot open for writing: " + std::strerror(errno));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  std::vector<uint8_t> buffer;
  for (const PendingTensor& t : tensors_) {
    const size_t n = t.nbytes();
    const size_t padded = (n + alignment - 1) / alignment * alignment;
    buffer.assign(padded, 0);
    t.fill(buffer.data());
    out.write(reinterpret_cast<const char*>(buffer.data()), static_cast<std::streamsize>(padded));
    if (!out) break;
  }
  out.flush();
  if (!out) return Status::Error(path + ": write failed: " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace kvq
