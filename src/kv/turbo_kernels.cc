// SIMD fused kernels of the TurboQuant / QJL codecs (kv/turbo_quant.cc has
// the formats and the scalar reference twin). A row is read straight from
// its codes: the shared kernels of codec_kernels-inl.h see it as a row of
// `expanded` f32 values [y | f s] (kv/turbo_quant.cc), decoded a vector at a
// time with a register table lookup of the Lloyd-Max levels (or the sign
// bits of the sketch), so no f32 copy of the row is ever stored.
//
// Each vector decodes to the same f32 values the scalar expansion gives
// (norm * level, +-factor, and u * scale + min fused), and the dots
// accumulate them in the f32 kernels' order.
#include <cmath>
#include <cstring>

#include "base/fp16.h"
#include "kv/turbo_quant.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/turbo_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h (per-target code).
#include "kv/codec_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq::codec {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

HWY_INLINE float TurboHalf(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return F16ToF32(bits);
}

// The first `width` (1..4) bytes at p, little-endian; never reads beyond them.
HWY_INLINE uint32_t LoadBytes(const uint8_t* p, int width) {
  uint32_t v = p[0];
  if (width > 1) v |= static_cast<uint32_t>(p[1]) << 8;
  if (width > 2) v |= static_cast<uint32_t>(p[2]) << 16;
  if (width > 3) v |= static_cast<uint32_t>(p[3]) << 24;
  return v;
}

// kCap lanes at most: 16, or 8 when a run of one code width is only 8 long
// (head_dim 16 with 2.5/3.5 bits), so no vector straddles two widths.
template <size_t kCap>
struct TurboFmt {
  using D = hn::CappedTag<float, kCap>;
  static constexpr bool kHasParams = true;
  int64_t head_dim;  // the expanded row length (what the shared kernels iterate)
  size_t row_bytes;
  const TurboKernelLayout* L;

  int64_t ParamGroup() const { return L->head_dim; }
  // Group 0 of a rotated row: the f16 norm; sketch groups: the factor
  // f = norm * gamma * sqrt(pi/2) / m (in double, as the reference);
  // uniform rows: (scale, min).
  HWY_INLINE ScaleOffset Params(const uint8_t* row, int64_t g) const {
    const float norm = TurboHalf(row + L->norm_offset);
    if (L->uniform) return {norm, TurboHalf(row + L->norm_offset + 2)};
    if (g * L->head_dim < L->y_dim) return {norm, 0.0f};
    const double gamma = L->has_gamma ? TurboHalf(row + L->norm_offset + 2) : 1.0;
    constexpr double kSqrtHalfPi = 1.2533141373155003;  // as turbo_quant.cc
    return {static_cast<float>(static_cast<double>(norm) * gamma * kSqrtHalfPi /
                               static_cast<double>(L->sketch_rows)),
            0.0f};
  }

  // Codes k .. k + Lanes of width w packed from `base` as a little-endian
  // bit stream (k a multiple of Lanes).
  HWY_INLINE hn::Vec<hn::RebindToSigned<D>> Codes(const uint8_t* base, int64_t k, int w) const {
    const hn::RebindToSigned<D> di;
    constexpr size_t kLanes = hn::MaxLanes(D());
    if constexpr (kLanes >= 8) {
      // Eight codes fill w whole bytes: lanes 0-7 shift one 32-bit word,
      // lanes 8-15 the next w bytes. kShift[w]: lane l's shift w * (l % 8).
      alignas(64) static constexpr int32_t kShift[5][16] = {
          {},
          {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7},
          {0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14},
          {0, 3, 6, 9, 12, 15, 18, 21, 0, 3, 6, 9, 12, 15, 18, 21},
          {0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28}};
      const hn::RebindToUnsigned<D> du;
      const uint8_t* p = base + (k >> 3) * w;
      auto word = hn::Set(du, LoadBytes(p, w));
      if (hn::Lanes(du) > 8) {
        word = hn::IfThenElse(hn::FirstN(du, 8), word, hn::Set(du, LoadBytes(p + w, w)));
      }
      // Logical shift: the word's top bit may be set.
      const auto u = hn::Shr(word, hn::BitCast(du, hn::Load(di, kShift[w])));
      return hn::And(hn::BitCast(di, u), hn::Set(di, (1 << w) - 1));
    } else {
      alignas(64) int32_t lane[kLanes > 0 ? kLanes : 1];
      for (size_t l = 0; l < hn::Lanes(di); ++l) {
        const int64_t pos = (k + static_cast<int64_t>(l)) * w;
        // A code spans at most two bytes; read the second only when it does.
        uint32_t two = base[pos >> 3];
        if ((pos & 7) + w > 8) two |= static_cast<uint32_t>(base[(pos >> 3) + 1]) << 8;
        lane[l] = static_cast<int32_t>((two >> (pos & 7)) & ((1u << w) - 1));
      }
      return hn::Load(di, lane);
    }
  }

  HWY_INLINE hn::Vec<D> Level(D d, const float* levels, hn::Vec<hn::RebindToSigned<D>> u,
                              int w) const {
    const hn::RebindToSigned<D> di;
    constexpr size_t kLanes = hn::MaxLanes(D());
    if constexpr (!HWY_HAVE_SCALABLE && kLanes >= 16) {
      return hn::TableLookupLanes(hn::LoadU(d, levels), hn::IndicesFromVec(d, u));
    } else if constexpr (!HWY_HAVE_SCALABLE && kLanes == 8) {
      const auto low = hn::TableLookupLanes(hn::LoadU(d, levels),
                                            hn::IndicesFromVec(d, hn::And(u, hn::Set(di, 7))));
      if (w < 4) return low;
      const auto high = hn::TableLookupLanes(hn::LoadU(d, levels + 8),
                                             hn::IndicesFromVec(d, hn::And(u, hn::Set(di, 7))));
      return hn::IfThenElse(hn::RebindMask(d, hn::Gt(u, hn::Set(di, 7))), high, low);
    } else {
      return hn::GatherIndex(d, levels, u);
    }
  }

  HWY_INLINE hn::Vec<D> Load(D d, const uint8_t* row, int64_t i, hn::Vec<D> scale,
                             hn::Vec<D> offset) const {
    if (i >= L->y_dim) {  // sketch signs: bit set -> -f
      const auto bit = Codes(row + L->sketch_offset, i - L->y_dim, 1);
      return hn::Xor(scale, hn::BitCast(d, hn::ShiftLeft<31>(bit)));
    }
    const int s = L->num_segments > 1 && i >= L->seg_first[1] ? 1 : 0;
    const int w = L->seg_width[s];
    const auto u = Codes(row + L->seg_byte[s], i - L->seg_first[s], w);
    if (L->uniform) return hn::MulAdd(hn::ConvertTo(d, u), scale, offset);
    return hn::Mul(Level(d, L->levels[w], u, w), scale);
  }
};

template <class F>
HWY_INLINE void WithTurboFmt(const TurboKernelLayout& L, const F& fn) {
  if (L.min_segment >= 16) {
    fn(TurboFmt<16>{L.expanded, L.row_bytes, &L});
  } else {
    fn(TurboFmt<8>{L.expanded, L.row_bytes, &L});
  }
}

void TurboDecodeExpandedImpl(const TurboKernelLayout& L, const uint8_t* rows, int64_t n, float* x) {
  WithTurboFmt(L, [&](const auto& fmt) { DecodeRows(fmt, rows, n, x); });
}

void TurboScoresImpl(const TurboKernelLayout& L, const uint8_t* rows, int64_t n, const float* q,
                     int64_t group, float scale, float* scores, int64_t stride) {
  WithTurboFmt(L, [&](const auto& fmt) { Scores(fmt, rows, n, q, group, scale, scores, stride); });
}

void TurboAccumulateImpl(const TurboKernelLayout& L, const uint8_t* rows, int64_t n, const float* p,
                         int64_t group, int64_t stride, float* acc) {
  WithTurboFmt(L, [&](const auto& fmt) { AccumulateV(fmt, rows, n, p, group, stride, acc); });
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::codec
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::codec {

HWY_EXPORT(TurboDecodeExpandedImpl);
HWY_EXPORT(TurboScoresImpl);
HWY_EXPORT(TurboAccumulateImpl);

void TurboDecodeExpanded(const TurboKernelLayout& layout, const uint8_t* rows, int64_t n,
                         float* x) {
  HWY_DYNAMIC_DISPATCH(TurboDecodeExpandedImpl)(layout, rows, n, x);
}

void TurboScores(const TurboKernelLayout& layout, const uint8_t* rows, int64_t n, const float* q,
                 int64_t group, float scale, float* scores, int64_t stride) {
  HWY_DYNAMIC_DISPATCH(TurboScoresImpl)(layout, rows, n, q, group, scale, scores, stride);
}

void TurboAccumulate(const TurboKernelLayout& layout, const uint8_t* rows, int64_t n,
                     const float* p, int64_t group, int64_t stride, float* acc) {
  HWY_DYNAMIC_DISPATCH(TurboAccumulateImpl)(layout, rows, n, p, group, stride, acc);
}

}  // namespace kvq::codec
#endif  // HWY_ONCE
