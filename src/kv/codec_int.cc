// Integer group codecs: int8 / int4 / int2, group 32 / 64 / 128, symmetric
// or asymmetric (layout and mapping in codec.h). SIMD kernels compiled once
// per Highway target; scalar twins below. Scores uses integer dot products
// over a per-group int8 quantization of q (codec_int_scores.h).
//
// AVX3_DL (AVX-512 VNNI: vpdpbusd) is not among Highway 1.0's default
// dynamic-dispatch targets; this file opts in (before any Highway include).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "base/fp16.h"
#include "kv/codec_formats.h"
#include "kv/codec_int_scores.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/codec_int.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h (per-target code).
#include "kv/codec_int_scores-inl.h"
#include "kv/codec_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq::codec {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A group scale or min: F16C converts one half in one instruction on every
// AVX2+ target; the portable path branches on the exponent.
HWY_INLINE float HalfToF32(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(bits);
#else
  return F16ToF32(bits);
#endif
}

// int2 decodes 8 lanes per load (8 code bytes hold a 32-value block), the
// others up to 16.
template <int kBits>
using IntTag = hn::CappedTag<float, kBits == 2 ? 8 : 16>;

template <int kBits, bool kSymmetric>
struct IntFmt {
  using D = IntTag<kBits>;
  static constexpr int kCodeBits = kBits;
  int64_t head_dim;
  size_t row_bytes;
  int group_shift;  // log2(group)
  int64_t code_bytes;
  int64_t groups;

  static constexpr bool kHasParams = true;
  int64_t ParamGroup() const { return int64_t{1} << group_shift; }
  HWY_INLINE ScaleOffset Params(const uint8_t* row, int64_t g) const {
    const float scale = HalfToF32(row + code_bytes + 2 * g);
    const float offset = kSymmetric ? -static_cast<float>(1 << (kBits - 1)) * scale
                                    : HalfToF32(row + code_bytes + 2 * (groups + g));
    return {scale, offset};
  }

  HWY_INLINE hn::Vec<D> Load(D d, const uint8_t* row, int64_t i, hn::Vec<D> scale,
                             hn::Vec<D> offset) const {
    const auto u = LoadIntCodes<kBits>(d, row, i);
    return hn::MulAdd(hn::ConvertTo(d, u), scale, offset);
  }
};

// Codes of x[i, i + Lanes) under p.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> Quantize(D d, const float* x, const GroupParams& p,
                                                   float max_code) {
  const hn::Vec<D> t =
      hn::Mul(hn::Sub(hn::LoadU(d, x), hn::Set(d, p.offset)), hn::Set(d, p.inv_scale));
  // Max before Min and both before rounding, as IntQuantizeRef: a NaN t
  // becomes 0 (x86 max returns its second operand on NaN, like std::fmax).
  return hn::NearestInt(hn::Min(hn::Max(t, hn::Zero(d)), hn::Set(d, max_code)));
}

template <int kBits>
void EncodeRows(const IntFormat& f, int64_t dim, const float* HWY_RESTRICT x, int64_t n,
                uint8_t* HWY_RESTRICT rows) {
  using D = IntTag<kBits>;
  const D d;
  const hn::Rebind<uint8_t, D> du8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t code_bytes = static_cast<int64_t>(f.CodeBytes(dim));
  const int64_t groups = f.Groups(dim);
  const int64_t row_bytes = static_cast<int64_t>(f.RowBytes(dim));
  const float max_code = static_cast<float>(f.Levels() - 1);
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * dim;
    uint8_t* row = rows + t * row_bytes;
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = xr + g * f.group;
      auto vmin = hn::LoadU(d, xg);
      auto vmax = vmin;
      for (int64_t i = lanes; i < f.group; i += lanes) {
        vmin = hn::Min(vmin, hn::LoadU(d, xg + i));
        vmax = hn::Max(vmax, hn::LoadU(d, xg + i));
      }
      const GroupParams p = IntGroupParams(f, hn::GetLane(hn::MinOfLanes(d, vmin)),
                                           hn::GetLane(hn::MaxOfLanes(d, vmax)));
      std::memcpy(row + code_bytes + 2 * g, &p.scale_bits, 2);
      if (!f.symmetric) std::memcpy(row + code_bytes + 2 * (groups + g), &p.min_bits, 2);
      for (int64_t b = 0; b < f.group; b += 32) {  // one 32-value packing block
        const float* xb = xg + b;
        const int64_t first = g * f.group + b;  // element index of the block
        if constexpr (kBits == 8) {
          for (int64_t j = 0; j < 32; j += lanes) {
            hn::StoreU(hn::DemoteTo(du8, Quantize(d, xb + j, p, max_code)), du8, row + first + j);
          }
        } else if constexpr (kBits == 4) {
          for (int64_t j = 0; j < 16; j += lanes) {
            const auto lo = Quantize(d, xb + j, p, max_code);
            const auto hi = Quantize(d, xb + 16 + j, p, max_code);
            hn::StoreU(hn::DemoteTo(du8, hn::Or(lo, hn::ShiftLeft<4>(hi))), du8,
                       row + first / 2 + j);
          }
        } else {
          for (int64_t j = 0; j < 8; j += lanes) {
            auto packed = Quantize(d, xb + j, p, max_code);
            packed = hn::Or(packed, hn::ShiftLeft<2>(Quantize(d, xb + 8 + j, p, max_code)));
            packed = hn::Or(packed, hn::ShiftLeft<4>(Quantize(d, xb + 16 + j, p, max_code)));
            packed = hn::Or(packed, hn::ShiftLeft<6>(Quantize(d, xb + 24 + j, p, max_code)));
            hn::StoreU(hn::DemoteTo(du8, packed), du8, row + first / 4 + j);
          }
        }
      }
    }
  }
}

int GroupShift(int64_t group) {
  int shift = 0;
  while ((int64_t{1} << shift) < group) ++shift;
  return shift;
}

// The one dispatcher of this family: calls fn(integral_constant<bits>,
// bool_constant<symmetric>) for the instantiations this build has and
// returns false, running nothing, for any other (bits, symmetric).
// MakeIntCodec refuses such a format up front (IntKernelStatus), so no
// kernel ever runs a width it was not written for.
template <class F>
HWY_INLINE bool WithBitsAndSymmetry(const IntFormat& f, const F& fn) {
  switch (f.bits * 2 + (f.symmetric ? 1 : 0)) {
    case 16:
      return fn(std::integral_constant<int, 8>(), std::false_type()), true;
    case 17:
      return fn(std::integral_constant<int, 8>(), std::true_type()), true;
    case 8:
      return fn(std::integral_constant<int, 4>(), std::false_type()), true;
    case 9:
      return fn(std::integral_constant<int, 4>(), std::true_type()), true;
    case 4:
      return fn(std::integral_constant<int, 2>(), std::false_type()), true;
    case 5:
      return fn(std::integral_constant<int, 2>(), std::true_type()), true;
    default:
      return false;
  }
}

// Calls fn with the format object for (bits, symmetric); false as above.
template <class F>
HWY_INLINE bool WithFormat(const IntFormat& f, int64_t dim, const F& fn) {
  const size_t row_bytes = f.RowBytes(dim);
  const int shift = GroupShift(f.group);
  const int64_t code_bytes = static_cast<int64_t>(f.CodeBytes(dim));
  const int64_t groups = f.Groups(dim);
  return WithBitsAndSymmetry(f, [&](auto bits, auto symmetric) {
    IntFmt<decltype(bits)::value, decltype(symmetric)::value> fmt{};
    fmt.head_dim = dim;
    fmt.row_bytes = row_bytes;
    fmt.group_shift = shift;
    fmt.code_bytes = code_bytes;
    fmt.groups = groups;
    fn(fmt);
  });
}

bool IntKernelExistsImpl(const IntFormat& f) {
  return WithBitsAndSymmetry(f, [](auto, auto) {});
}

void IntEncodeImpl(const IntFormat& f, int64_t dim, const float* x, int64_t n, uint8_t* rows) {
  WithBitsAndSymmetry(
      f, [&](auto bits, auto) { EncodeRows<decltype(bits)::value>(f, dim, x, n, rows); });
}

void IntDecodeImpl(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n, float* x) {
  WithFormat(f, dim, [&](const auto& fmt) { DecodeRows(fmt, rows, n, x); });
}

IntRowLayout RowLayout(const IntFormat& f, int64_t dim) {
  return {dim, static_cast<int64_t>(f.RowBytes(dim)), static_cast<int64_t>(f.CodeBytes(dim)),
          f.group, f.Groups(dim)};
}

void IntScoresImpl(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n, const float* q,
                   int64_t group, float scale, float* scores, int64_t stride) {
  WithBitsAndSymmetry(f, [&](auto bits, auto symmetric) {
    IntDotScores<decltype(bits)::value, decltype(symmetric)::value, false>(
        RowLayout(f, dim), rows, n, q, nullptr, group, scale, scores, stride, nullptr);
  });
}

size_t IntPreparedBytesImpl(const IntFormat& f, int64_t dim, int64_t heads) {
  return PreparedQueryLayout(heads, dim, f.Groups(dim)).bytes;
}

void IntPrepareQueryImpl(const IntFormat& f, int64_t dim, const float* q, int64_t heads,
                         uint8_t* prepared) {
  WithBitsAndSymmetry(f, [&](auto bits, auto) {
    PrepareQueryHeads<decltype(bits)::value>(RowLayout(f, dim), q, heads, prepared);
  });
}

void IntScoresPreparedImpl(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n,
                           const uint8_t* prepared, int64_t heads, float scale, float* scores,
                           int64_t stride) {
  WithBitsAndSymmetry(f, [&](auto bits, auto symmetric) {
    IntDotScoresPrepared<decltype(bits)::value, decltype(symmetric)::value>(
        RowLayout(f, dim), rows, n, prepared, heads, scale, scores, stride);
  });
}

void QuantizeQueryImpl(const float* q, int64_t dim, int64_t group, int8_t* q8, float* qscale,
                       int32_t* qsum) {
  QuantizeQueryHeads(q, 1, dim, group, q8, qscale, qsum);
}

// The integer stage does not depend on the symmetry (it only changes the
// f32 epilogue), so one instantiation per bit width serves both.
void IntGroupDotsImpl(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n,
                      const int8_t* q8, int64_t heads, int32_t* dots) {
  const IntRowLayout layout = RowLayout(f, dim);
  WithBitsAndSymmetry(f, [&](auto bits, auto) {
    IntDotScores<decltype(bits)::value, false, true>(layout, rows, n, nullptr, q8, heads, 0.0f,
                                                     nullptr, 0, dots);
  });
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// AccumulateV with 16 f32 lanes: one 32-value packing block (two vectors) at
// a time, rows inner, so each row's codes are loaded once for both vectors
// and its (scale, offset) broadcast once. int4/int2 decode through a
// 16-entry table (u * scale + offset for u = 0..15, one MulAdd per row and
// block, the same fused op DecodeRows uses, so values are bit-identical) and
// vpermps instead of a convert and a MulAdd per vector. The accumulation
// order per lane (rows in order, one FMA each) is the generic pass's.
template <int64_t kHeads, class Fmt>
HWY_NOINLINE void AccumulateBlocks16(const Fmt& fmt, const uint8_t* HWY_RESTRICT rows, int64_t n,
                                     const float* HWY_RESTRICT p, int64_t stride,
                                     float* HWY_RESTRICT acc) {
  constexpr int kBits = Fmt::kCodeBits;
  const hn::Full512<float> df;
  const hn::Full512<int32_t> di;
  const hn::Full128<uint8_t> du8x16;
  const hn::Full256<int32_t> di8;
  const hn::Full64<uint8_t> du8x8;
  using VF = hn::Vec<decltype(df)>;
  const int64_t dim = fmt.head_dim, row_bytes = static_cast<int64_t>(fmt.row_bytes);
  const int64_t groups = fmt.groups;
  const VF iota = hn::Iota(df, 0.0f);
  // int2: lanes 0-7 and 8-15 of a vector hold the same 8 code bytes; these
  // shifts pick elements 0-15 (fields 0, 1) and 16-31 (fields 2, 3).
  alignas(64) static constexpr int32_t kShift0[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                                      2, 2, 2, 2, 2, 2, 2, 2};
  alignas(64) static constexpr int32_t kShift1[16] = {4, 4, 4, 4, 4, 4, 4, 4,
                                                      6, 6, 6, 6, 6, 6, 6, 6};
  float scales[kAccumulateRowBlock * kMaxParamGroups];   // [rows, groups]
  float offsets[kAccumulateRowBlock * kMaxParamGroups];  // [rows, groups]
  for (int64_t t0 = 0; t0 < n; t0 += kAccumulateRowBlock) {
    const int64_t t1 = std::min(n, t0 + kAccumulateRowBlock);
    PrefetchAhead(rows + t0 * row_bytes, rows + t1 * row_bytes);
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t g = 0; g < groups; ++g) {
        const ScaleOffset so = fmt.Params(rows + t * row_bytes, g);
        scales[(t - t0) * groups + g] = so.scale;
        offsets[(t - t0) * groups + g] = so.offset;
      }
    }
    for (int64_t b = 0; b < dim / 32; ++b) {
      const int64_t g = (b * 32) >> fmt.group_shift;
      VF a0[kHeads], a1[kHeads];
      for (int64_t h = 0; h < kHeads; ++h) {
        a0[h] = hn::LoadU(df, acc + h * dim + 32 * b);
        a1[h] = hn::LoadU(df, acc + h * dim + 32 * b + 16);
      }
      for (int64_t t = t0; t < t1; ++t) {
        const VF s = hn::Set(df, scales[(t - t0) * groups + g]);
        const VF o = hn::Set(df, offsets[(t - t0) * groups + g]);
        const uint8_t* row = rows + t * row_bytes;
        VF x0, x1;
        if constexpr (kBits == 8) {
          x0 = hn::MulAdd(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(du8x16, row + 32 * b))), s,
                          o);
          x1 = hn::MulAdd(
              hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(du8x16, row + 32 * b + 16))), s, o);
        } else {
          const VF table = hn::MulAdd(iota, s, o);
          hn::Vec<decltype(di)> u0, u1;
          if constexpr (kBits == 4) {
            const auto raw = hn::PromoteTo(di, hn::LoadU(du8x16, row + 16 * b));
            u0 = hn::And(raw, hn::Set(di, 0xF));
            u1 = hn::ShiftRight<4>(raw);
          } else {
            const auto half = hn::PromoteTo(di8, hn::LoadU(du8x8, row + 8 * b));
            const auto raw = hn::Combine(di, half, half);
            u0 = hn::And(hn::Shr(raw, hn::Load(di, kShift0)), hn::Set(di, 3));
            u1 = hn::And(hn::Shr(raw, hn::Load(di, kShift1)), hn::Set(di, 3));
          }
          x0 = hn::TableLookupLanes(table, hn::IndicesFromVec(df, u0));
          x1 = hn::TableLookupLanes(table, hn::IndicesFromVec(df, u1));
        }
        for (int64_t h = 0; h < kHeads; ++h) {
          const VF pv = hn::Set(df, p[h * stride + t]);
          a0[h] = hn::MulAdd(pv, x0, a0[h]);
          a1[h] = hn::MulAdd(pv, x1, a1[h]);
        }
      }
      for (int64_t h = 0; h < kHeads; ++h) {
        hn::StoreU(a0[h], df, acc + h * dim + 32 * b);
        hn::StoreU(a1[h], df, acc + h * dim + 32 * b + 16);
      }
    }
  }
}
#endif

void IntAccumulateImpl(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n,
                       const float* p, int64_t group, int64_t stride, float* acc) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  WithFormat(f, dim, [&](const auto& fmt) {
    for (int64_t h0 = 0; h0 < group; h0 += kMaxHeadsPerPass) {
      WithHeadCount(std::min(kMaxHeadsPerPass, group - h0), [&](auto heads) {
        AccumulateBlocks16<decltype(heads)::value>(fmt, rows, n, p + h0 * stride, stride,
                                                   acc + h0 * dim);
      });
    }
  });
#else
  WithFormat(f, dim, [&](const auto& fmt) { AccumulateV(fmt, rows, n, p, group, stride, acc); });
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::codec
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::codec {

HWY_EXPORT(IntEncodeImpl);
HWY_EXPORT(IntDecodeImpl);
HWY_EXPORT(IntScoresImpl);
HWY_EXPORT(IntGroupDotsImpl);
HWY_EXPORT(QuantizeQueryImpl);
HWY_EXPORT(IntPreparedBytesImpl);
HWY_EXPORT(IntPrepareQueryImpl);
HWY_EXPORT(IntScoresPreparedImpl);
HWY_EXPORT(IntAccumulateImpl);
HWY_EXPORT(IntKernelExistsImpl);

std::string IntFormat::Name() const {
  return "int" + std::to_string(bits) + (per_channel ? "-c" : "-g") + std::to_string(group) +
         (symmetric ? "-sym" : "-asym");
}

GroupParams IntGroupParams(const IntFormat& f, float min, float max) {
  constexpr float kF16Max = 65504.0f;
  // fmin/fmax return the non-NaN operand, so NaN input never reaches a
  // float-to-int conversion (undefined behaviour) anywhere below.
  auto saturate = [&](float v) { return std::fmin(std::fmax(v, -kF16Max), kF16Max); };
  const float half_levels = static_cast<float>(f.Levels() / 2);
  GroupParams p{};
  if (f.symmetric) {
    const float extreme = max >= -min ? max : min;  // largest magnitude, positive on a tie
    p.scale_bits = F32ToF16(saturate(extreme / -half_levels));
    p.scale = F16ToF32(p.scale_bits);
    p.offset = -half_levels * p.scale;
  } else {
    p.scale_bits = F32ToF16(saturate((max - min) / static_cast<float>(f.Levels() - 1)));
    p.min_bits = F32ToF16(saturate(min));
    p.scale = F16ToF32(p.scale_bits);
    p.offset = F16ToF32(p.min_bits);
  }
  p.inv_scale = p.scale != 0.0f ? 1.0f / p.scale : 0.0f;
  return p;
}

uint8_t IntQuantizeRef(const IntFormat& f, const GroupParams& p, float x) {
  const float t = (x - p.offset) * p.inv_scale;
  const float clamped = std::fmin(std::fmax(t, 0.0f), static_cast<float>(f.Levels() - 1));
  return static_cast<uint8_t>(std::nearbyint(clamped));
}

void IntPackRef(const IntFormat& f, int64_t i, uint8_t u, uint8_t* codes) {
  const int64_t block = i / 32, within = i % 32;
  switch (f.bits) {
    case 8:
      codes[i] = u;
      break;
    case 4: {
      uint8_t& byte = codes[block * 16 + within % 16];
      byte = within < 16 ? static_cast<uint8_t>((byte & 0xF0) | u)
                         : static_cast<uint8_t>((byte & 0x0F) | (u << 4));
      break;
    }
    case 2: {
      const int shift = static_cast<int>(2 * (within / 8));
      uint8_t& byte = codes[block * 8 + within % 8];
      byte = static_cast<uint8_t>((byte & ~(3 << shift)) | (u << shift));
      break;
    }
  }
}

uint8_t IntUnpackRef(const IntFormat& f, int64_t i, const uint8_t* codes) {
  const int64_t block = i / 32, within = i % 32;
  switch (f.bits) {
    case 8:
      return codes[i];
    case 4: {
      const uint8_t byte = codes[block * 16 + within % 16];
      return within < 16 ? byte & 0xF : byte >> 4;
    }
    case 2:
      return (codes[block * 8 + within % 8] >> (2 * (within / 8))) & 3;
  }
  return 0;  // unreachable: MakeIntCodec admits only the widths above
}

void IntGroupDots(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n, const int8_t* q8,
                  int64_t heads, int32_t* dots) {
  HWY_DYNAMIC_DISPATCH(IntGroupDotsImpl)(f, dim, rows, n, q8, heads, dots);
}

void QuantizeQuery(const float* q, int64_t dim, int64_t group, int8_t* q8, float* qscale,
                   int32_t* qsum) {
  HWY_DYNAMIC_DISPATCH(QuantizeQueryImpl)(q, dim, group, q8, qscale, qsum);
}

void QuantizeQueryRef(const float* q, int64_t dim, int64_t group, int8_t* q8, float* qscale,
                      int32_t* qsum) {
  for (int64_t g = 0; g < dim / group; ++g) {
    const float* qg = q + g * group;
    float absmax = 0.0f;
    for (int64_t i = 0; i < group; ++i) absmax = std::fmax(absmax, std::fabs(qg[i]));
    const float qs = absmax / static_cast<float>(kQueryMax);
    const float inv = qs != 0.0f ? 1.0f / qs : 0.0f;
    int32_t sum = 0;
    for (int64_t i = 0; i < group; ++i) {
      // Clamping first keeps NaN (-> -127) away from the conversion.
      const float t = std::fmin(std::fmax(qg[i] * inv, static_cast<float>(-kQueryMax)),
                                static_cast<float>(kQueryMax));
      q8[g * group + i] = static_cast<int8_t>(std::nearbyint(t));
      sum += q8[g * group + i];
    }
    qscale[g] = qs;
    qsum[g] = sum;
  }
}

int32_t IntGroupDotRef(const IntFormat& f, const uint8_t* row, const int8_t* q8, int64_t g) {
  int32_t dot = 0;
  for (int64_t i = g * f.group; i < (g + 1) * f.group; ++i) dot += q8[i] * IntUnpackRef(f, i, row);
  return dot;
}

void IntScoresRef(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n, const float* q,
                  int64_t heads, float scale, float* scores, int64_t stride) {
  const int64_t groups = f.Groups(dim);
  const size_t code_bytes = f.CodeBytes(dim);
  std::vector<int8_t> q8(static_cast<size_t>(dim));        // [dim]
  std::vector<float> qscale(static_cast<size_t>(groups));  // [groups]
  std::vector<int32_t> qsum(static_cast<size_t>(groups));  // [groups]
  for (int64_t h = 0; h < heads; ++h) {
    QuantizeQueryRef(q + h * dim, dim, f.group, q8.data(), qscale.data(), qsum.data());
    for (int64_t t = 0; t < n; ++t) {
      const uint8_t* row = rows + t * static_cast<int64_t>(f.RowBytes(dim));
      double score = 0.0;
      for (int64_t g = 0; g < groups; ++g) {
        uint16_t scale_bits, min_bits = 0;
        std::memcpy(&scale_bits, row + code_bytes + 2 * g, 2);
        if (!f.symmetric) std::memcpy(&min_bits, row + code_bytes + 2 * (groups + g), 2);
        const double s = F16ToF32(scale_bits), qs = qscale[static_cast<size_t>(g)];
        const int64_t dot = IntGroupDotRef(f, row, q8.data(), g);
        const int64_t q_sum = qsum[static_cast<size_t>(g)];
        if (f.symmetric) {
          score += qs * s * static_cast<double>(dot - f.Levels() / 2 * q_sum);
        } else {
          score += qs * (s * static_cast<double>(dot) +
                         static_cast<double>(F16ToF32(min_bits)) * static_cast<double>(q_sum));
        }
      }
      scores[h * stride + t] = static_cast<float>(scale * score);
    }
  }
}

namespace {

class IntCodec final : public KvCodec {
 public:
  IntCodec(const IntFormat& format, int64_t head_dim, CodecPath path)
      : KvCodec(head_dim), format_(format), path_(path) {}

  std::string FormatName() const override { return format_.Name(); }
  size_t RowBytes() const override { return format_.RowBytes(head_dim_); }

  void Encode(const float* x, int64_t n, uint8_t* rows) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(IntEncodeImpl)(format_, head_dim_, x, n, rows);
    }
    const size_t code_bytes = format_.CodeBytes(head_dim_);
    const int64_t groups = format_.Groups(head_dim_);
    for (int64_t t = 0; t < n; ++t) {
      const float* xr = x + t * head_dim_;
      uint8_t* row = rows + t * RowBytes();
      std::memset(row, 0, code_bytes);
      for (int64_t g = 0; g < groups; ++g) {
        const float* xg = xr + g * format_.group;
        float min = xg[0], max = xg[0];
        for (int64_t i = 1; i < format_.group; ++i) {
          min = std::fmin(min, xg[i]);
          max = std::fmax(max, xg[i]);
        }
        const GroupParams p = IntGroupParams(format_, min, max);
        std::memcpy(row + code_bytes + 2 * g, &p.scale_bits, 2);
        if (!format_.symmetric) std::memcpy(row + code_bytes + 2 * (groups + g), &p.min_bits, 2);
        for (int64_t i = 0; i < format_.group; ++i) {
          IntPackRef(format_, g * format_.group + i, IntQuantizeRef(format_, p, xg[i]), row);
        }
      }
    }
  }

  void Decode(const uint8_t* rows, int64_t n, float* x) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(IntDecodeImpl)(format_, head_dim_, rows, n, x);
    }
    const size_t code_bytes = format_.CodeBytes(head_dim_);
    const int64_t groups = format_.Groups(head_dim_);
    for (int64_t t = 0; t < n; ++t) {
      const uint8_t* row = rows + t * RowBytes();
      for (int64_t g = 0; g < groups; ++g) {
        uint16_t scale_bits, min_bits = 0;
        std::memcpy(&scale_bits, row + code_bytes + 2 * g, 2);
        if (!format_.symmetric) std::memcpy(&min_bits, row + code_bytes + 2 * (groups + g), 2);
        const float scale = F16ToF32(scale_bits);
        const float offset = format_.symmetric ? -static_cast<float>(format_.Levels() / 2) * scale
                                               : F16ToF32(min_bits);
        for (int64_t i = g * format_.group; i < (g + 1) * format_.group; ++i) {
          x[t * head_dim_ + i] = static_cast<float>(IntUnpackRef(format_, i, row)) * scale + offset;
        }
      }
    }
  }

  void Scores(const uint8_t* rows, int64_t n, const float* q, int64_t group, float scale,
              float* scores, int64_t stride) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(IntScoresImpl)(format_, head_dim_, rows, n, q, group, scale,
                                                 scores, stride);
    }
    IntScoresRef(format_, head_dim_, rows, n, q, group, scale, scores, stride);
  }

  // The SIMD path's layout is the target's (the pair path also stores
  // words), so the size comes from the same dispatch as the kernels.
  size_t PreparedQueryBytes(int64_t group) const override {
    if (path_ != CodecPath::kSimd) return 0;
    return HWY_DYNAMIC_DISPATCH(IntPreparedBytesImpl)(format_, head_dim_, group);
  }
  void PrepareQuery(const float* q, int64_t group, uint8_t* prepared) const override {
    if (path_ != CodecPath::kSimd) return;
    HWY_DYNAMIC_DISPATCH(IntPrepareQueryImpl)(format_, head_dim_, q, group, prepared);
  }
  void ScoresPrepared(const uint8_t* rows, int64_t n, const float* q, const uint8_t* prepared,
                      int64_t group, float scale, float* scores, int64_t stride) const override {
    if (path_ != CodecPath::kSimd) return Scores(rows, n, q, group, scale, scores, stride);
    HWY_DYNAMIC_DISPATCH(IntScoresPreparedImpl)
    (format_, head_dim_, rows, n, prepared, group, scale, scores, stride);
  }

  void AccumulateV(const uint8_t* rows, int64_t n, const float* p, int64_t group, int64_t stride,
                   float* acc) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(IntAccumulateImpl)(format_, head_dim_, rows, n, p, group, stride,
                                                     acc);
    }
    AccumulateVByDecoding(*this, rows, n, p, group, stride, acc);
  }

 private:
  IntFormat format_;
  CodecPath path_;
};

}  // namespace

Status IntKernelStatus(const IntFormat& format) {
  if (!HWY_DYNAMIC_DISPATCH(IntKernelExistsImpl)(format)) {
    return Status::Error("KV cache type '" + format.Name() + "': no " +
                         std::to_string(format.bits) + "-bit " +
                         (format.symmetric ? "symmetric" : "asymmetric") +
                         " integer kernel in this build (int8, int4, int2)");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<KvCodec>> MakeIntCodec(const IntFormat& format, int64_t head_dim,
                                                CodecPath path) {
  KVQ_RETURN_IF_ERROR(IntKernelStatus(format));
  return std::unique_ptr<KvCodec>(std::make_unique<IntCodec>(format, head_dim, path));
}

}  // namespace kvq::codec
#endif  // HWY_ONCE
