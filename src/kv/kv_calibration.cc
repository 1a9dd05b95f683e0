#include "kv/kv_calibration.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>

#include "base/fp16.h"
#include "io/safetensors.h"
#include "kv/codec_formats.h"

namespace kvq {
namespace {

constexpr int kCalibrationBits[] = {2, 3, 4};
constexpr float kMinChannelScale = 0x1p-14f;  // f16's smallest normal
constexpr float kMaxChannelScale = 65504.0f;  // f16's largest finite

std::string LevelsName(int bits, bool is_v) {
  return "nuq" + std::to_string(bits) + (is_v ? ".v" : ".k") + ".levels";
}

StatusOr<std::vector<float>> ReadF32(const SafetensorsFile& file, const std::string& name,
                                     const std::vector<int64_t>& shape) {
  const TensorRef* t = file.Find(name);
  if (t == nullptr) return Status::Error("calibration file lacks tensor '" + name + "'");
  if (t->dtype != DType::kF32 || t->shape != shape) {
    return Status::Error("calibration tensor '" + name + "' is " + DTypeName(t->dtype) + " " +
                         ShapeString(t->shape) + ", expected F32 " + ShapeString(shape));
  }
  std::vector<float> values(static_cast<size_t>(t->NumElements()));
  std::memcpy(values.data(), t->data, values.size() * sizeof(float));
  return values;
}

StatusOr<int64_t> MetaInt(const std::map<std::string, std::string>& meta, const std::string& key,
                          int64_t min_value) {
  const auto it = meta.find(key);
  if (it == meta.end()) return Status::Error("calibration metadata lacks '" + key + "'");
  const std::string& text = it->second;
  if (text.empty() || text.size() > 12 ||
      text.find_first_not_of("0123456789") != std::string::npos || std::stoll(text) < min_value) {
    return Status::Error("calibration metadata '" + key + "' = '" + text +
                         "' is not an integer >= " + std::to_string(min_value));
  }
  return std::stoll(text);
}

std::string MetaString(const std::map<std::string, std::string>& meta, const std::string& key) {
  const auto it = meta.find(key);
  return it == meta.end() ? "" : it->second;
}

Status CheckFp8Scales(const std::vector<float>& scales, const std::string& what) {
  for (size_t l = 0; l < scales.size(); ++l) {
    if (!std::isfinite(scales[l]) || !(scales[l] > 0.0f)) {
      return Status::Error(what + " of layer " + std::to_string(l) + " is " +
                           std::to_string(scales[l]) +
                           ": an fp8 scale must be finite and > 0 (x is stored as x / scale)");
    }
  }
  return Status::Ok();
}

// OSCAR's rotations (format 2): both tensors, finite and orthogonal.
Status LoadRotations(const SafetensorsFile& file, KvCalibration* c) {
  c->rotation_objective = MetaString(file.metadata(), "rotation");
  if (c->rotation_objective.empty()) return Status::Ok();
  if (c->head_dim > kMaxCodecHeadDim) return Status::Error("calibration: head_dim too large");
  const int64_t d = c->head_dim;
  const std::vector<int64_t> shape{c->num_layers, c->num_kv_heads, d, d};
  for (bool is_v : {false, true}) {
    const std::string name = is_v ? "oscar.v.rotation" : "oscar.k.rotation";
    KVQ_ASSIGN_OR_RETURN(std::vector<float> m, ReadF32(file, name, shape));
    for (size_t i = 0; i < m.size(); i += static_cast<size_t>(d * d)) {
      // f32 storage of an orthogonal matrix is orthogonal to ~1e-6; 1e-3
      // only refuses matrices that are not rotations at all (or NaN).
      const double error = OrthogonalityError(&m[i], d);
      if (!(error <= 1e-3)) {
        return Status::Error("calibration tensor '" + name + "': matrix " +
                             std::to_string(i / static_cast<size_t>(d * d)) +
                             " is not orthogonal (max |M Mt - I| = " + std::to_string(error) + ")");
      }
    }
    (is_v ? c->v_rotation : c->k_rotation) = std::move(m);
  }
  return Status::Ok();
}

// One F32 (or F16/BF16) scalar, shape [] or [1], as checkpoints store k_scale.
StatusOr<float> ReadScalar(const TensorRef& t) {
  if (t.NumElements() != 1) {
    return Status::Error("tensor '" + t.name + "' has shape " + ShapeString(t.shape) +
                         "; a per-tensor KV scale has one element");
  }
  if (t.dtype == DType::kF32) {
    float v;
    std::memcpy(&v, t.data, sizeof v);
    return v;
  }
  uint16_t bits;
  if (t.dtype == DType::kF16 || t.dtype == DType::kBF16) std::memcpy(&bits, t.data, sizeof bits);
  if (t.dtype == DType::kF16) return F16ToF32(bits);
  if (t.dtype == DType::kBF16) return Bf16ToF32(bits);
  return Status::Error("tensor '" + t.name + "' is " + DTypeName(t.dtype) +
                       "; a KV scale must be F32, F16 or BF16");
}

// A vLLM KV-scale file: model.layers.N.self_attn.{k,v}_scale for N = 0..L-1.
Status LoadVllmScales(const SafetensorsFile& file, KvCalibration* c) {
  c->scales_only = true;
  for (int64_t l = 0;; ++l) {
    const TensorRef* k = file.Find(VllmKvScaleName(l, false));
    const TensorRef* v = file.Find(VllmKvScaleName(l, true));
    if (k == nullptr && v == nullptr) break;
    if (k == nullptr || v == nullptr) {
      return Status::Error("vLLM KV-scale file lacks '" + VllmKvScaleName(l, k != nullptr) + "'");
    }
    KVQ_ASSIGN_OR_RETURN(const float ks, ReadScalar(*k));
    KVQ_ASSIGN_OR_RETURN(const float vs, ReadScalar(*v));
    c->fp8_k_scale.push_back(ks);
    c->fp8_v_scale.push_back(vs);
  }
  c->num_layers = static_cast<int64_t>(c->fp8_k_scale.size());
  KVQ_RETURN_IF_ERROR(CheckFp8Scales(c->fp8_k_scale, "k_scale"));
  return CheckFp8Scales(c->fp8_v_scale, "v_scale");
}

Status LoadInto(const SafetensorsFile& file, KvCalibration* c) {
  const auto& meta = file.metadata();
  const std::string format = MetaString(meta, "format");
  if (format != kKvCalibrationFormat && format != kKvCalibrationFormatV1 &&
      file.Find(VllmKvScaleName(0, false)) != nullptr) {
    return LoadVllmScales(file, c);
  }
  if (format != kKvCalibrationFormat && format != kKvCalibrationFormatV1) {
    return Status::Error("not a kvq calibration file (metadata format '" + format +
                         "', expected '" + kKvCalibrationFormat + "' or '" +
                         kKvCalibrationFormatV1 + "'; make one with kvq calibrate)");
  }
  c->format_version = format == kKvCalibrationFormatV1 ? 1 : 2;
  KVQ_ASSIGN_OR_RETURN(c->num_layers, MetaInt(meta, "num_layers", 1));
  KVQ_ASSIGN_OR_RETURN(c->num_heads, MetaInt(meta, "num_heads", 1));
  KVQ_ASSIGN_OR_RETURN(c->num_kv_heads, MetaInt(meta, "num_kv_heads", 1));
  KVQ_ASSIGN_OR_RETURN(c->head_dim, MetaInt(meta, "head_dim", 1));
  KVQ_ASSIGN_OR_RETURN(c->tokens, MetaInt(meta, "tokens", 0));
  KVQ_ASSIGN_OR_RETURN(c->outlier_percent, MetaInt(meta, "outlier_percent", 0));
  c->method = MetaString(meta, "method");
  c->qnorm = MetaString(meta, "qnorm") == "1";
  c->model = MetaString(meta, "model");
  const std::vector<int64_t> channels{c->num_layers, c->num_kv_heads, c->head_dim};
  KVQ_ASSIGN_OR_RETURN(c->k_offset, ReadF32(file, "k.channel_offset", channels));
  KVQ_ASSIGN_OR_RETURN(c->k_scale, ReadF32(file, "k.channel_scale", channels));
  for (size_t i = 0; i < c->k_scale.size(); ++i) {
    if (!std::isfinite(c->k_offset[i]) || !(c->k_scale[i] >= kMinChannelScale) ||
        !(c->k_scale[i] <= kMaxChannelScale)) {
      return Status::Error("calibration tensor 'k.channel_scale'/'k.channel_offset' entry " +
                           std::to_string(i) + " is out of range (scale " +
                           std::to_string(c->k_scale[i]) + ", offset " +
                           std::to_string(c->k_offset[i]) + ")");
    }
  }
  std::stringstream bits_list(MetaString(meta, "bits"));
  std::string item;
  while (std::getline(bits_list, item, ',')) {
    int bits = 0;
    for (int b : kCalibrationBits) bits = item == std::to_string(b) ? b : bits;
    if (bits == 0)
      return Status::Error("calibration metadata bits: '" + item + "' is not 2, 3 or 4");
    KvCalibration::Codebooks books;
    const std::vector<int64_t> shape{c->num_layers, int64_t{1} << bits};
    for (bool is_v : {false, true}) {
      const std::string name = LevelsName(bits, is_v);
      KVQ_ASSIGN_OR_RETURN(std::vector<float> levels, ReadF32(file, name, shape));
      for (size_t i = 0; i < levels.size(); ++i) {
        const bool sorted = i % shape[1] == 0 || levels[i - 1] <= levels[i];
        if (!std::isfinite(levels[i]) || std::fabs(levels[i]) > kMaxChannelScale || !sorted) {
          return Status::Error("calibration tensor '" + name + "': levels must be finite and " +
                               "sorted (entry " + std::to_string(i) + ")");
        }
      }
      (is_v ? books.v : books.k) = std::move(levels);
    }
    c->codebooks[bits] = std::move(books);
  }
  if (c->codebooks.empty()) return Status::Error("calibration file has no codebooks (bits)");
  // Version 1 files have neither fp8 scales nor rotations; version 2 ones may
  // have either, both or none.
  if (c->format_version >= 2 && file.Find("fp8.k_scale") != nullptr) {
    const std::vector<int64_t> layers{c->num_layers};
    KVQ_ASSIGN_OR_RETURN(c->fp8_k_scale, ReadF32(file, "fp8.k_scale", layers));
    KVQ_ASSIGN_OR_RETURN(c->fp8_v_scale, ReadF32(file, "fp8.v_scale", layers));
    KVQ_RETURN_IF_ERROR(CheckFp8Scales(c->fp8_k_scale, "calibration tensor 'fp8.k_scale'"));
    KVQ_RETURN_IF_ERROR(CheckFp8Scales(c->fp8_v_scale, "calibration tensor 'fp8.v_scale'"));
  }
  return c->format_version >= 2 ? LoadRotations(file, c) : Status::Ok();
}

}  // namespace

std::string VllmKvScaleName(int64_t layer, bool is_v) {
  return "model.layers." + std::to_string(layer) + ".self_attn." + (is_v ? "v_scale" : "k_scale");
}

float Fp8E4M3TensorScale(float amax) {
  const float scale = amax / 448.0f;
  return scale == 0.0f ? std::numeric_limits<float>::epsilon() : scale;
}

std::string KvCalibration::BitsList() const {
  std::string list;
  for (const auto& [bits, books] : codebooks)
    list += (list.empty() ? "" : ",") + std::to_string(bits);
  return list;
}

Status KvCalibration::CheckShape(const KvShape& shape) const {
  std::string mismatches;
  auto check = [&](const char* what, int64_t file_value, int64_t model_value) {
    if (file_value == model_value) return;
    mismatches += std::string(mismatches.empty() ? "" : ", ") + what + " " +
                  std::to_string(file_value) + " (model " + std::to_string(model_value) + ")";
  };
  check("num_layers", num_layers, shape.num_layers);
  if (scales_only) {
    if (mismatches.empty()) return Status::Ok();
    return Status::Error("vLLM KV-scale file '" + source + "' has scales for " + mismatches);
  }
  check("num_heads", num_heads, shape.num_heads);
  check("num_kv_heads", num_kv_heads, shape.num_kv_heads);
  check("head_dim", head_dim, shape.head_dim);
  if (mismatches.empty()) return Status::Ok();
  return Status::Error("calibration file '" + source + "' was made for another model shape: " +
                       mismatches + (model.empty() ? "" : "; it was made from " + model));
}

StatusOr<const KvCalibration::Codebooks*> KvCalibration::ForBits(int bits) const {
  const auto it = codebooks.find(bits);
  if (it != codebooks.end()) return &it->second;
  return Status::Error("calibration file '" + source + "' has codebooks for " + BitsList() +
                       " bits, not " + std::to_string(bits) + " (run kvq calibrate --bits " +
                       std::to_string(bits) + ")");
}

StatusOr<KvCalibration> LoadKvCalibration(const std::string& path) {
  KVQ_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  KvCalibration c;
  c.source = path;
  KVQ_RETURN_IF_ERROR(LoadInto(*file, &c).WithContext(path));
  return c;
}

Status SaveKvCalibration(const KvCalibration& c, const std::string& path) {
  SafetensorsWriter writer;
  writer.SetMetadata("format", kKvCalibrationFormat);
  writer.SetMetadata("num_layers", std::to_string(c.num_layers));
  writer.SetMetadata("num_heads", std::to_string(c.num_heads));
  writer.SetMetadata("num_kv_heads", std::to_string(c.num_kv_heads));
  writer.SetMetadata("head_dim", std::to_string(c.head_dim));
  writer.SetMetadata("bits", c.BitsList());
  writer.SetMetadata("tokens", std::to_string(c.tokens));
  writer.SetMetadata("outlier_percent", std::to_string(c.outlier_percent));
  writer.SetMetadata("method", c.method);
  writer.SetMetadata("qnorm", c.qnorm ? "1" : "0");
  writer.SetMetadata("model", c.model);
  writer.SetMetadata("rotation", c.rotation_objective);
  const std::vector<int64_t> channels{c.num_layers, c.num_kv_heads, c.head_dim};
  const size_t channel_count = static_cast<size_t>(c.num_layers * c.num_kv_heads * c.head_dim);
  if (c.k_offset.size() != channel_count || c.k_scale.size() != channel_count) {
    return Status::Error("calibration: channel tensors do not match the shape");
  }
  KVQ_RETURN_IF_ERROR(writer.AddTensor("k.channel_offset", DType::kF32, channels, c.k_offset.data(),
                                       channel_count * sizeof(float)));
  KVQ_RETURN_IF_ERROR(writer.AddTensor("k.channel_scale", DType::kF32, channels, c.k_scale.data(),
                                       channel_count * sizeof(float)));
  for (const auto& [bits, books] : c.codebooks) {
    const std::vector<int64_t> shape{c.num_layers, int64_t{1} << bits};
    for (bool is_v : {false, true}) {
      const std::vector<float>& levels = is_v ? books.v : books.k;
      if (levels.size() != static_cast<size_t>(shape[0] * shape[1])) {
        return Status::Error("calibration: " + LevelsName(bits, is_v) + " has the wrong size");
      }
      KVQ_RETURN_IF_ERROR(writer.AddTensor(LevelsName(bits, is_v), DType::kF32, shape,
                                           levels.data(), levels.size() * sizeof(float)));
    }
  }
  if (!c.rotation_objective.empty()) {
    const std::vector<int64_t> shape{c.num_layers, c.num_kv_heads, c.head_dim, c.head_dim};
    const size_t count = channel_count * static_cast<size_t>(c.head_dim);
    if (c.k_rotation.size() != count || c.v_rotation.size() != count) {
      return Status::Error("calibration: rotation tensors do not match the shape");
    }
    KVQ_RETURN_IF_ERROR(writer.AddTensor("oscar.k.rotation", DType::kF32, shape,
                                         c.k_rotation.data(), count * sizeof(float)));
    KVQ_RETURN_IF_ERROR(writer.AddTensor("oscar.v.rotation", DType::kF32, shape,
                                         c.v_rotation.data(), count * sizeof(float)));
  }
  const std::vector<int64_t> layers{c.num_layers};
  for (bool is_v : {false, true}) {
    const std::vector<float>& scales = is_v ? c.fp8_v_scale : c.fp8_k_scale;
    if (c.fp8_k_scale.empty() && c.fp8_v_scale.empty()) break;  // none measured
    if (scales.size() != static_cast<size_t>(c.num_layers)) {
      return Status::Error("calibration: fp8 scales do not match the layer count");
    }
    KVQ_RETURN_IF_ERROR(CheckFp8Scales(scales, is_v ? "fp8.v_scale" : "fp8.k_scale"));
    KVQ_RETURN_IF_ERROR(writer.AddTensor(is_v ? "fp8.v_scale" : "fp8.k_scale", DType::kF32, layers,
                                         scales.data(), scales.size() * sizeof(float)));
  }
  return writer.Write(path);
}

Status SaveVllmKvScales(const KvCalibration& c, const std::string& path) {
  if (c.fp8_k_scale.empty() || c.fp8_k_scale.size() != c.fp8_v_scale.size()) {
    return Status::Error("calibration '" + c.source +
                         "' has no fp8 scales to export (version 1 file; rerun kvq calibrate)");
  }
  KVQ_RETURN_IF_ERROR(CheckFp8Scales(c.fp8_k_scale, "k_scale"));
  KVQ_RETURN_IF_ERROR(CheckFp8Scales(c.fp8_v_scale, "v_scale"));
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");  // what torch/safetensors' save_file writes
  for (size_t l = 0; l < c.fp8_k_scale.size(); ++l) {
    for (bool is_v : {false, true}) {
      const float& value = is_v ? c.fp8_v_scale[l] : c.fp8_k_scale[l];
      KVQ_RETURN_IF_ERROR(writer.AddTensor(VllmKvScaleName(static_cast<int64_t>(l), is_v),
                                           DType::kF32, {1}, &value, sizeof(float)));
    }
  }
  return writer.Write(path);
}

void SymmetricEigen(const std::vector<double>& a_in, int64_t n, std::vector<double>* values,
                    std::vector<double>* vectors) {
  std::vector<double> a = a_in, v(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) v[i * n + i] = 1.0;
  double norm = 0;
  for (double x : a) norm += x * x;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t q = p + 1; q < n; ++q) off += a[p * n + q] * a[p * n + q];
    }
    // Converged when the off-diagonal mass is at double rounding level.
    if (!(off > 1e-30 * norm)) break;
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t q = p + 1; q < n; ++q) {
        const double apq = a[p * n + q];
        if (apq == 0.0) continue;
        const double theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::hypot(theta, 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
        for (int64_t k = 0; k < n; ++k) {  // columns p, q of A J and of V J
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
          const double vkp = v[k * n + p], vkq = v[k * n + q];
          v[k * n + p] = c * vkp - s * vkq;
          v[k * n + q] = s * vkp + c * vkq;
        }
        for (int64_t k = 0; k < n; ++k) {  // rows p, q of Jᵀ (A J)
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
      }
    }
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return a[x * n + x] < a[y * n + y]; });
  values->resize(static_cast<size_t>(n));
  vectors->resize(static_cast<size_t>(n * n));
  for (int64_t j = 0; j < n; ++j) {
    (*values)[j] = a[order[j] * n + order[j]];
    for (int64_t k = 0; k < n; ++k) (*vectors)[k * n + j] = v[k * n + order[j]];
  }
}

double OrthogonalityError(const float* m, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0;
      for (int64_t k = 0; k < n; ++k) dot += static_cast<double>(m[i * n + k]) * m[j * n + k];
      const double e = std::fabs(dot - (i == j ? 1.0 : 0.0));
      if (!(e <= worst)) worst = e;  // NaN propagates as the worst
    }
  }
  return worst;
}

StatusOr<std::vector<float>> FitOscarRotation(const std::vector<double>& cov, int64_t dim) {
  if (dim < 2 || dim > 256 || (dim & (dim - 1)) != 0 ||
      cov.size() != static_cast<size_t>(dim * dim)) {
    return Status::Error("OSCAR rotation: head_dim " + std::to_string(dim) +
                         " is not a power of two from 2 to 256");
  }
  for (double x : cov) {
    if (!std::isfinite(x)) return Status::Error("OSCAR rotation: non-finite covariance");
  }
  std::vector<double> sym(cov.size());
  for (int64_t i = 0; i < dim; ++i) {
    for (int64_t j = 0; j < dim; ++j)
      sym[i * dim + j] = 0.5 * (cov[i * dim + j] + cov[j * dim + i]);
  }
  std::vector<double> values, u;
  SymmetricEigen(sym, dim, &values, &u);
  // perm[bitrev(i)] = index of the i-th largest eigenvalue (OSCAR's P).
  int bits = 0;
  while ((int64_t{1} << bits) < dim) ++bits;
  std::vector<int64_t> desc(static_cast<size_t>(dim)), perm(static_cast<size_t>(dim));
  std::iota(desc.begin(), desc.end(), 0);
  std::stable_sort(desc.begin(), desc.end(),
                   [&](int64_t x, int64_t y) { return values[x] > values[y]; });
  for (int64_t i = 0; i < dim; ++i) {
    int64_t r = 0;
    for (int b = 0; b < bits; ++b) r |= ((i >> b) & 1) << (bits - 1 - b);
    perm[static_cast<size_t>(r)] = desc[static_cast<size_t>(i)];
  }
  // (H Uᵀ)[i][k] = sum_a H[i][a] U[k][a]; m row j = row perm[j] of it.
  const double norm = 1.0 / std::sqrt(static_cast<double>(dim));
  std::vector<float> m(static_cast<size_t>(dim * dim));
  for (int64_t j = 0; j < dim; ++j) {
    const int64_t i = perm[static_cast<size_t>(j)];
    for (int64_t k = 0; k < dim; ++k) {
      double sum = 0;
      for (int64_t a = 0; a < dim; ++a) {
        const double h = (__builtin_popcountll(static_cast<uint64_t>(i & a)) & 1) ? -norm : norm;
        sum += h * u[k * dim + a];
      }
      m[j * dim + k] = static_cast<float>(sum);
    }
  }
  return m;
}

std::vector<double> WeightedKMeans1D(const std::vector<float>& values,
                                     const std::vector<float>& weights, int k, int max_iterations) {
  std::vector<double> centres(static_cast<size_t>(std::max(k, 0)), 0.0);
  const size_t n = std::min(values.size(), weights.size());
  if (n == 0 || k <= 0) return centres;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return values[a] < values[b]; });
  std::vector<double> xs(n), cum_w(n + 1, 0.0), cum_wx(n + 1, 0.0);  // sorted; prefix sums
  for (size_t i = 0; i < n; ++i) {
    xs[i] = values[order[i]];
    const double w = weights[order[i]];
    cum_w[i + 1] = cum_w[i] + w;
    cum_wx[i + 1] = cum_wx[i] + w * xs[i];
  }
  const double total = cum_w[n];
  for (int j = 0; j < k; ++j) {
    const double target = (j + 0.5) / k * total;
    size_t i = static_cast<size_t>(std::upper_bound(cum_w.begin() + 1, cum_w.end(), target) -
                                   (cum_w.begin() + 1));
    centres[static_cast<size_t>(j)] = xs[std::min(i, n - 1)];
  }
  for (int iteration = 0; iteration < max_iterations; ++iteration) {
    std::sort(centres.begin(), centres.end());
    std::vector<double> next = centres;
    size_t begin = 0;
    for (int j = 0; j < k; ++j) {
      // Cell j: (midpoint j-1, midpoint j], ties to the lower cell as the codec.
      size_t end = n;
      if (j + 1 < k) {
        const double mid = centres[j] + (centres[j + 1] - centres[j]) * 0.5;
        end = static_cast<size_t>(std::upper_bound(xs.begin(), xs.end(), mid) - xs.begin());
      }
      end = std::max(end, begin);
      const double w = cum_w[end] - cum_w[begin];
      if (w > 0) next[static_cast<size_t>(j)] = (cum_wx[end] - cum_wx[begin]) / w;
      begin = end;
    }
    const bool moved = next != centres;
    centres = next;
    if (!moved) break;
  }
  std::sort(centres.begin(), centres.end());
  return centres;
}

void KeyChannelRanges(const float* k, int64_t n, int64_t kv_heads, int64_t head_dim,
                      int64_t outlier_percent, float* offset, float* scale) {
  std::vector<float> column;  // [n] one channel's finite values
  for (int64_t h = 0; h < kv_heads; ++h) {
    for (int64_t c = 0; c < head_dim; ++c) {
      column.clear();
      for (int64_t t = 0; t < n; ++t) {
        const float v = k[(t * kv_heads + h) * head_dim + c];
        if (std::isfinite(v)) column.push_back(v);
      }
      float lo = 0.0f, hi = 0.0f;
      if (!column.empty()) {
        const int64_t count = static_cast<int64_t>(column.size());
        const int64_t cut = std::min<int64_t>(
            count / 2, static_cast<int64_t>(std::llround(outlier_percent / 200.0 * (count - 1))));
        std::nth_element(column.begin(), column.begin() + cut, column.end());
        lo = column[static_cast<size_t>(cut)];
        std::nth_element(column.begin(), column.begin() + (count - 1 - cut), column.end());
        hi = column[static_cast<size_t>(count - 1 - cut)];
      }
      const size_t i = static_cast<size_t>(h * head_dim + c);
      offset[i] = lo + (hi - lo) * 0.5f;
      scale[i] = std::clamp((hi - lo) * 0.5f, kMinChannelScale, kMaxChannelScale);
    }
  }
}

StatusOr<std::vector<float>> FitNuqLevels(const NuqFitInput& in) {
  if (in.bits < 2 || in.bits > 4) return Status::Error("NUQ bits must be 2, 3 or 4");
  const codec::NuqFormat f{in.bits, in.is_v, in.outlier_percent};
  const int64_t dim = in.head_dim;
  if (in.n <= 0 || in.kv_heads <= 0 || dim <= 0 || dim > codec::kNuqMaxHeadDim ||
      f.Slots(dim) >= dim || in.x == nullptr ||
      (!in.is_v && (in.k_offset == nullptr || in.k_scale == nullptr))) {
    return Status::Error("NUQ calibration: invalid input");
  }
  std::vector<float> values, weights;  // the k-means points: normalized inliers and weights
  values.reserve(static_cast<size_t>(in.n * in.kv_heads * dim));
  weights.reserve(values.capacity());
  std::vector<float> y(static_cast<size_t>(dim));
  std::vector<char> outlier(static_cast<size_t>(dim));
  codec::NuqRowSplit split;
  for (int64_t t = 0; t < in.n; ++t) {
    for (int64_t h = 0; h < in.kv_heads; ++h) {
      const float* row = in.x + (t * in.kv_heads + h) * dim;
      const float* offset = in.is_v ? nullptr : in.k_offset + h * dim;
      const float* scale = in.is_v ? nullptr : in.k_scale + h * dim;
      codec::NuqSplitRowRef(f, dim, row, offset, scale, y.data(), &split);
      std::fill(outlier.begin(), outlier.end(), 0);
      for (int64_t s = 0; s < split.slots; ++s) outlier[split.channels[s]] = 1;
      for (int64_t c = 0; c < dim; ++c) {
        if (outlier[c] || std::isnan(y[c])) continue;
        const double unit = in.is_v ? split.scale : scale[c];
        double w = unit * unit;
        if (in.element_weight != nullptr) {
          w *= in.element_weight[(t * in.kv_heads + h) * dim + c];
        } else if (in.channel_weight != nullptr) {
          w *= in.channel_weight[h * dim + c];
        }
        if (!(w > 0) || !std::isfinite(w)) continue;
        values.push_back(std::clamp(y[c], -1.0f, 1.0f));
        weights.push_back(static_cast<float>(w));
      }
    }
  }
  if (values.empty()) return Status::Error("NUQ calibration: no usable values");
  const int levels = 1 << in.bits;
  std::vector<double> centres = WeightedKMeans1D(values, weights, levels);
  if (in.qnorm) {
    std::vector<double> mids(static_cast<size_t>(levels - 1));
    for (int j = 0; j + 1 < levels; ++j) mids[j] = (centres[j] + centres[j + 1]) * 0.5;
    double sum = 0, sum2 = 0, qsum = 0, qsum2 = 0;
    for (float v : values) {
      const size_t u =
          static_cast<size_t>(std::lower_bound(mids.begin(), mids.end(), v) - mids.begin());
      sum += v;
      sum2 += static_cast<double>(v) * v;
      qsum += centres[u];
      qsum2 += centres[u] * centres[u];
    }
    const double count = static_cast<double>(values.size());
    const double mean = sum / count, q_mean = qsum / count;
    const double sd = std::sqrt(std::max(0.0, sum2 / count - mean * mean));
    const double q_sd = std::sqrt(std::max(0.0, qsum2 / count - q_mean * q_mean));
    if (q_sd > 0) {
      for (double& c : centres) c = (c - q_mean) * (sd / q_sd) + mean;
    }
  }
  return std::vector<float>(centres.begin(), centres.end());
}

}  // namespace kvq
