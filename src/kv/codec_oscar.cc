// OSCAR (Zhou et al., arXiv:2605.17757, "Offline Spectral Covariance-Aware
// Rotation for 2-bit KV Cache Quantization") and its QuaRot-INT2 baseline.
//
// What OSCAR stores (read in FutureMLS-Lab/OSCAR: README "How the rotation
// is fit" and "Serving", rotation/compute_kv_rotation.py; SGLang PR 32129,
// vLLM PR 46774, onnxruntime PR 31726):
//   - every K and V row rotated by an orthogonal matrix fitted offline per
//     layer (per (layer, KV head) in its format 2): eigenvectors U of an
//     attention-aware covariance (K: the queries' q qᵀ over the query heads
//     of the KV head, "qqt"; V: v vᵀ weighted per token by k Σ_q kᵀ, "sst"),
//     then the normalized Hadamard matrix H, then a bit-reversal permutation;
//   - asymmetric INT2 codes per group of 128 values along head_dim (scale
//     and zero per group), the range clipped (K 0.96, V 0.92 in its serving
//     recipe);
//   - the first 64 tokens (sink) and the newest 256 in BF16.
// Schemes: `oscar2` = K oscar-int2-clip96-r256-s64, V oscar-int2-clip92-
// r256-s64 (OSCAR's recipe), `quarot2` the same with quarot-int2.
// kvq's version (row = one token of one KV head, head_dim d a power of two
// from 32 to 256):
//   oscar-int2[-gG][-clipN]  codes of M x, M this (layer, K/V, KV head)'s fitted
//                         rotation from `kvq calibrate` (kv_calibration.h:
//                         FitOscarRotation; needs --kv-calibration). The
//                         cache applies M to K/V rows before staging, to q
//                         once per Attend, and Mᵀ to the output once per
//                         Attend (KvCodec::RotationMatrix, paged_cache.cc).
//   quarot-int2[-gG][-clipN] the same codes with the data-free rotation
//                         R = H D / sqrt(d) of kv/hadamard.h (QuaRot-INT2).
//   G: values per group (32, 64, 128; default min(128, d): one group per row
//   at d <= 128, OSCAR's layout). N: clip percent (50..100, default 100):
//   the group's min and max are both multiplied by N/100 (QuaRot's
//   clip_ratio), values outside are coded as the nearest end level.
// A row is exactly kvq's `int2-gG-asym` row ([codes: d/4 bytes][f16 scale
// per group][f16 min per group]; codec.h), so decoding and the fused
// Scores / AccumulateV are the int2 codec's (SIMD and scalar twins); only
// Encode differs (clipping). Bits per value: 2 + 32 / G (2.25 at G 128,
// 2.5 at G 64: SmolLM2's and Qwen2.5-0.5B's head_dim is 64), plus the f16
// sink and window rows (-s64 -r256 in the schemes, counted by the planner).
// Deviations: f16 instead of BF16 for the kept rows and the scales (kvq's
// staging is f16); OSCAR absorbs the V rotation into o_proj, kvq un-rotates
// the attention output (same result, no weight change).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kv/codec_formats.h"
#include "kv/codec_registry.h"
#include "kv/hadamard.h"
#include "kv/kv_calibration.h"

namespace kvq::codec {
namespace {

constexpr int64_t kOscarMaxGroup = 128;
constexpr int64_t kOscarMinHeadDim = 32, kOscarMaxHeadDim = 256;

struct OscarFormat {
  bool calibrated = true;  // oscar-int2: fitted rotation; quarot-int2: Hadamard
  int64_t group = 0;       // 0: min(128, head_dim)
  int clip_percent = 100;
  double bits = 2.0;  // of the codes (KvFormatOf's NominalBits)

  int64_t GroupFor(int64_t head_dim) const {
    return group > 0 ? group : std::min(kOscarMaxGroup, head_dim);
  }
  std::string Name() const {
    std::string name = calibrated ? "oscar-int2" : "quarot-int2";
    if (group > 0) name += "-g" + std::to_string(group);
    if (clip_percent != 100) name += "-clip" + std::to_string(clip_percent);
    return name;
  }
};

Status BadOscar(const std::string& spelled, const std::string& why) {
  return Status::Error(
      "KV cache type '" + spelled + "': " + why +
      " (OSCAR / QuaRot INT2: oscar-int2|quarot-int2[-gG][-clipN], G 32, 64 or 128, "
      "N 50..100 percent)");
}

StatusOr<OscarFormat> ParseOscarFormat(const std::string& base, const std::string& spelled) {
  const std::vector<std::string> parts = SplitKvName(base);
  OscarFormat f;
  if (parts[0] == "quarot") {
    f.calibrated = false;
  } else if (parts[0] != "oscar") {
    return BadOscar(spelled, "unknown type '" + parts[0] + "'");
  }
  if (parts.size() < 2 || parts[1] != "int2") {
    return BadOscar(spelled, "the codes are int2: " + parts[0] + "-int2");
  }
  bool have_clip = false;
  for (size_t i = 2; i < parts.size(); ++i) {
    const std::string& o = parts[i];
    const auto digits = [&](size_t from) {
      return o.size() > from && o.size() <= from + 3 &&
             o.find_first_not_of("0123456789", from) == std::string::npos;
    };
    if (o.size() > 1 && o[0] == 'g' && digits(1)) {
      if (f.group > 0) return BadOscar(spelled, "-g given twice");
      f.group = std::stoll(o.substr(1));
      if (f.group != 32 && f.group != 64 && f.group != 128) {
        return BadOscar(spelled, "group " + o.substr(1) + " is not 32, 64 or 128");
      }
    } else if (o.rfind("clip", 0) == 0 && digits(4)) {
      if (have_clip) return BadOscar(spelled, "-clip given twice");
      have_clip = true;
      f.clip_percent = std::stoi(o.substr(4));
      if (f.clip_percent < 50 || f.clip_percent > 100) {
        return BadOscar(spelled, "clip " + o.substr(4) + " outside 50..100 percent");
      }
    } else {
      return BadOscar(spelled, "unknown option '" + o + "'");
    }
  }
  return f;
}

class OscarCodec final : public ForwardingKvCodec {
 public:
  // int2: int2-gG-asym, whose decode and fused kernels read the rows.
  OscarCodec(const OscarFormat& f, int64_t head_dim, std::unique_ptr<KvCodec> int2)
      : ForwardingKvCodec(head_dim, std::move(int2)), f_(f), base_{2, f.GroupFor(head_dim), false} {
    if (!f.calibrated) {
      // R's columns are the rotated unit vectors: row-major M[i][j] = (R e_j)_i.
      std::vector<float> unit(static_cast<size_t>(head_dim * head_dim), 0.0f);
      for (int64_t j = 0; j < head_dim; ++j) unit[j * head_dim + j] = 1.0f;
      (void)HadamardRotate(unit.data(), head_dim, head_dim);  // head_dim checked by Make
      matrix_.resize(unit.size());
      for (int64_t j = 0; j < head_dim; ++j) {
        for (int64_t i = 0; i < head_dim; ++i) matrix_[i * head_dim + j] = unit[j * head_dim + i];
      }
    }
  }

  std::string FormatName() const override { return f_.Name(); }
  // The rotation this instance holds (f32 [d, d]).
  size_t SideBytes() const override {
    return static_cast<size_t>(head_dim_ * head_dim_) * sizeof(float);
  }
  const float* RotationMatrix() const override {
    return matrix_.empty() ? nullptr : matrix_.data();
  }

  bool NeedsCalibrationFile() const override { return f_.calibrated; }
  Status SetCalibration(const KvCalibration& c, int64_t layer, int64_t head, bool is_v) override {
    if (!f_.calibrated) return Status::Ok();
    const std::string what = "calibration file '" + c.source + "' for " + Name();
    if (c.rotation_objective.empty()) {
      return Status::Error(what + ": it has no OSCAR rotations (format " +
                           std::to_string(c.format_version) +
                           "); make a new one with kvq calibrate");
    }
    if (c.head_dim != head_dim_ || layer < 0 || layer >= c.num_layers || head < 0 ||
        head >= c.num_kv_heads) {
      return Status::Error(what + ": no rotation for layer " + std::to_string(layer) +
                           ", KV head " + std::to_string(head) + " at head_dim " +
                           std::to_string(head_dim_));
    }
    const std::vector<float>& all = is_v ? c.v_rotation : c.k_rotation;
    const size_t size = static_cast<size_t>(head_dim_ * head_dim_);
    const size_t at = static_cast<size_t>(layer * c.num_kv_heads + head) * size;
    if (all.size() < at + size) return Status::Error(what + ": rotation tensor too small");
    matrix_.assign(all.begin() + static_cast<std::ptrdiff_t>(at),
                   all.begin() + static_cast<std::ptrdiff_t>(at + size));
    return Status::Ok();
  }

  // x is already rotated (the cache applies M). Per group: min and max
  // scaled by the clip ratio, then int2-gG-asym's parameters and codes.
  void Encode(const float* x, int64_t n, uint8_t* rows) const override {
    const size_t code_bytes = base_.CodeBytes(head_dim_);
    const int64_t groups = base_.Groups(head_dim_), g_size = base_.group;
    const float clip = static_cast<float>(f_.clip_percent) / 100.0f;
    for (int64_t t = 0; t < n; ++t) {
      const float* xr = x + t * head_dim_;
      uint8_t* row = rows + t * RowBytes();
      std::memset(row, 0, code_bytes);
      for (int64_t g = 0; g < groups; ++g) {
        const float* xg = xr + g * g_size;
        float min = xg[0], max = xg[0];
        for (int64_t i = 1; i < g_size; ++i) {
          min = std::fmin(min, xg[i]);
          max = std::fmax(max, xg[i]);
        }
        const GroupParams p = IntGroupParams(base_, min * clip, max * clip);
        std::memcpy(row + code_bytes + 2 * g, &p.scale_bits, 2);
        std::memcpy(row + code_bytes + 2 * (groups + g), &p.min_bits, 2);
        for (int64_t i = 0; i < g_size; ++i) {
          IntPackRef(base_, g * g_size + i, IntQuantizeRef(base_, p, xg[i]), row);
        }
      }
    }
  }

 private:
  OscarFormat f_;
  IntFormat base_;
  std::vector<float> matrix_;  // [d, d] row-major; empty until calibrated (oscar-int2)
};

StatusOr<std::unique_ptr<KvCodec>> MakeOscarCodec(const OscarFormat& f, int64_t head_dim,
                                                  CodecPath path) {
  const int64_t group = f.GroupFor(head_dim);
  if (head_dim < kOscarMinHeadDim || head_dim > kOscarMaxHeadDim ||
      (head_dim & (head_dim - 1)) != 0 || head_dim % group != 0) {
    return Status::Error("KV cache type '" + f.Name() + "': head_dim " + std::to_string(head_dim) +
                         " must be a power of two from 32 to 256 and a multiple of the group " +
                         std::to_string(group));
  }
  KVQ_ASSIGN_OR_RETURN(auto int2, MakeIntCodec(IntFormat{2, group, false}, head_dim, path));
  return std::unique_ptr<KvCodec>(std::make_unique<OscarCodec>(f, head_dim, std::move(int2)));
}

}  // namespace
}  // namespace kvq::codec

// ---- registry entry (kv/codec_registry.h) ----
namespace kvq {
namespace {

using OscarFormatSpec = KvFormatOf<codec::OscarFormat, codec::MakeOscarCodec>;

StatusOr<std::shared_ptr<const KvFormat>> ParseOscar(const std::string& base,
                                                     const std::string& spelled) {
  KVQ_ASSIGN_OR_RETURN(const codec::OscarFormat format, codec::ParseOscarFormat(base, spelled));
  return OscarFormatSpec::Of(format);
}

bool ClaimsOscar(const std::string& base) {
  const std::string head = SplitKvName(base)[0];
  return head == "oscar" || head == "quarot";
}

std::vector<std::string> OscarSamples(int64_t head_dim) {
  if (head_dim < codec::kOscarMinHeadDim || head_dim > codec::kOscarMaxHeadDim ||
      (head_dim & (head_dim - 1)) != 0) {
    return {};
  }
  return {"quarot-int2",          "quarot-int2-g32",  "quarot-int2-clip90",
          "oscar-int2",           "oscar-int2-g32",   "oscar-int2-clip92",
          "oscar-int2-clip80-s4", "oscar-int2-a2-s1", "quarot-int2-clip96-r256-s64"};
}

}  // namespace

const KvCodecFamily& OscarCodecFamily() {
  static const KvCodecFamily family{
      "oscar",
      "oscar-int2|quarot-int2[-gG][-clipN]",
      "OSCAR (arXiv:2605.17757): rows rotated by an orthogonal matrix fitted per (layer, KV head) "
      "by `kvq calibrate` (eigenvectors of the queries' covariance for K, of the attention-"
      "weighted value covariance for V, then Hadamard), asymmetric INT2 per group of G values "
      "(default min(128, head_dim)), the range clipped to N% (needs --kv-calibration). "
      "quarot-int2: "
      "the same codes after the data-free Hadamard rotation (QuaRot-INT2). Schemes oscar2, "
      "quarot2.",
      ClaimsOscar,
      ParseOscar,
      [](int64_t) { return std::vector<std::string>{}; },
      OscarSamples,
      {"oscar2", "quarot2"},
      {},
      {},
      {{"oscar2", "oscar-int2-clip96-r256-s64", "oscar-int2-clip92-r256-s64",
        "OSCAR's serving recipe: calibrated rotation, INT2 clipped to 96% (K) / 92% (V), first 64 "
        "and newest 256 tokens in f16 (needs --kv-calibration)"},
       {"quarot2", "quarot-int2-clip96-r256-s64", "quarot-int2-clip92-r256-s64",
        "QuaRot-INT2 baseline: the same codes, sinks and window with a data-free Hadamard "
        "rotation"}}};
  return family;
}

}  // namespace kvq
