// Float codecs: f32, f16, bf16, fp8_e4m3, fp8_e5m2 (layouts in codec.h).
// SIMD kernels compiled once per Highway target; scalar twins below.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/fp16.h"
#include "kv/codec_formats.h"
#include "kv/codec_registry.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/codec_float.cc"
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

// x86 targets from AVX2 up have F16C: one instruction converts 8 or 16
// halves, rounding to nearest even like F32ToF16. Older targets convert lane
// by lane with the scalar reference (Highway's emulation there mis-handles
// inf/NaN), which keeps them exact and correct, just slower.
#undef KVQ_CODEC_HAVE_F16C
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define KVQ_CODEC_HAVE_F16C 1
#else
#define KVQ_CODEC_HAVE_F16C 0
#endif

// Float formats have no per-group parameters: one "group" spans the row.
#define KVQ_NO_GROUP_PARAMS                       \
  static constexpr bool kHasParams = false;       \
  int64_t ParamGroup() const { return head_dim; } \
  ScaleOffset Params(const uint8_t* /*row*/, int64_t /*g*/) const { return {}; }

// f32 rows are what the shared kernels' decode-once path reads (codec_kernels-inl.h).
using F32Fmt = DecodedFmt<DF>;

struct F16Fmt {
  using D = DF;
  int64_t head_dim;
  size_t row_bytes;
  KVQ_NO_GROUP_PARAMS
  HWY_INLINE VF Load(D d, const uint8_t* row, int64_t i, VF, VF) const {
    const auto* h = reinterpret_cast<const hwy::float16_t*>(row) + i;
#if KVQ_CODEC_HAVE_F16C
    return hn::PromoteTo(d, hn::LoadU(hn::Rebind<hwy::float16_t, D>(), h));
#else
    HWY_ALIGN float tmp[hn::MaxLanes(d)];
    for (size_t j = 0; j < hn::Lanes(d); ++j) {
      uint16_t bits;
      std::memcpy(&bits, h + j, 2);
      tmp[j] = F16ToF32(bits);
    }
    return hn::Load(d, tmp);
#endif
  }
};

struct BF16Fmt {
  using D = DF;
  int64_t head_dim;
  size_t row_bytes;
  KVQ_NO_GROUP_PARAMS
  HWY_INLINE VF Load(D d, const uint8_t* row, int64_t i, VF, VF) const {
    const hn::Rebind<uint16_t, D> du16;
    const VI bits = hn::BitCast(
        DI(), hn::PromoteTo(hn::RebindToUnsigned<D>(),
                            hn::LoadU(du16, reinterpret_cast<const uint16_t*>(row) + i)));
    return hn::BitCast(d, hn::ShiftLeft<16>(bits));
  }
};

// fp8 with kMantissa bits and exponent bias kBias. Decoding places the 7
// magnitude bits at the bottom of an f32's exponent field; multiplying by
// 2^(127 - bias) then rebiases normals and turns the f32 subnormals that fp8
// subnormals map to into the right normals, exactly. Codes above max_code
// (NaN, or e5m2's inf, which Encode never writes for finite input) give NaN.
template <int kMantissa, int kBias>
struct Fp8Fmt {
  using D = DF;
  int64_t head_dim;
  size_t row_bytes;
  float scale;
  int32_t max_code;
  KVQ_NO_GROUP_PARAMS
  static float Rebias() { return BitsToFloat(static_cast<uint32_t>(254 - kBias) << 23); }
  // One multiply by Rebias() * scale rounds the same exact product
  // (value * scale) once, like the two multiplies, whenever that constant is
  // itself exact: scale * 2^(127 - bias) finite (scale >= FLT_MIN always).
  bool SingleMultiply() const { return scale < std::numeric_limits<float>::max() / Rebias(); }
  HWY_INLINE VF Load(D d, const uint8_t* row, int64_t i, VF, VF) const {
    const DI di;
    // Sign-extended: bit 31 is the fp8 sign, bits 0-6 the magnitude.
    const VI code = hn::PromoteTo(
        di, hn::LoadU(hn::Rebind<int8_t, D>(), reinterpret_cast<const int8_t*>(row) + i));
    const VI magnitude = hn::And(code, hn::Set(di, 0x7F));
    const VI sign = hn::And(code, hn::Set(di, static_cast<int32_t>(0x80000000u)));
    const VF raw = hn::BitCast(d, hn::Or(sign, hn::ShiftLeft<23 - kMantissa>(magnitude)));
    const VF value = SingleMultiply()
                         ? hn::Mul(raw, hn::Set(d, Rebias() * scale))
                         : hn::Mul(hn::Mul(raw, hn::Set(d, Rebias())), hn::Set(d, scale));
    return hn::IfThenElse(hn::RebindMask(d, hn::Gt(magnitude, hn::Set(di, max_code))),
                          hn::Set(d, std::numeric_limits<float>::quiet_NaN()), value);
  }
};
using E4M3Fmt = Fp8Fmt<3, 7>;
using E5M2Fmt = Fp8Fmt<2, 15>;

// ---- encoders ----

void EncodeF16(const float* HWY_RESTRICT x, int64_t count, uint16_t* HWY_RESTRICT out) {
  int64_t i = 0;
#if KVQ_CODEC_HAVE_F16C
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const hn::Rebind<hwy::float16_t, DF> dh;
  for (; i + lanes <= count; i += lanes) {
    hn::StoreU(hn::DemoteTo(dh, hn::LoadU(d, x + i)), dh,
               reinterpret_cast<hwy::float16_t*>(out + i));
  }
#endif
  for (; i < count; ++i) out[i] = F32ToF16(x[i]);
}

// Round to nearest even on the bit pattern; NaN stays a quiet NaN.
void EncodeBF16(const float* HWY_RESTRICT x, int64_t count, uint16_t* HWY_RESTRICT out) {
  const DF d;
  const DI di;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> du16;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    const auto bits = hn::BitCast(du, hn::LoadU(d, x + i));
    const auto rounded = hn::Add(hn::Add(bits, hn::Set(du, 0x7FFFu)),
                                 hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u)));
    const auto quiet_nan = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x40u));
    const auto is_nan =
        hn::Gt(hn::BitCast(di, hn::And(bits, hn::Set(du, 0x7FFFFFFFu))), hn::Set(di, 0x7F800000));
    const auto top =
        hn::IfThenElse(hn::RebindMask(du, is_nan), quiet_nan, hn::ShiftRight<16>(rounded));
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, top)), du16, out + i);
  }
  for (; i < count; ++i) out[i] = F32ToBf16(x[i]);
}

// y = x / scale, then the code as Fp8EncodeRef defines it, computed as
// r = round_half_even(|y| * 2^-eq) with eq = max(exponent(|y|), emin) - M,
// code = ((eq + M + bias) << M) + r - 2^M: r in [2^M, 2^(M+1)] for normals
// (r = 2^(M+1) carries into the exponent), and for subnormals
// eq + M + bias = 1 so code = r.
template <int kMantissa, int kBias>
void EncodeFp8(const float* HWY_RESTRICT x, int64_t count, float scale, float max_finite,
               int32_t max_code, int32_t nan_code, uint8_t* HWY_RESTRICT out) {
  const DF d;
  const DI di;
  const hn::Rebind<uint8_t, DF> du8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  constexpr int32_t kMinExponent = 1 - kBias;
  int64_t i = 0;
  for (; i < count; i += lanes) {
    HWY_ALIGN float tail[hn::MaxLanes(d)] = {};
    const float* src = x + i;
    if (i + lanes > count) {
      std::copy(x + i, x + count, tail);
      src = tail;
    }
    const VF y = hn::Div(hn::LoadU(d, src), hn::Set(d, scale));
    const VI bits = hn::BitCast(di, y);
    const VF a = hn::Min(hn::Abs(y), hn::Set(d, max_finite));
    VI e = hn::Sub(hn::ShiftRight<23>(hn::BitCast(di, a)), hn::Set(di, 127));
    e = hn::Max(e, hn::Set(di, kMinExponent));
    const VI eq = hn::Sub(e, hn::Set(di, kMantissa));
    const VF inv_quantum = hn::BitCast(d, hn::ShiftLeft<23>(hn::Sub(hn::Set(di, 127), eq)));
    const VI r = hn::NearestInt(hn::Mul(a, inv_quantum));
    VI code = hn::Add(hn::ShiftLeft<kMantissa>(hn::Add(eq, hn::Set(di, kMantissa + kBias))),
                      hn::Sub(r, hn::Set(di, 1 << kMantissa)));
    code = hn::Min(code, hn::Set(di, max_code));
    code = hn::IfThenElse(hn::RebindMask(di, hn::IsNaN(y)), hn::Set(di, nan_code), code);
    code = hn::Or(code, hn::And(hn::ShiftRight<24>(bits), hn::Set(di, 0x80)));
    const auto bytes = hn::DemoteTo(du8, code);
    if (i + lanes <= count) {
      hn::StoreU(bytes, du8, out + i);
    } else {
      HWY_ALIGN uint8_t tmp[hn::MaxLanes(du8)];
      hn::Store(bytes, du8, tmp);
      std::copy(tmp, tmp + (count - i), out + i);
    }
  }
}

// ---- exported entry points (same signature on every target) ----

template <class F>
HWY_INLINE void WithFormat(int kind, int64_t dim, float fp8_scale, const F& f) {
  switch (static_cast<FloatKind>(kind)) {
    case FloatKind::kF32:
      return f(F32Fmt{dim, static_cast<size_t>(4 * dim)});
    case FloatKind::kF16:
      return f(F16Fmt{dim, static_cast<size_t>(2 * dim)});
    case FloatKind::kBF16:
      return f(BF16Fmt{dim, static_cast<size_t>(2 * dim)});
    case FloatKind::kFp8E4M3:
      return f(E4M3Fmt{dim, static_cast<size_t>(dim), fp8_scale, kE4M3.max_code});
    case FloatKind::kFp8E5M2:
      return f(E5M2Fmt{dim, static_cast<size_t>(dim), fp8_scale, kE5M2.max_code});
  }
}

void FloatEncodeImpl(int kind, int64_t dim, float fp8_scale, const float* x, int64_t n,
                     uint8_t* rows) {
  const int64_t count = n * dim;
  switch (static_cast<FloatKind>(kind)) {
    case FloatKind::kF32:
      if (count > 0) std::memcpy(rows, x, static_cast<size_t>(count) * 4);
      return;
    case FloatKind::kF16:
      return EncodeF16(x, count, reinterpret_cast<uint16_t*>(rows));
    case FloatKind::kBF16:
      return EncodeBF16(x, count, reinterpret_cast<uint16_t*>(rows));
    case FloatKind::kFp8E4M3:
      return EncodeFp8<3, 7>(x, count, fp8_scale, kE4M3.max_finite, kE4M3.max_code, kE4M3.nan_code,
                             rows);
    case FloatKind::kFp8E5M2:
      return EncodeFp8<2, 15>(x, count, fp8_scale, kE5M2.max_finite, kE5M2.max_code, kE5M2.nan_code,
                              rows);
  }
}

void FloatDecodeImpl(int kind, int64_t dim, float fp8_scale, const uint8_t* rows, int64_t n,
                     float* x) {
  WithFormat(kind, dim, fp8_scale, [&](const auto& fmt) { DecodeRows(fmt, rows, n, x); });
}

void FloatScoresImpl(int kind, int64_t dim, float fp8_scale, const uint8_t* rows, int64_t n,
                     const float* q, int64_t group, float scale, float* scores, int64_t stride) {
  WithFormat(kind, dim, fp8_scale,
             [&](const auto& fmt) { Scores(fmt, rows, n, q, group, scale, scores, stride); });
}

void FloatAccumulateImpl(int kind, int64_t dim, float fp8_scale, const uint8_t* rows, int64_t n,
                         const float* p, int64_t group, int64_t stride, float* acc) {
  WithFormat(kind, dim, fp8_scale,
             [&](const auto& fmt) { AccumulateV(fmt, rows, n, p, group, stride, acc); });
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::codec
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::codec {

HWY_EXPORT(FloatEncodeImpl);
HWY_EXPORT(FloatDecodeImpl);
HWY_EXPORT(FloatScoresImpl);
HWY_EXPORT(FloatAccumulateImpl);

uint8_t Fp8EncodeRef(float y, const Fp8Format& f) {
  const uint8_t sign = std::signbit(y) ? 0x80 : 0x00;
  if (std::isnan(y)) return sign | f.nan_code;
  const double a = std::fabs(static_cast<double>(y));
  if (a >= f.max_finite) return sign | f.max_code;
  if (a == 0.0) return sign;
  const int min_exponent = 1 - f.bias;
  int frexp_exponent = 0;
  std::frexp(a, &frexp_exponent);  // a = m * 2^frexp_exponent, m in [0.5, 1)
  const int exponent = std::max(frexp_exponent - 1, min_exponent);
  // Multiples of 2^(exponent - M) are the representable values near a.
  const double r = std::nearbyint(std::ldexp(a, f.mantissa_bits - exponent));
  const int implicit = 1 << f.mantissa_bits;
  int code;
  if (exponent == min_exponent && r < implicit) {
    code = static_cast<int>(r);  // subnormal (or zero)
  } else if (r == 2 * implicit) {
    code = (exponent + f.bias + 1) << f.mantissa_bits;  // rounded up to the next power of two
  } else {
    code = ((exponent + f.bias) << f.mantissa_bits) | (static_cast<int>(r) - implicit);
  }
  return sign | static_cast<uint8_t>(std::min(code, static_cast<int>(f.max_code)));
}

float Fp8DecodeRef(uint8_t code, const Fp8Format& f) {
  const int magnitude = code & 0x7F;
  float value;
  if (magnitude > f.max_code) {
    value = std::numeric_limits<float>::quiet_NaN();
  } else {
    const int exponent_field = magnitude >> f.mantissa_bits;
    const int mantissa = magnitude & ((1 << f.mantissa_bits) - 1);
    value = exponent_field == 0
                ? std::ldexp(static_cast<float>(mantissa), 1 - f.bias - f.mantissa_bits)
                : std::ldexp(static_cast<float>((1 << f.mantissa_bits) + mantissa),
                             exponent_field - f.bias - f.mantissa_bits);
  }
  return (code & 0x80) ? -value : value;
}

namespace {

class FloatCodec final : public KvCodec {
 public:
  // The SIMD kernels step 16 values at a time; other head_dims (toy test
  // models) run the scalar twins.
  FloatCodec(FloatKind kind, int64_t head_dim, CodecPath path)
      : KvCodec(head_dim), kind_(kind), path_(head_dim % 16 == 0 ? path : CodecPath::kReference) {}

  std::string FormatName() const override {
    switch (kind_) {
      case FloatKind::kF32:
        return "f32";
      case FloatKind::kF16:
        return "f16";
      case FloatKind::kBF16:
        return "bf16";
      case FloatKind::kFp8E4M3:
        return kE4M3.name;
      case FloatKind::kFp8E5M2:
        return kE5M2.name;
    }
    return "?";
  }
  size_t RowBytes() const override { return static_cast<size_t>(head_dim_) * BytesPerValue(); }
  size_t SideBytes() const override { return IsFp8() ? sizeof(float) : 0; }
  bool NeedsCalibration() const override { return IsFp8(); }

  // scale = absmax / max_finite over the finite values; all-zero (or no
  // finite) input keeps scale 1.
  void Calibrate(const float* x, int64_t n) override {
    if (!IsFp8() || calibrated_ || n <= 0) return;
    float absmax = 0.0f;
    for (int64_t i = 0; i < n * head_dim_; ++i) {
      if (std::isfinite(x[i])) absmax = std::max(absmax, std::fabs(x[i]));
    }
    const float scale = absmax / Fp8().max_finite;
    // A scale that underflows to 0 (or a subnormal reciprocal) would divide
    // by zero in Encode: such tiny values are then stored unscaled.
    if (scale >= std::numeric_limits<float>::min()) scale_ = scale;
    calibrated_ = true;
  }
  float scale() const { return scale_; }

  void Encode(const float* x, int64_t n, uint8_t* rows) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(FloatEncodeImpl)(static_cast<int>(kind_), head_dim_, scale_, x, n,
                                                   rows);
    }
    for (int64_t i = 0; i < n * head_dim_; ++i) {
      switch (kind_) {
        case FloatKind::kF32:
          std::memcpy(rows + 4 * i, x + i, 4);
          break;
        case FloatKind::kF16:
          StoreU16(rows + 2 * i, F32ToF16(x[i]));
          break;
        case FloatKind::kBF16:
          StoreU16(rows + 2 * i, F32ToBf16(x[i]));
          break;
        case FloatKind::kFp8E4M3:
        case FloatKind::kFp8E5M2:
          rows[i] = Fp8EncodeRef(x[i] / scale_, Fp8());
          break;
      }
    }
  }

  void Decode(const uint8_t* rows, int64_t n, float* x) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(FloatDecodeImpl)(static_cast<int>(kind_), head_dim_, scale_, rows,
                                                   n, x);
    }
    for (int64_t i = 0; i < n * head_dim_; ++i) {
      switch (kind_) {
        case FloatKind::kF32:
          std::memcpy(x + i, rows + 4 * i, 4);
          break;
        case FloatKind::kF16:
          x[i] = F16ToF32(LoadU16(rows + 2 * i));
          break;
        case FloatKind::kBF16:
          x[i] = Bf16ToF32(LoadU16(rows + 2 * i));
          break;
        case FloatKind::kFp8E4M3:
        case FloatKind::kFp8E5M2:
          x[i] = Fp8DecodeRef(rows[i], Fp8()) * scale_;
          break;
      }
    }
  }

  void Scores(const uint8_t* rows, int64_t n, const float* q, int64_t group, float scale,
              float* scores, int64_t stride) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(FloatScoresImpl)(static_cast<int>(kind_), head_dim_, scale_, rows,
                                                   n, q, group, scale, scores, stride);
    }
    ScoresByDecoding(*this, rows, n, q, group, scale, scores, stride);
  }

  void AccumulateV(const uint8_t* rows, int64_t n, const float* p, int64_t group, int64_t stride,
                   float* acc) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(FloatAccumulateImpl)(static_cast<int>(kind_), head_dim_, scale_,
                                                       rows, n, p, group, stride, acc);
    }
    AccumulateVByDecoding(*this, rows, n, p, group, stride, acc);
  }

 private:
  bool IsFp8() const { return kind_ == FloatKind::kFp8E4M3 || kind_ == FloatKind::kFp8E5M2; }
  const Fp8Format& Fp8() const { return kind_ == FloatKind::kFp8E4M3 ? kE4M3 : kE5M2; }
  size_t BytesPerValue() const {
    switch (kind_) {
      case FloatKind::kF32:
        return 4;
      case FloatKind::kF16:
      case FloatKind::kBF16:
        return 2;
      case FloatKind::kFp8E4M3:
      case FloatKind::kFp8E5M2:
        return 1;
    }
    return 0;  // unreachable: every FloatKind is a case (-Wswitch checks)
  }
  static void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
  static uint16_t LoadU16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }

  FloatKind kind_;
  CodecPath path_;
  float scale_ = 1.0f;  // fp8 only: stored value = x / scale_
  bool calibrated_ = false;
};

}  // namespace

std::unique_ptr<KvCodec> MakeFloatCodec(FloatKind kind, int64_t head_dim, CodecPath path) {
  return std::make_unique<FloatCodec>(kind, head_dim, path);
}

}  // namespace kvq::codec

// ---- registry entry (kv/codec_registry.h) ----
namespace kvq {
namespace {

struct FloatName {
  const char* name;
  codec::FloatKind kind;
  double bits;
};
constexpr FloatName kFloatNames[] = {
    {"f32", codec::FloatKind::kF32, 32},         {"f16", codec::FloatKind::kF16, 16},
    {"bf16", codec::FloatKind::kBF16, 16},       {"fp8_e4m3", codec::FloatKind::kFp8E4M3, 8},
    {"fp8_e5m2", codec::FloatKind::kFp8E5M2, 8},
};

class FloatFormat final : public KvFormat {
 public:
  explicit FloatFormat(const FloatName& f) : f_(f) {}
  std::string Name() const override { return f_.name; }
  double NominalBits() const override { return f_.bits; }
  StatusOr<std::unique_ptr<KvCodec>> Make(int64_t head_dim, CodecPath path) const override {
    return codec::MakeFloatCodec(f_.kind, head_dim, path);
  }

 private:
  FloatName f_;
};

bool ClaimsFloat(const std::string& base) {
  for (const FloatName& f : kFloatNames) {
    if (base == f.name || base.rfind(std::string(f.name) + "-", 0) == 0) return true;
  }
  return false;
}

StatusOr<std::shared_ptr<const KvFormat>> ParseFloat(const std::string& base,
                                                     const std::string& spelled) {
  for (const FloatName& f : kFloatNames) {
    if (base == f.name) return std::shared_ptr<const KvFormat>(std::make_shared<FloatFormat>(f));
  }
  return Status::Error("KV cache type '" + spelled + "': " + base.substr(0, base.find('-')) +
                       " takes no format options");
}

std::vector<std::string> FloatNames(int64_t /*head_dim*/) {
  std::vector<std::string> names;
  for (const FloatName& f : kFloatNames) names.push_back(f.name);
  return names;
}

std::vector<std::string> FloatSamples(int64_t /*head_dim*/) { return {"f32-s4", "bf16-r16"}; }

}  // namespace

const KvCodecFamily& FloatCodecFamily() {
  static const KvCodecFamily family{
      "float",
      "f32|f16|bf16|fp8_e4m3|fp8_e5m2",
      "IEEE f32 / f16 (round to nearest even), bf16, and OCP fp8 E4M3FN / E5M2 storing x / "
      "scale with one f32 scale per (layer, K/V, KV head) calibrated on the first prefill.",
      ClaimsFloat,
      ParseFloat,
      FloatNames,
      FloatSamples,
      {"f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"},
      {"f16", "bf16", "fp8_e4m3", "fp8_e5m2"},
      {{"auto", "f16", "vLLM's default (the model's dtype); kvq's default cache type is f16"},
       {"fp8", "fp8_e4m3", "vLLM: fp8 means E4M3"}},
      {}};
  return family;
}

}  // namespace kvq
#endif  // HWY_ONCE
