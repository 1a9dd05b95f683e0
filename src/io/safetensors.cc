// safetensors reader and writer. The JSON header is parsed with exceptions
// disabled and every value's type is checked before it is read, so nothing
// in nlohmann::json can throw across our API; every offset is checked against
// the file with overflow-safe arithmetic before a pointer is formed.
#include "io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_set>

namespace kvq {
namespace {

using json = nlohmann::json;

bool DTypeFromName(const std::string& s, DType* out) {
  if (s == "F32")
    *out = DType::kF32;
  else if (s == "F16")
    *out = DType::kF16;
  else if (s == "BF16")
    *out = DType::kBF16;
  else
    return false;
  return true;
}

// JSON strings may hold anything; keep error messages printable and short.
std::string Printable(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 200)) {
    out += (static_cast<unsigned char>(c) < 0x20) ? '?' : c;
  }
  return out;
}

// A tensor's shape: at most 8 non-negative dimensions whose product fits int64.
Status ReadShape(const json& shape, const std::string& what, TensorRef* t, int64_t* count) {
  if (shape.size() > 8) {
    return Status::Error(what + " has " + std::to_string(shape.size()) + " dimensions");
  }
  *count = 1;
  for (const json& d : shape) {
    if (!d.is_number_unsigned()) {
      return Status::Error(what + ": shape entries must be non-negative integers");
    }
    const uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(INT64_MAX) ||
        __builtin_mul_overflow(*count, static_cast<int64_t>(dim), count)) {
      return Status::Error(what + ": element count overflows");
    }
    t->shape.push_back(static_cast<int64_t>(dim));
  }
  return Status::Ok();
}

// Where a tensor's bytes lie in the data section.
struct Span {
  uint64_t begin, end;
  size_t index;  // into the file's tensors
};

// One header entry: dtype, shape and data_offsets, each of the right JSON
// type, the bytes inside the data section and exactly as many as the shape
// needs.
Status ReadTensorEntry(const std::string& key, const json& entry, const uint8_t* base,
                       uint64_t data_size, TensorRef* t, Span* span) {
  const std::string what = "tensor '" + Printable(key) + "'";
  if (!entry.is_object()) return Status::Error(what + ": header entry is not an object");
  const auto dtype_it = entry.find("dtype");
  const auto shape_it = entry.find("shape");
  const auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return Status::Error(what + ": missing or non-string 'dtype'");
  }
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return Status::Error(what + ": missing or non-array 'shape'");
  }
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return Status::Error(what + ": 'data_offsets' must be two non-negative integers");
  }
  t->name = key;
  const std::string dtype_name = dtype_it->get<std::string>();
  if (!DTypeFromName(dtype_name, &t->dtype)) {
    return Status::Error(what + " has unsupported dtype " + Printable(dtype_name) +
                         " (supported: F32, F16, BF16)");
  }
  int64_t count = 0;
  KVQ_RETURN_IF_ERROR(ReadShape(*shape_it, what, t, &count));
  const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
  const uint64_t end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end) {
    return Status::Error(what + ": data_offsets [" + std::to_string(begin) + ", " +
                         std::to_string(end) + "] are out of order");
  }
  if (end > data_size) {
    return Status::Error(what + " extends past end of file (data offset " + std::to_string(end) +
                         " > data size " + std::to_string(data_size) + ")");
  }
  // count <= INT64_MAX and the element size is at most 4: compare in 128 bits.
  const unsigned __int128 expected =
      static_cast<unsigned __int128>(count) * (t->dtype == DType::kF32 ? 4 : 2);
  if (expected != end - begin) {
    return Status::Error(
        what + ": " + std::to_string(end - begin) + " data bytes, but " + dtype_name + " " +
        ShapeString(t->shape) + " needs " +
        std::to_string(static_cast<uint64_t>(std::min<unsigned __int128>(expected, UINT64_MAX))));
  }
  t->data = base + begin;
  t->nbytes = static_cast<size_t>(end - begin);
  span->begin = begin;
  span->end = end;
  return Status::Ok();
}

// Sorts the tensors into data order (so a reader walking them walks the file
// forward), refusing any two that overlap.
Status OrderByData(std::vector<Span> spans, std::vector<TensorRef>* tensors) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].begin < spans[i - 1].end) {
      return Status::Error("tensor '" + Printable((*tensors)[spans[i - 1].index].name) +
                           "' overlaps tensor '" + Printable((*tensors)[spans[i].index].name) +
                           "'");
    }
  }
  std::vector<TensorRef> ordered;
  ordered.reserve(tensors->size());
  for (const Span& s : spans) ordered.push_back(std::move((*tensors)[s.index]));
  *tensors = std::move(ordered);
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> map, MappedFile::Open(path));
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                       Parse(map->data(), map->size(), path));
  file->map_ = std::move(map);
  return file;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(const uint8_t* data, size_t size,
                                                                  const std::string& name) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->name_ = name;
  Status st = file->ParseImpl(data, size);
  if (!st.ok()) return st.WithContext(name);
  return file;
}

Status SafetensorsFile::ParseImpl(const uint8_t* data, size_t size) {
  if (size < 8) {
    return Status::Error("truncated file: " + std::to_string(size) +
                         " bytes, too short for the 8-byte header length");
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, data, 8);
  if (header_len > size - 8) {
    return Status::Error("header length " + std::to_string(header_len) + " exceeds the file size " +
                         std::to_string(size));
  }
  const char* header = reinterpret_cast<const char*>(data + 8);
  const json root = json::parse(header, header + header_len, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Status::Error("malformed JSON header");
  if (!root.is_object()) return Status::Error("JSON header is not an object");

  const uint8_t* base = data + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  std::vector<Span> spans;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      // Free-form pairs (calibration files record what they describe). The
      // format says string to string; other writers put anything there, so
      // non-string values are skipped rather than refused.
      if (!it.value().is_object()) continue;
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    TensorRef t;
    Span span{0, 0, tensors_.size()};
    KVQ_RETURN_IF_ERROR(ReadTensorEntry(it.key(), it.value(), base, data_size, &t, &span));
    spans.push_back(span);
    tensors_.push_back(std::move(t));
  }
  return OrderByData(std::move(spans), &tensors_);
}

const TensorRef* SafetensorsFile::Find(std::string_view name) const {
  for (const TensorRef& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

StatusOr<SafetensorsSet> OpenSafetensorsFolder(const std::string& dir) {
  namespace fs = std::filesystem;
  SafetensorsSet set;
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    KVQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(index_path));
    const json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded()) return Status::Error(index_path + ": malformed JSON");
    const auto map_it = index.is_object() ? index.find("weight_map") : index.end();
    if (map_it == index.end() || !map_it->is_object()) {
      return Status::Error(index_path + ": missing object 'weight_map'");
    }
    // Shards in first-mention order; each tensor must be where the map says.
    std::vector<std::string> shards;
    std::vector<std::pair<std::string, std::string>> wanted;  // tensor, shard
    for (auto it = map_it->begin(); it != map_it->end(); ++it) {
      if (!it.value().is_string()) {
        return Status::Error(index_path + ": weight_map entry '" + Printable(it.key()) +
                             "' is not a string");
      }
      const std::string shard = it.value().get<std::string>();
      // Shards are siblings of the index; never follow a path out of the folder.
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
        return Status::Error(index_path + ": invalid shard file name '" + Printable(shard) + "'");
      }
      if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
      wanted.emplace_back(it.key(), shard);
    }
    if (shards.empty()) return Status::Error(index_path + ": weight_map is empty");
    for (const std::string& shard : shards) {
      KVQ_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f,
                           SafetensorsFile::Open((fs::path(dir) / shard).string()));
      set.files.push_back(std::move(f));
    }
    for (const auto& [tensor, shard] : wanted) {
      const size_t i = std::find(shards.begin(), shards.end(), shard) - shards.begin();
      if (set.files[i]->Find(tensor) == nullptr) {
        return Status::Error(index_path + ": tensor '" + Printable(tensor) + "' is mapped to " +
                             shard + " but that file does not contain it");
      }
    }
  } else {
    KVQ_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f,
                         SafetensorsFile::Open((fs::path(dir) / "model.safetensors").string()));
    set.files.push_back(std::move(f));
  }
  std::unordered_set<std::string> seen;
  for (const auto& f : set.files) {
    for (const TensorRef& t : f->tensors()) {
      if (!seen.insert(t.name).second) {
        return Status::Error(f->name() + ": tensor '" + Printable(t.name) +
                             "' also appears in another shard");
      }
      set.tensors.push_back(t);
    }
  }
  return set;
}

// ---------------------------------------------------------------------------
// Writer

Status SafetensorsWriter::AddTensor(std::string name, DType dtype, std::vector<int64_t> shape,
                                    const void* data, size_t nbytes) {
  if (DTypeIsQuantized(dtype)) {
    return Status::Error("tensor '" + name + "': safetensors cannot store " + DTypeName(dtype));
  }
  KVQ_RETURN_IF_ERROR(CheckTensorBytes(name, dtype, shape, nbytes, /*allow_zero_dims=*/true));
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  return AddTensorFn(std::move(name), dtype, std::move(shape),
                     [copy = std::vector<uint8_t>(bytes, bytes + nbytes)](uint8_t* out) {
                       std::memcpy(out, copy.data(), copy.size());
                     });
}

Status SafetensorsWriter::AddTensorFn(std::string name, DType dtype, std::vector<int64_t> shape,
                                      std::function<void(uint8_t* out)> fill) {
  if (DTypeIsQuantized(dtype)) {
    return Status::Error("tensor '" + name + "': safetensors cannot store " + DTypeName(dtype));
  }
  if (name == "__metadata__") return Status::Error("tensor name '__metadata__' is reserved");
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(count, d, &count)) {
      return Status::Error("tensor '" + name + "': invalid shape " + ShapeString(shape));
    }
  }
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) return Status::Error("duplicate tensor name '" + name + "'");
  }
  const size_t nbytes = DTypeBytes(dtype, count);
  tensors_.push_back({std::move(name), dtype, std::move(shape), nbytes, std::move(fill)});
  return Status::Ok();
}

void SafetensorsWriter::SetMetadata(std::string key, std::string value) {
  metadata_.emplace_back(std::move(key), std::move(value));
}

Status SafetensorsWriter::Write(const std::string& path) const {
  // ordered_json keeps tensors in the order added, as they are in the data.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  // Replace invalid UTF-8 instead of throwing: names come from callers.
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // Pad with spaces so the data section starts 64-byte aligned.
  text.resize((8 + text.size() + 63) / 64 * 64 - 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::Error(path + ": cannot open for writing: " + std::strerror(errno));
  const uint64_t len = text.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<uint8_t> buffer;
  for (const PendingTensor& t : tensors_) {
    buffer.assign(t.nbytes, 0);
    t.fill(buffer.data());
    out.write(reinterpret_cast<const char*>(buffer.data()),
              static_cast<std::streamsize>(buffer.size()));
    if (!out) break;
  }
  out.flush();
  if (!out) return Status::Error(path + ": write failed: " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace kvq
