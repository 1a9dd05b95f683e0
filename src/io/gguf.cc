// GGUF reader (the writer is in gguf_writer.cc). The reader trusts nothing in the file: every
// length, count and offset is checked against the bytes that remain before it is used, with
// overflow-safe arithmetic, so a corrupt or hostile file yields a Status naming the problem instead
// of an out-of-bounds read or a huge allocation.
#include "io/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_set>

namespace kvq {
namespace {

// Nested arrays recurse; a cap keeps a hostile file from exhausting the stack.
constexpr int kMaxArrayDepth = 16;

// ggml's tensor type ids (ggml.h), used only to name unsupported types.
const char* GgmlTypeName(uint32_t type) {
  static constexpr const char* kNames[] = {
      "F32",     "F16",   "Q4_0",   "Q4_1",  "Q4_2",  "Q4_3",   "Q5_0",  "Q5_1",    "Q8_0",
      "Q8_1",    "Q2_K",  "Q3_K",   "Q4_K",  "Q5_K",  "Q6_K",   "Q8_K",  "IQ2_XXS", "IQ2_XS",
      "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8",    "I16",     "I32",
      "I64",     "F64",   "IQ1_M",  "BF16",  nullptr, nullptr,  nullptr, "TQ1_0",   "TQ2_0",
      nullptr,   nullptr, nullptr,  "MXFP4", "NVFP4"};
  if (type < std::size(kNames)) return kNames[type];
  return nullptr;
}

bool GgmlToDType(uint32_t type, DType* out) {
  // ggml.h's type ids for the types kvq reads.
  static constexpr struct {
    uint32_t ggml;
    DType dtype;
  } kMap[] = {{0, DType::kF32},     {1, DType::kF16},   {2, DType::kQ4_0},  {3, DType::kQ4_1},
              {6, DType::kQ5_0},    {7, DType::kQ5_1},  {8, DType::kQ8_0},  {10, DType::kQ2_K},
              {11, DType::kQ3_K},   {12, DType::kQ4_K}, {13, DType::kQ5_K}, {14, DType::kQ6_K},
              {20, DType::kIQ4_NL}, {30, DType::kBF16}};
  for (const auto& m : kMap) {
    if (m.ggml == type) {
      *out = m.dtype;
      return true;
    }
  }
  return false;
}

bool IsValidType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

// Smallest encoding of one value of `type`; used to bound element counts by
// the bytes that remain, before anything is allocated.
size_t MinEncodedSize(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
    case GgufType::kString:
      return 8;
    case GgufType::kArray:
      return 12;  // element type + count
  }
  return 1;
}

// Sequential little-endian reader over caller-owned bytes.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  Status Need(uint64_t n, const std::string& what) const {
    if (n > remaining()) {
      return Status::Error("truncated file: " + what + " needs " + std::to_string(n) +
                           " bytes at offset " + std::to_string(pos_) + ", only " +
                           std::to_string(remaining()) + " remain");
    }
    return Status::Ok();
  }
  template <typename T>
  Status Read(T* out, const std::string& what) {
    KVQ_RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(out, data_ + pos_, sizeof(T));  // host is little-endian, as is GGUF
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status ReadString(std::string* out, const std::string& what) {
    uint64_t len = 0;
    KVQ_RETURN_IF_ERROR(Read(&len, what + " length"));
    if (len > remaining()) {
      return Status::Error("string length " + std::to_string(len) + " of " + what + " at offset " +
                           std::to_string(pos_ - 8) + " exceeds the " +
                           std::to_string(remaining()) + " bytes that remain");
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return Status::Ok();
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

Status ReadValue(Reader& r, GgufType type, int depth, const std::string& what, GgufValue* out);

Status ReadArray(Reader& r, int depth, const std::string& what, GgufValue* out) {
  if (depth >= kMaxArrayDepth) {
    return Status::Error(what + ": arrays nested deeper than " + std::to_string(kMaxArrayDepth));
  }
  uint32_t elem_type = 0;
  KVQ_RETURN_IF_ERROR(r.Read(&elem_type, what + " array element type"));
  if (!IsValidType(elem_type)) {
    return Status::Error(what + ": invalid array element type " + std::to_string(elem_type));
  }
  uint64_t count = 0;
  KVQ_RETURN_IF_ERROR(r.Read(&count, what + " array length"));
  out->element_type = static_cast<GgufType>(elem_type);
  const size_t min_size = MinEncodedSize(out->element_type);
  if (count > r.remaining() / min_size) {
    return Status::Error(what + ": array of " + std::to_string(count) + " " +
                         GgufTypeName(out->element_type) + " elements needs at least " +
                         (count > std::numeric_limits<uint64_t>::max() / min_size
                              ? std::string("more")
                              : std::to_string(count * min_size)) +
                         " bytes but only " + std::to_string(r.remaining()) + " remain");
  }
  out->elements.resize(static_cast<size_t>(count));
  for (auto& element : out->elements) {
    KVQ_RETURN_IF_ERROR(ReadValue(r, out->element_type, depth + 1, what, &element));
  }
  return Status::Ok();
}

Status ReadValue(Reader& r, GgufType type, int depth, const std::string& what, GgufValue* out) {
  out->type = type;
  switch (type) {
    case GgufType::kUint8: {
      uint8_t v = 0;
      KVQ_RETURN_IF_ERROR(r.Read(&v, what));
      out->as_uint = v;
      return Status::Ok();
    }
    case GgufType::kBool: {
      uint8_t v = 0;
      KVQ_RETURN_IF_ERROR(r.Read(&v, what));
      out->as_uint = v != 0;
      return Status::Ok();
    }
    case GgufType::kInt8: {
      int8_t v = 0;
      KVQ_RETURN_IF_ERROR(r.Read(&v, what));
      out->as_int = v;
      return Status::Ok();
    }
    case GgufType::kUint16: {
      uint16_t v = 0;
      KVQ_RETURN_IF_ERROR(r.Read(&v, what));
      out->as_uint = v;
      return Status::Ok();
    }
    case GgufType::kInt16: {
      int16_t v = 0;
      KVQ_RETURN_IF_ERROR(r.Read(&v, what));
      out->as_int = v;
      return Status::Ok();
    }
    case GgufType::kUint32: {
      uint32_t v = 0;
      KVQ_RETURN_IF_ERROR(r.Read(&v, what));
      out->as_uint = v;
      return Status::Ok();
    }
    case GgufType::kInt32: {
      int32_t v = 0;
      KVQ_RETURN_IF_ERROR(r.Read(&v, what));
      out->as_int = v;
      return Status::Ok();
    }
    case GgufType::kUint64:
      return r.Read(&out->as_uint, what);
    case GgufType::kInt64:
      return r.Read(&out->as_int, what);
    case GgufType::kFloat32: {
      float v = 0;
      KVQ_RETURN_IF_ERROR(r.Read(&v, what));
      out->as_float = v;
      return Status::Ok();
    }
    case GgufType::kFloat64:
      return r.Read(&out->as_float, what);
    case GgufType::kString:
      return r.ReadString(&out->as_string, what);
    case GgufType::kArray:
      return ReadArray(r, depth, what, out);
  }
  return Status::Error(what + ": invalid value type");
}

bool IsFloat(GgufType t) { return t == GgufType::kFloat32 || t == GgufType::kFloat64; }

// Integer value of `v`, or an error naming `key`.
StatusOr<int64_t> AsInt(const GgufValue& v, std::string_view key) {
  if (GgufTypeIsSigned(v.type)) return v.as_int;
  if (GgufTypeIsUnsigned(v.type)) {
    if (v.as_uint > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Status::Error("metadata key '" + std::string(key) + "': value " +
                           std::to_string(v.as_uint) + " does not fit in int64");
    }
    return static_cast<int64_t>(v.as_uint);
  }
  return Status::Error("metadata key '" + std::string(key) + "' has type " + GgufTypeName(v.type) +
                       ", expected an integer");
}

StatusOr<double> AsFloat(const GgufValue& v, std::string_view key) {
  if (IsFloat(v.type)) return v.as_float;
  if (GgufTypeIsSigned(v.type)) return static_cast<double>(v.as_int);
  if (GgufTypeIsUnsigned(v.type)) return static_cast<double>(v.as_uint);
  return Status::Error("metadata key '" + std::string(key) + "' has type " + GgufTypeName(v.type) +
                       ", expected a number");
}

using Metadata = std::vector<std::pair<std::string, GgufValue>>;

// Magic and version; then the two counts, each bounded by the bytes left.
Status ReadHeader(Reader& r, uint32_t* version, uint64_t* n_tensors, uint64_t* n_kv) {
  char magic[4];
  KVQ_RETURN_IF_ERROR(r.Read(&magic, "magic"));
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    return Status::Error("not a GGUF file (magic bytes are not 'GGUF')");
  }
  KVQ_RETURN_IF_ERROR(r.Read(version, "version"));
  if ((*version & 0xFFFFu) == 0 && *version != 0) {
    return Status::Error("big-endian GGUF files are not supported");
  }
  if (*version != 2 && *version != 3) {
    return Status::Error("unsupported GGUF version " + std::to_string(*version) +
                         " (supported: 2, 3)");
  }
  KVQ_RETURN_IF_ERROR(r.Read(n_tensors, "tensor count"));
  KVQ_RETURN_IF_ERROR(r.Read(n_kv, "metadata count"));
  // A key-value pair takes at least 13 bytes (key length, type, one byte).
  if (*n_kv > r.remaining() / 13) {
    return Status::Error("metadata count " + std::to_string(*n_kv) + " is impossible: only " +
                         std::to_string(r.remaining()) + " bytes remain");
  }
  // A tensor info takes at least 24 bytes (name length, n_dims, type, offset).
  if (*n_tensors > r.remaining() / 24) {
    return Status::Error("tensor count " + std::to_string(*n_tensors) + " is impossible: only " +
                         std::to_string(r.remaining()) + " bytes remain");
  }
  return Status::Ok();
}

Status ReadMetadata(Reader& r, uint64_t n_kv, Metadata* metadata) {
  std::unordered_set<std::string> keys;
  metadata->reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    KVQ_RETURN_IF_ERROR(r.ReadString(&key, "metadata key #" + std::to_string(i)));
    if (!keys.insert(key).second) {
      return Status::Error("duplicate metadata key '" + key + "'");
    }
    const std::string what = "metadata key '" + key + "'";
    uint32_t type = 0;
    KVQ_RETURN_IF_ERROR(r.Read(&type, what + " type"));
    if (!IsValidType(type)) {
      return Status::Error(what + ": invalid value type " + std::to_string(type));
    }
    GgufValue value;
    KVQ_RETURN_IF_ERROR(ReadValue(r, static_cast<GgufType>(type), 0, what, &value));
    metadata->emplace_back(std::move(key), std::move(value));
  }
  return Status::Ok();
}

// general.alignment when present (a power of two up to 2^30), else the default.
StatusOr<size_t> ReadAlignment(const GgufValue* value) {
  if (value == nullptr) return kGgufDefaultAlignment;
  KVQ_ASSIGN_OR_RETURN(int64_t v, AsInt(*value, "general.alignment"));
  if (v <= 0 || !GgufAlignmentIsValid(static_cast<uint64_t>(v))) {
    return Status::Error("general.alignment " + std::to_string(v) +
                         " is not a power of two (up to 2^30)");
  }
  return static_cast<size_t>(v);
}

// A tensor's dimensions (GGUF lists the fastest-varying first; TensorRef
// keeps the outermost first) and its element count, each checked.
Status ReadShape(Reader& r, const std::string& what, TensorRef* t, int64_t* row_length,
                 int64_t* count) {
  uint32_t n_dims = 0;
  KVQ_RETURN_IF_ERROR(r.Read(&n_dims, what + " dimension count"));
  if (n_dims == 0 || n_dims > kGgufMaxDims) {
    return Status::Error(what + " has " + std::to_string(n_dims) +
                         " dimensions (supported: 1 to 4)");
  }
  int64_t ne[kGgufMaxDims];
  for (uint32_t d = 0; d < n_dims; ++d) {
    KVQ_RETURN_IF_ERROR(r.Read(&ne[d], what + " dimensions"));
  }
  *count = 1;
  for (uint32_t d = n_dims; d-- > 0;) {
    t->shape.push_back(ne[d]);
    if (ne[d] <= 0) {
      return Status::Error(what + " has non-positive dimension " + std::to_string(ne[d]));
    }
    if (__builtin_mul_overflow(*count, ne[d], count)) {
      return Status::Error(what + ": element count overflows");
    }
  }
  *row_length = ne[0];
  return Status::Ok();
}

// Where a tensor's bytes lie, relative to the data section.
struct TensorSpan {
  uint64_t offset;
  size_t nbytes;
  size_t index;  // into the file's tensors
};

// One tensor info: name, shape, type and offset, each checked against the
// file (`file_size` bounds the element count, which keeps the byte count
// from overflowing).
Status ReadTensorInfo(Reader& r, uint64_t i, size_t alignment, size_t file_size,
                      std::unordered_set<std::string>* names, TensorRef* t, uint64_t* offset) {
  KVQ_RETURN_IF_ERROR(r.ReadString(&t->name, "tensor #" + std::to_string(i) + " name"));
  if (!names->insert(t->name).second) {
    return Status::Error("duplicate tensor name '" + t->name + "'");
  }
  const std::string what = "tensor '" + t->name + "'";
  int64_t row_length = 0, count = 0;
  KVQ_RETURN_IF_ERROR(ReadShape(r, what, t, &row_length, &count));
  uint32_t ggml_type = 0;
  KVQ_RETURN_IF_ERROR(r.Read(&ggml_type, what + " type"));
  if (!GgmlToDType(ggml_type, &t->dtype)) {
    const char* type_name = GgmlTypeName(ggml_type);
    return Status::Error("unsupported tensor type " +
                         (type_name ? std::string(type_name) : std::to_string(ggml_type)) +
                         " in tensor '" + t->name +
                         "' (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
                         "IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)");
  }
  const int64_t block = DTypeBlockSize(t->dtype);
  if (row_length % block != 0) {
    return Status::Error(what + " is " + DTypeName(t->dtype) + " but its row length " +
                         std::to_string(row_length) + " is not a multiple of " +
                         std::to_string(block));
  }
  KVQ_RETURN_IF_ERROR(r.Read(offset, what + " offset"));
  if (*offset % alignment != 0) {
    return Status::Error(what + " data offset " + std::to_string(*offset) +
                         " is not a multiple of the alignment " + std::to_string(alignment));
  }
  if (static_cast<uint64_t>(count) > file_size) {
    return Status::Error(what + " of shape " + ShapeString(t->shape) + " (" +
                         std::to_string(count) + " elements) cannot fit in a file of " +
                         std::to_string(file_size) + " bytes");
  }
  t->nbytes = DTypeBytes(t->dtype, count);
  return Status::Ok();
}

// Points each tensor at its bytes; every tensor must lie inside the file and
// none may overlap another.
Status PlaceTensors(const uint8_t* data, size_t size, uint64_t data_start,
                    std::vector<TensorSpan> spans, std::vector<TensorRef>* tensors) {
  for (const TensorSpan& span : spans) {
    TensorRef& t = (*tensors)[span.index];
    // data_start <= size + alignment and offset, nbytes <= 2^64 / 2: no overflow
    // is possible in 64-bit, but check explicitly to say so.
    uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(data_start, span.offset, &begin) ||
        __builtin_add_overflow(begin, static_cast<uint64_t>(span.nbytes), &end) || end > size) {
      return Status::Error("tensor '" + t.name + "' extends past end of file (offset " +
                           std::to_string(begin) + " + " + std::to_string(span.nbytes) + " > " +
                           std::to_string(size) + ")");
    }
    t.data = data + begin;
  }
  std::sort(spans.begin(), spans.end(),
            [](const TensorSpan& a, const TensorSpan& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < spans.size(); ++i) {
    const TensorSpan& prev = spans[i - 1];
    if (prev.offset + prev.nbytes > spans[i].offset) {
      return Status::Error("tensor '" + (*tensors)[prev.index].name + "' (offset " +
                           std::to_string(prev.offset) + ", " + std::to_string(prev.nbytes) +
                           " bytes) overlaps tensor '" + (*tensors)[spans[i].index].name +
                           "' (offset " + std::to_string(spans[i].offset) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

const char* GgufTypeName(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
      return "uint8";
    case GgufType::kInt8:
      return "int8";
    case GgufType::kUint16:
      return "uint16";
    case GgufType::kInt16:
      return "int16";
    case GgufType::kUint32:
      return "uint32";
    case GgufType::kInt32:
      return "int32";
    case GgufType::kFloat32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "uint64";
    case GgufType::kInt64:
      return "int64";
    case GgufType::kFloat64:
      return "float64";
  }
  return "?";
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> map, MappedFile::Open(path));
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, Parse(map->data(), map->size(), path));
  file->map_ = std::move(map);  // tensor pointers stay valid: the mapping does not move
  return file;
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(const uint8_t* data, size_t size,
                                                    const std::string& name) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->name_ = name;
  Status st = file->ParseImpl(data, size);
  if (!st.ok()) return st.WithContext(name);
  return file;
}

Status GgufFile::ParseImpl(const uint8_t* data, size_t size) {
  Reader r(data, size);
  uint64_t n_tensors = 0, n_kv = 0;
  KVQ_RETURN_IF_ERROR(ReadHeader(r, &version_, &n_tensors, &n_kv));
  KVQ_RETURN_IF_ERROR(ReadMetadata(r, n_kv, &metadata_));
  KVQ_ASSIGN_OR_RETURN(alignment_, ReadAlignment(Find("general.alignment")));

  std::vector<TensorSpan> spans;
  std::unordered_set<std::string> names;
  tensors_.reserve(static_cast<size_t>(n_tensors));
  spans.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorRef t;
    uint64_t offset = 0;
    KVQ_RETURN_IF_ERROR(ReadTensorInfo(r, i, alignment_, size, &names, &t, &offset));
    spans.push_back({offset, t.nbytes, tensors_.size()});
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const size_t header_end = r.pos();
  const uint64_t data_start =
      (static_cast<uint64_t>(header_end) + alignment_ - 1) / alignment_ * alignment_;
  data_offset_ = static_cast<size_t>(std::min<uint64_t>(data_start, size));
  return PlaceTensors(data, size, data_start, std::move(spans), &tensors_);
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return &v;
  }
  return nullptr;
}

const TensorRef* GgufFile::FindTensor(std::string_view name) const {
  for (const TensorRef& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {
Status Missing(const std::string& file, std::string_view key) {
  return Status::Error(file + ": metadata key '" + std::string(key) + "' is missing");
}
Status WrongType(const std::string& file, std::string_view key, const GgufValue& v,
                 const char* expected) {
  std::string type = GgufTypeName(v.type);
  if (v.type == GgufType::kArray) type += " of " + std::string(GgufTypeName(v.element_type));
  return Status::Error(file + ": metadata key '" + std::string(key) + "' has type " + type +
                       ", expected " + expected);
}
}  // namespace

StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(name_, key);
  if (v->type != GgufType::kString) return WrongType(name_, key, *v, "string");
  return v->as_string;
}

StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(name_, key);
  StatusOr<int64_t> r = AsInt(*v, key);
  if (!r.ok()) return r.status().WithContext(name_);
  return r;
}

StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(name_, key);
  StatusOr<double> r = AsFloat(*v, key);
  if (!r.ok()) return r.status().WithContext(name_);
  return r;
}

StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(name_, key);
  if (v->type != GgufType::kBool) return WrongType(name_, key, *v, "bool");
  return v->as_uint != 0;
}

StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(name_, key);
  if (v->type != GgufType::kArray || v->element_type != GgufType::kString) {
    return WrongType(name_, key, *v, "array of string");
  }
  std::vector<std::string> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements) out.push_back(e.as_string);
  return out;
}

StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(name_, key);
  if (v->type != GgufType::kArray ||
      !(GgufTypeIsSigned(v->element_type) || GgufTypeIsUnsigned(v->element_type))) {
    return WrongType(name_, key, *v, "array of integers");
  }
  std::vector<int64_t> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements) {
    StatusOr<int64_t> x = AsInt(e, key);
    if (!x.ok()) return x.status().WithContext(name_);
    out.push_back(*x);
  }
  return out;
}

StatusOr<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(name_, key);
  if (v->type != GgufType::kArray ||
      !(IsFloat(v->element_type) || GgufTypeIsSigned(v->element_type) ||
        GgufTypeIsUnsigned(v->element_type))) {
    return WrongType(name_, key, *v, "array of numbers");
  }
  std::vector<double> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements) {
    StatusOr<double> x = AsFloat(e, key);
    if (!x.ok()) return x.status().WithContext(name_);
    out.push_back(*x);
  }
  return out;
}

}  // namespace kvq
