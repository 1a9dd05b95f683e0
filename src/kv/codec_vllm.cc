// vLLM's own KV cache formats, with vLLM's quantization math (read in
// vllm-project/vllm; docs/cache-types.md and docs/export.md cite the files):
//
//   fp8_e4m3-t1 / fp8_e5m2-t1   vLLM's `--kv-cache-dtype fp8|fp8_e4m3|fp8_e5m2`
//       without checkpoint scales: one scale per layer and K/V, 1.0
//       (vllm/model_executor/layers/quantization/kv_cache.py: k_scale and
//       v_scale default to 1.0 when the checkpoint has none). Stored value
//       fp8(x / scale), IEEE division, round to nearest even, saturating to
//       the largest finite value, NaN kept (csrc/quantization/w8a8/fp8/nvidia/
//       quant_utils.cuh: __nv_cvt_float_to_fp8(a / scale, __NV_SATFINITE,
//       ...)); decoded fp8 * scale. The same per-element math as kvq's
//       fp8_e4m3, whose scale is per (layer, K/V, KV head) and set from the
//       first prefill instead.
//   fp8_e4m3-tcal   the same with the per-layer K and V scales of a
//       calibration file (--kv-calibration): a `kvq calibrate` file (version
//       2: amax / 448 over the calibration text, as llm-compressor computes
//       the k_scale vLLM loads) or a vLLM KV-scale safetensors file.
//   int8_per_token_head / fp8_per_token_head   (vllm/v1/attention/ops/
//       triton_reshape_and_cache_flash.py, _reshape_cache_per_token_head):
//       per (token, KV head) an f32 scale = max(absmax / Q, 1e-6), Q = 127
//       (int8) or 448 (fp8 E4M3); y = x * (1 / scale); int8: y +- 0.5 (half
//       away from zero), clamped to [-128, 127], truncated toward zero; fp8:
//       y clamped to +-448, then cast (round to nearest even). Decoded q * scale.
//       Row: head_dim codes, then the f32 scale.
//   int4_per_token_head   (vllm/v1/attention/ops/int4_per_token_head.py):
//       the row is first rotated by vLLM's randomized Hadamard transform
//       y = H (D x), H the unnormalized Sylvester matrix (butterfly order as
//       its PyTorch fallback), D = diag of +-1 signs drawn by
//       torch.bernoulli(0.5) from a CPU generator seeded 0x9E3779B9 (here
//       std::mt19937 with that seed, sign + when the low 24 bits of a draw
//       are < 2^23: PyTorch's uniform_real / bernoulli on its mt19937;
//       equal to torch's own draws, tests/golden/vllm_rht_signs.txt from
//       bench/vllm_rht_signs.py). Then per (token,
//       KV head): scale = max((max - min) / 15, 1e-6), zp = clamp(round half
//       away(-min / scale), 0, 15), u = clamp(round half away(y * (1 / scale)
//       + zp), 0, 15); the stored f32 scale has its low 4 mantissa bits
//       replaced by zp; decoded (u - zp) * scale_stored, then x = D H y / d.
//       Row: head_dim / 2 bytes (byte j = element 2j | element 2j + 1 << 4),
//       then the f32 scale. head_dim must be a power of two (vLLM asserts it).
//       The rotation is the orthonormal M = H D / sqrt(d), handed to the
//       cache as this codec's RotationMatrix: the cache stores M x, rotates
//       the query by M and maps the attention output back by M^T once per
//       Attend, so the kernels never leave the rotated domain (a map-back
//       per kernel call cost 0.5x f16's decode speed at 16K). The codec
//       quantizes y = sqrt(d) M x = H D x, vLLM's rotated row, and decodes
//       (u - zp) * scale_stored / sqrt(d).
// Differences kept on purpose: vLLM rounds the rotated row to the model's
// dtype (and its CUDA Hadamard goes through bf16) before quantizing, and a
// GPU may contract multiply-adds; kvq rotates in double (the cache's dense
// M x) and rounds once to f32. Non-finite input follows vLLM's kernels: the absolute maximum
// ignores NaN (fmax), a NaN element is clamped to the lowest code (Triton's
// clamp is fmax/fmin), an inf element makes the row's scale inf so the row
// decodes to NaN/inf; per-tensor fp8 keeps NaN and saturates inf.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/fp16.h"
#include "kv/codec_formats.h"
#include "kv/codec_registry.h"
#include "kv/kv_calibration.h"

#ifndef KVQ_KV_CODEC_VLLM_SHARED_
#define KVQ_KV_CODEC_VLLM_SHARED_
namespace kvq::codec {
// Shared by the SIMD kernels and the scalar twin, so both decode an int4 row
// with the same float operations.
struct Int4Params {
  float scale;       // the stored scale (zp bits cleared) / sqrt(head_dim)
  float zero_point;  // 0..15
};
inline float Int4InvSqrtDim(int64_t dim) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
}
inline Int4Params Int4RowParams(const uint8_t* row, int64_t dim, float inv_sqrt_dim) {
  uint32_t bits;
  std::memcpy(&bits, row + dim / 2, sizeof bits);
  return {BitsToFloat(bits & ~0xFu) * inv_sqrt_dim, static_cast<float>(bits & 0xFu)};
}
}  // namespace kvq::codec
#endif  // KVQ_KV_CODEC_VLLM_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/codec_vllm.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h (per-target code).
#include "kv/codec_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq::codec {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;
using DI = hn::RebindToSigned<DF>;
using VI = hn::Vec<DI>;

// fp8 code -> value exactly (codec_float.cc's trick: the magnitude bits at
// the bottom of an f32 exponent, times 2^(127 - bias)); codes above
// max_code are NaN. Then one multiply by the scale, as the scalar twin.
template <int kMantissa, int kBias>
HWY_INLINE VF Fp8Values(const uint8_t* codes, int32_t max_code, VF scale) {
  const DF d;
  const DI di;
  const VI code = hn::PromoteTo(
      di, hn::LoadU(hn::Rebind<int8_t, DF>(), reinterpret_cast<const int8_t*>(codes)));
  const VI magnitude = hn::And(code, hn::Set(di, 0x7F));
  const VI sign = hn::And(code, hn::Set(di, static_cast<int32_t>(0x80000000u)));
  const VF raw = hn::BitCast(d, hn::Or(sign, hn::ShiftLeft<23 - kMantissa>(magnitude)));
  const float rebias = BitsToFloat(static_cast<uint32_t>(254 - kBias) << 23);
  const VF value = hn::Mul(hn::Mul(raw, hn::Set(d, rebias)), scale);
  return hn::IfThenElse(hn::RebindMask(d, hn::Gt(magnitude, hn::Set(di, max_code))),
                        hn::Set(d, std::numeric_limits<float>::quiet_NaN()), value);
}

HWY_INLINE float RowScale(const uint8_t* row, int64_t at) {
  float s;
  std::memcpy(&s, row + at, sizeof s);
  return s;
}

// Per-tensor fp8: one scale for every row (no row parameters).
template <int kMantissa, int kBias>
struct Fp8TensorFmt {
  using D = DF;
  static constexpr bool kHasParams = false;
  int64_t head_dim;
  size_t row_bytes;
  float scale;
  int32_t max_code;
  int64_t ParamGroup() const { return head_dim; }
  ScaleOffset Params(const uint8_t*, int64_t) const { return {}; }
  HWY_INLINE VF Load(D d, const uint8_t* row, int64_t i, VF, VF) const {
    return Fp8Values<kMantissa, kBias>(row + i, max_code, hn::Set(d, scale));
  }
};

// Per (token, head) f32 scale after the codes: fp8 E4M3 or int8 codes.
template <bool kFp8>
struct TokenHeadFmt {
  using D = DF;
  static constexpr bool kHasParams = true;
  int64_t head_dim;
  size_t row_bytes;
  int64_t ParamGroup() const { return head_dim; }
  ScaleOffset Params(const uint8_t* row, int64_t) const { return {RowScale(row, head_dim), 0.0f}; }
  HWY_INLINE VF Load(D d, const uint8_t* row, int64_t i, VF scale, VF) const {
    if constexpr (kFp8) {
      return Fp8Values<3, 7>(row + i, kE4M3.max_code, scale);
    } else {
      const VI q = hn::PromoteTo(
          DI(), hn::LoadU(hn::Rebind<int8_t, DF>(), reinterpret_cast<const int8_t*>(row) + i));
      return hn::Mul(hn::ConvertTo(d, q), scale);
    }
  }
};

// int4 in the rotated domain: (u - zp) * (scale / sqrt(d)), u a nibble
// (byte j holds elements 2j and 2j + 1), zp in the low 4 bits of the f32
// scale.
struct Int4RotatedFmt {
  using D = DF;
  static constexpr bool kHasParams = true;
  int64_t head_dim;
  size_t row_bytes;
  float inv_sqrt_dim;
  int64_t ParamGroup() const { return head_dim; }
  ScaleOffset Params(const uint8_t* row, int64_t) const {
    const Int4Params p = Int4RowParams(row, head_dim, inv_sqrt_dim);
    return {p.scale, p.zero_point};
  }
  // Elements [i, i + lanes), i even: the lanes / 2 bytes from i / 2, each
  // widened to a u32 holding its low nibble in the low u16 and its high
  // nibble in the high u16, so the same bits read as u16 lanes are the
  // nibbles in element order.
  HWY_INLINE VF Load(D d, const uint8_t* row, int64_t i, VF scale, VF zp) const {
#if HWY_TARGET == HWY_SCALAR
    const uint8_t b = row[i >> 1];  // one lane: no pair to widen
    const VI u = hn::Set(DI(), (i & 1) != 0 ? b >> 4 : b & 0xF);
#else
    const DI di;
    const hn::Rebind<uint16_t, DI> d16;
    const hn::Repartition<uint32_t, decltype(d16)> d32;
    const hn::Rebind<uint8_t, decltype(d32)> d8;
    const auto b = hn::PromoteTo(d32, hn::LoadU(d8, row + i / 2));
    const auto pairs =
        hn::Or(hn::And(b, hn::Set(d32, 0xFu)), hn::ShiftLeft<12>(hn::And(b, hn::Set(d32, 0xF0u))));
    const VI u =
        hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DI>(), hn::BitCast(d16, pairs)));
#endif
    return hn::Mul(hn::Sub(hn::ConvertTo(d, u), zp), scale);
  }
};

// kind: 0 fp8_e4m3 per tensor, 1 fp8_e5m2 per tensor, 2 int8 per token-head,
// 3 fp8 per token-head, 4 int4 (rotated domain).
template <class F>
HWY_INLINE void WithVllmFormat(int kind, int64_t dim, size_t row_bytes, float scale, const F& f) {
  switch (kind) {
    case 0:
      return f(Fp8TensorFmt<3, 7>{dim, row_bytes, scale, kE4M3.max_code});
    case 1:
      return f(Fp8TensorFmt<2, 15>{dim, row_bytes, scale, kE5M2.max_code});
    case 2:
      return f(TokenHeadFmt<false>{dim, row_bytes});
    case 3:
      return f(TokenHeadFmt<true>{dim, row_bytes});
    default:
      return f(Int4RotatedFmt{dim, row_bytes, Int4InvSqrtDim(dim)});
  }
}

void VllmDecodeImpl(int kind, int64_t dim, size_t row_bytes, float scale, const uint8_t* rows,
                    int64_t n, float* x) {
  WithVllmFormat(kind, dim, row_bytes, scale,
                 [&](const auto& fmt) { DecodeRows(fmt, rows, n, x); });
}

void VllmScoresImpl(int kind, int64_t dim, size_t row_bytes, float fp8_scale, const uint8_t* rows,
                    int64_t n, const float* q, int64_t group, float scale, float* scores,
                    int64_t stride) {
  WithVllmFormat(kind, dim, row_bytes, fp8_scale,
                 [&](const auto& fmt) { Scores(fmt, rows, n, q, group, scale, scores, stride); });
}

void VllmAccumulateImpl(int kind, int64_t dim, size_t row_bytes, float fp8_scale,
                        const uint8_t* rows, int64_t n, const float* p, int64_t group,
                        int64_t stride, float* acc) {
  WithVllmFormat(kind, dim, row_bytes, fp8_scale,
                 [&](const auto& fmt) { AccumulateV(fmt, rows, n, p, group, stride, acc); });
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::codec
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::codec {

HWY_EXPORT(VllmDecodeImpl);
HWY_EXPORT(VllmScoresImpl);
HWY_EXPORT(VllmAccumulateImpl);

// ---- scalar quantizers (shared by both paths: Encode is not a hot loop) ----

std::vector<float> VllmRhtSigns(int64_t dim) {
  std::mt19937 generator(0x9E3779B9u);
  std::vector<float> signs(static_cast<size_t>(dim));
  for (float& s : signs) s = (generator() & 0xFFFFFFu) < 0x800000u ? 1.0f : -1.0f;
  return signs;
}

// In place, unnormalized: x <- H x (H x has norm sqrt(dim) |x|). The
// butterfly order of vLLM's PyTorch fallback, so f32 sums round alike.
void VllmHadamard(float* x, int64_t dim) {
  for (int64_t h = 1; h < dim; h *= 2) {
    for (int64_t i = 0; i < dim; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

std::vector<float> VllmRotationMatrix(int64_t dim) {
  // Column j of H D is the butterfly of D e_j; M = H D / sqrt(d).
  const std::vector<float> signs = VllmRhtSigns(dim);
  const double inv_sqrt = 1.0 / std::sqrt(static_cast<double>(dim));
  std::vector<float> m(static_cast<size_t>(dim * dim));
  std::vector<float> column(static_cast<size_t>(dim));
  for (int64_t j = 0; j < dim; ++j) {
    std::fill(column.begin(), column.end(), 0.0f);
    column[static_cast<size_t>(j)] = signs[static_cast<size_t>(j)];
    VllmHadamard(column.data(), dim);
    for (int64_t i = 0; i < dim; ++i) {
      m[static_cast<size_t>(i * dim + j)] =
          static_cast<float>(column[static_cast<size_t>(i)] * inv_sqrt);
    }
  }
  return m;
}

namespace {

// Triton's tl.clamp (fmax then fmin): a NaN becomes `lo`.
float ClampLikeTriton(float v, float lo, float hi) { return std::fmin(std::fmax(v, lo), hi); }
// Round half away from zero as vLLM's kernels do it: +-0.5 in f32, then
// truncation toward zero (the int store / conversion). NaN -> 0.
float RoundHalfAway(float v) {
  const float t = v >= 0.0f ? v + 0.5f : v - 0.5f;
  return std::isnan(t) ? 0.0f : std::trunc(t);
}

void EncodeTokenHead(bool fp8, const float* x, int64_t dim, uint8_t* row) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < dim; ++i) absmax = std::fmax(absmax, std::fabs(x[i]));
  const float qmax = fp8 ? kE4M3.max_finite : 127.0f;
  const float scale = std::fmax(absmax / qmax, 1e-6f);
  const float inv = 1.0f / scale;
  for (int64_t i = 0; i < dim; ++i) {
    const float y = x[i] * inv;
    if (fp8) {
      row[i] = Fp8EncodeRef(ClampLikeTriton(y, -qmax, qmax), kE4M3);
    } else {
      // tl.where(y >= 0, y + 0.5, y - 0.5), clamp, then the int8 store truncates.
      const float t = y >= 0.0f ? y + 0.5f : y - 0.5f;
      const auto q = static_cast<int8_t>(std::trunc(ClampLikeTriton(t, -128.0f, 127.0f)));
      std::memcpy(row + i, &q, 1);
    }
  }
  std::memcpy(row + dim, &scale, sizeof scale);
}

// y: the rotated row (modified: not needed afterwards).
void EncodeInt4(const float* y, int64_t dim, uint8_t* row) {
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  for (int64_t i = 0; i < dim; ++i) {
    lo = std::fmin(lo, y[i]);
    hi = std::fmax(hi, y[i]);
  }
  const float scale = std::fmax((hi - lo) / 15.0f, 1e-6f);
  const float zp = std::clamp(RoundHalfAway(-lo / scale), 0.0f, 15.0f);
  const float inv = 1.0f / scale;
  std::memset(row, 0, static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim; ++i) {
    const auto u = static_cast<uint8_t>(std::clamp(RoundHalfAway(y[i] * inv + zp), 0.0f, 15.0f));
    row[i >> 1] |= static_cast<uint8_t>((i & 1) != 0 ? u << 4 : u);
  }
  uint32_t bits;
  std::memcpy(&bits, &scale, sizeof bits);
  bits = (bits & ~0xFu) | static_cast<uint32_t>(zp);
  std::memcpy(row + dim / 2, &bits, sizeof bits);
}

enum class VllmKind { kFp8E4M3Tensor, kFp8E5M2Tensor, kInt8TokenHead, kFp8TokenHead, kInt4 };

class VllmCodec final : public KvCodec {
 public:
  VllmCodec(VllmKind kind, bool calibrated, int64_t head_dim, CodecPath path)
      : KvCodec(head_dim),
        kind_(kind),
        calibrated_(calibrated),
        path_(head_dim % 16 == 0 ? path : CodecPath::kReference) {
    if (kind_ == VllmKind::kInt4) rotation_ = VllmRotationMatrix(head_dim);
  }

  std::string FormatName() const override {
    switch (kind_) {
      case VllmKind::kFp8E4M3Tensor:
        return calibrated_ ? "fp8_e4m3-tcal" : "fp8_e4m3-t1";
      case VllmKind::kFp8E5M2Tensor:
        return "fp8_e5m2-t1";
      case VllmKind::kInt8TokenHead:
        return "int8_per_token_head";
      case VllmKind::kFp8TokenHead:
        return "fp8_per_token_head";
      case VllmKind::kInt4:
        return "int4_per_token_head";
    }
    return "?";
  }
  size_t RowBytes() const override {
    const auto d = static_cast<size_t>(head_dim_);
    if (IsTensor()) return d;
    return (kind_ == VllmKind::kInt4 ? d / 2 : d) + sizeof(float);
  }
  size_t SideBytes() const override { return IsTensor() ? sizeof(float) : 0; }
  bool NeedsCalibrationFile() const override { return calibrated_; }

  Status SetCalibration(const KvCalibration& c, int64_t layer, int64_t, bool is_v) override {
    if (!calibrated_) return Status::Ok();
    const std::vector<float>& scales = is_v ? c.fp8_v_scale : c.fp8_k_scale;
    if (scales.empty()) {
      return Status::Error(Name() + ": calibration file '" + c.source +
                           "' has no fp8 scales (a version 1 file: rerun kvq calibrate, or give "
                           "a vLLM k_scale/v_scale file)");
    }
    if (layer < 0 || layer >= static_cast<int64_t>(scales.size())) {
      return Status::Error(Name() + ": calibration file '" + c.source + "' has no layer " +
                           std::to_string(layer));
    }
    const float s = scales[static_cast<size_t>(layer)];
    if (!std::isfinite(s) || !(s > 0.0f)) {
      return Status::Error(Name() + ": calibration file '" + c.source + "': scale of layer " +
                           std::to_string(layer) + " is not finite and > 0");
    }
    scale_ = s;
    return Status::Ok();
  }
  float scale() const { return scale_; }

  void Encode(const float* x, int64_t n, uint8_t* rows) const override {
    const size_t row_bytes = RowBytes();
    float y[kMaxCodecHeadDim];
    for (int64_t t = 0; t < n; ++t) {
      const float* xr = x + t * head_dim_;
      uint8_t* row = rows + t * static_cast<int64_t>(row_bytes);
      switch (kind_) {
        case VllmKind::kFp8E4M3Tensor:
        case VllmKind::kFp8E5M2Tensor:
          for (int64_t i = 0; i < head_dim_; ++i) row[i] = Fp8EncodeRef(xr[i] / scale_, Fp8());
          break;
        case VllmKind::kInt8TokenHead:
        case VllmKind::kFp8TokenHead:
          EncodeTokenHead(kind_ == VllmKind::kFp8TokenHead, xr, head_dim_, row);
          break;
        case VllmKind::kInt4: {  // xr = M x (the cache rotated it): y = sqrt(d) M x = H D x
          const auto sqrt_dim = static_cast<float>(std::sqrt(static_cast<double>(head_dim_)));
          for (int64_t i = 0; i < head_dim_; ++i) y[i] = xr[i] * sqrt_dim;
          EncodeInt4(y, head_dim_, row);
          break;
        }
      }
    }
  }

  void Decode(const uint8_t* rows, int64_t n, float* x) const override {
    if (path_ == CodecPath::kSimd && kind_ != VllmKind::kInt4) {
      return HWY_DYNAMIC_DISPATCH(VllmDecodeImpl)(static_cast<int>(kind_), head_dim_, RowBytes(),
                                                  scale_, rows, n, x);
    }
    for (int64_t t = 0; t < n; ++t) DecodeRowRef(rows + t * RowBytes(), x + t * head_dim_);
  }

  const float* RotationMatrix() const override {
    return rotation_.empty() ? nullptr : rotation_.data();
  }

  void Scores(const uint8_t* rows, int64_t n, const float* q, int64_t group, float scale,
              float* scores, int64_t stride) const override {
    if (path_ == CodecPath::kReference) {
      return ScoresByDecoding(*this, rows, n, q, group, scale, scores, stride);
    }
    HWY_DYNAMIC_DISPATCH(VllmScoresImpl)
    (static_cast<int>(kind_), head_dim_, RowBytes(), scale_, rows, n, q, group, scale, scores,
     stride);
  }

  void AccumulateV(const uint8_t* rows, int64_t n, const float* p, int64_t group, int64_t stride,
                   float* acc) const override {
    if (path_ == CodecPath::kReference) {
      return AccumulateVByDecoding(*this, rows, n, p, group, stride, acc);
    }
    HWY_DYNAMIC_DISPATCH(VllmAccumulateImpl)
    (static_cast<int>(kind_), head_dim_, RowBytes(), scale_, rows, n, p, group, stride, acc);
  }

 private:
  bool IsTensor() const {
    return kind_ == VllmKind::kFp8E4M3Tensor || kind_ == VllmKind::kFp8E5M2Tensor;
  }
  const Fp8Format& Fp8() const { return kind_ == VllmKind::kFp8E5M2Tensor ? kE5M2 : kE4M3; }

  // The scalar twin: each element decoded as its format defines it.
  void DecodeRowRef(const uint8_t* row, float* x) const {
    const int64_t d = head_dim_;
    switch (kind_) {
      case VllmKind::kFp8E4M3Tensor:
      case VllmKind::kFp8E5M2Tensor:
        for (int64_t i = 0; i < d; ++i) x[i] = Fp8DecodeRef(row[i], Fp8()) * scale_;
        return;
      case VllmKind::kInt8TokenHead:
      case VllmKind::kFp8TokenHead: {
        const float s = RowScaleAt(row, d);
        for (int64_t i = 0; i < d; ++i) {
          int8_t q;
          std::memcpy(&q, row + i, 1);
          x[i] = (kind_ == VllmKind::kFp8TokenHead ? Fp8DecodeRef(row[i], kE4M3)
                                                   : static_cast<float>(q)) *
                 s;
        }
        return;
      }
      case VllmKind::kInt4: {  // in the rotated domain (the cache maps back)
        const Int4Params p = Int4RowParams(row, d, Int4InvSqrtDim(d));
        for (int64_t i = 0; i < d; ++i) {
          const uint8_t b = row[i >> 1];
          const auto u = static_cast<float>((i & 1) != 0 ? b >> 4 : b & 0xF);
          x[i] = (u - p.zero_point) * p.scale;
        }
        return;
      }
    }
  }
  static float RowScaleAt(const uint8_t* row, int64_t at) {
    float s;
    std::memcpy(&s, row + at, sizeof s);
    return s;
  }

  VllmKind kind_;
  bool calibrated_;
  CodecPath path_;
  float scale_ = 1.0f;           // per-tensor fp8: stored value = x / scale_
  std::vector<float> rotation_;  // int4: M = H D / sqrt(d), [d, d] row-major
};

struct VllmName {
  const char* name;
  VllmKind kind;
  bool calibrated;
  double bits;
};
constexpr VllmName kVllmNames[] = {
    {"fp8_e4m3-t1", VllmKind::kFp8E4M3Tensor, false, 8},
    {"fp8_e4m3-tcal", VllmKind::kFp8E4M3Tensor, true, 8},
    {"fp8_e5m2-t1", VllmKind::kFp8E5M2Tensor, false, 8},
    {"int8_per_token_head", VllmKind::kInt8TokenHead, false, 8},
    {"fp8_per_token_head", VllmKind::kFp8TokenHead, false, 8},
    {"int4_per_token_head", VllmKind::kInt4, false, 4},
};

}  // namespace

// Test hooks (tests/kv/vllm_codec_test.cc).
StatusOr<float> VllmCodecTensorScale(const KvCodec& codec) {
  const auto* c = dynamic_cast<const VllmCodec*>(&codec);
  if (c == nullptr) return Status::Error("not a vLLM codec");
  return c->scale();
}

StatusOr<std::unique_ptr<KvCodec>> MakeVllmCodec(const std::string& name, int64_t head_dim,
                                                 CodecPath path) {
  for (const VllmName& v : kVllmNames) {
    if (name != v.name) continue;
    if (v.kind == VllmKind::kInt4 && (head_dim < 2 || (head_dim & (head_dim - 1)) != 0)) {
      return Status::Error("KV cache type '" + name + "': head_dim " + std::to_string(head_dim) +
                           " is not a power of two (vLLM's Hadamard rotation needs one)");
    }
    return std::unique_ptr<KvCodec>(
        std::make_unique<VllmCodec>(v.kind, v.calibrated, head_dim, path));
  }
  return Status::Error("KV cache type '" + name + "': not a vLLM format");
}

}  // namespace kvq::codec

// ---- registry entry (kv/codec_registry.h) ----
namespace kvq {
namespace {

class VllmFormat final : public KvFormat {
 public:
  VllmFormat(std::string name, double bits) : name_(std::move(name)), bits_(bits) {}
  std::string Name() const override { return name_; }
  double NominalBits() const override { return bits_; }
  StatusOr<std::unique_ptr<KvCodec>> Make(int64_t head_dim, CodecPath path) const override {
    return codec::MakeVllmCodec(name_, head_dim, path);
  }

 private:
  std::string name_;
  double bits_;
};

bool ClaimsVllm(const std::string& base) {
  for (const codec::VllmName& v : codec::kVllmNames) {
    if (base == v.name) return true;
  }
  const std::string head = SplitKvName(base)[0];
  return head.find("_per_token_head") != std::string::npos ||
         ((head == "fp8_e4m3" || head == "fp8_e5m2") && base.size() > head.size() + 1 &&
          base[head.size() + 1] == 't');
}

StatusOr<std::shared_ptr<const KvFormat>> ParseVllm(const std::string& base,
                                                    const std::string& spelled) {
  for (const codec::VllmName& v : codec::kVllmNames) {
    if (base == v.name)
      return std::shared_ptr<const KvFormat>(std::make_shared<VllmFormat>(v.name, v.bits));
  }
  return Status::Error("KV cache type '" + spelled +
                       "': vLLM formats are fp8_e4m3-t1, fp8_e4m3-tcal, fp8_e5m2-t1, "
                       "int8_per_token_head, fp8_per_token_head, int4_per_token_head");
}

// Listed as samples, not as AllKvCodecNames: codec_test.cc's generic
// checks read int/fp8 layouts off those names' prefixes. Only where the SIMD
// kernels run (head_dim a multiple of 16; int4 a power of two).
std::vector<std::string> VllmSamples(int64_t head_dim) {
  if (head_dim % 16 != 0) return {};
  std::vector<std::string> names = {"fp8_e4m3-t1",
                                    "fp8_e5m2-t1",
                                    "int8_per_token_head",
                                    "fp8_per_token_head",
                                    "int8_per_token_head-r16",
                                    "fp8_per_token_head-s2",
                                    "fp8_e4m3-tcal"};
  if ((head_dim & (head_dim - 1)) == 0) names.push_back("int4_per_token_head");
  return names;
}

}  // namespace

const KvCodecFamily& VllmCodecFamily() {
  static const KvCodecFamily family{
      "vllm",
      "fp8_e4m3-t1|fp8_e4m3-tcal|fp8_e5m2-t1|int8_per_token_head|fp8_per_token_head|"
      "int4_per_token_head",
      "vLLM's own cache formats with vLLM's math. fp8_e4m3-t1 / fp8_e5m2-t1: one fp8 scale per "
      "layer and K/V equal to 1.0, vLLM's default when the checkpoint has no k_scale/v_scale "
      "(kvq's fp8_e4m3 instead calibrates one scale per layer, K/V and KV head on the first "
      "prefill); fp8_e4m3-tcal: the per-layer K and V scales of --kv-calibration (kvq "
      "calibrate's amax / 448, or a vLLM k_scale/v_scale safetensors file); x / scale rounded "
      "to nearest even, saturating. int8_per_token_head / fp8_per_token_head: an f32 scale "
      "absmax / 127 (448) per token and KV head, int8 rounded half away from zero. "
      "int4_per_token_head: vLLM's randomized Hadamard rotation, then per token and KV head "
      "asymmetric int4 with the zero-point in the f32 scale's low mantissa bits (head_dim a "
      "power of two).",
      ClaimsVllm,
      ParseVllm,
      [](int64_t) { return std::vector<std::string>{}; },
      VllmSamples,
      {},
      {},
      {},
      {}};
  return family;
}

}  // namespace kvq
#endif  // HWY_ONCE
