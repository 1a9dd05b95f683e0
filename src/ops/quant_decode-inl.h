// Per-SIMD-target decoders for the block-quantized weight types other than
// Q8_0 (ops/weights.h), shared by matvec.cc and matmul_packed.cc inside their
// foreach_target loops (Highway's -inl.h toggle pattern).
//
// Every decoder works on one group of 32 consecutive values of a row (a
// whole block for Q4_0 ... IQ4_NL, one eighth of a K-quant super-block):
//   Dec::Group(df, row, g, sink) calls sink(j, v) for j = 0, N, 2N ... 31
//   (N = lanes, any order), v = values [32 g + j, 32 g + j + N) as f32.
// The values are bit-identical to DequantizeRowRef: each is a * q + b with
// a * q exact in f32, computed as one FMA (a single rounding, the same one
// ggml's separate multiply and add makes), or Q6_K's (d * sc) * q with
// d * sc formed in scalar f32 first, as ggml does. A group's scales are
// unpacked once per group and row; a sink that multiplies straight into
// accumulators keeps the decoded values in registers.
//
// Lane counts (1 ... 16 on x86) divide 16, so a vector never straddles a
// 16-value scale of the K-quants.

#if defined(KVQ_OPS_QUANT_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_OPS_QUANT_DECODE_INL_H_
#undef KVQ_OPS_QUANT_DECODE_INL_H_
#else
#define KVQ_OPS_QUANT_DECODE_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include "base/fp16.h"
#include "hwy/highway.h"
#include "ops/weights.h"

HWY_BEFORE_NAMESPACE();
namespace kvq::ops {
namespace HWY_NAMESPACE {
namespace qd {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using VU = hn::Vec<DU>;
static_assert(hn::MaxLanes(DF()) <= 16, "a vector must not straddle a 16-value scale");

// An f16 block scale. F16C (every AVX2+ target) converts in one
// instruction; the portable path branches on the exponent.
HWY_INLINE float Half(uint16_t bits) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(bits);
#else
  return F16ToF32(bits);
#endif
}

HWY_INLINE uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// N bytes at p, zero-extended to u32 lanes.
HWY_INLINE VU Bytes(const uint8_t* HWY_RESTRICT p) {
  const DU du;
  const hn::Rebind<uint8_t, DU> d8;
  return hn::PromoteTo(du, hn::LoadU(d8, p));
}

HWY_INLINE VF ToF(VU v) { return hn::ConvertTo(DF(), hn::BitCast(DI(), v)); }
HWY_INLINE VU Low4(VU v) { return hn::And(v, hn::Set(DU(), 0xF)); }
HWY_INLINE VU High4(VU v) { return hn::ShiftRight<4>(v); }

template <class Block>
HWY_INLINE const Block& BlockAt(const uint8_t* row, int64_t b) {
  return reinterpret_cast<const Block*>(row)[b];
}

struct DecQ4_0 {
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t g, Sink&& sink) {
    const BlockQ4_0& b = BlockAt<BlockQ4_0>(row, g);
    const VF d = hn::Set(df, Half(b.d));
    const VF eight = hn::Set(df, 8.0f);
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t j = 0; j < 16; j += n) {
      const VU q = Bytes(b.qs + j);
      // q - 8 is exact in f32, as is its product with d.
      sink(j, hn::Mul(hn::Sub(ToF(Low4(q)), eight), d));
      sink(j + 16, hn::Mul(hn::Sub(ToF(High4(q)), eight), d));
    }
  }
};

struct DecQ4_1 {
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t g, Sink&& sink) {
    const BlockQ4_1& b = BlockAt<BlockQ4_1>(row, g);
    const VF d = hn::Set(df, Half(b.d)), m = hn::Set(df, Half(b.m));
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t j = 0; j < 16; j += n) {
      const VU q = Bytes(b.qs + j);
      sink(j, hn::MulAdd(ToF(Low4(q)), d, m));
      sink(j + 16, hn::MulAdd(ToF(High4(q)), d, m));
    }
  }
};

// 5-bit values j ... j + N and j + 16 ... of a Q5 block, as u32 lanes.
template <class Block>
HWY_INLINE void Q5Pair(const Block& b, int64_t j, VU* lo, VU* hi) {
  const DU du;
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  const VU lane = hn::Iota(du, 0);
  const VU one = hn::Set(du, 1);
  const VU q = Bytes(b.qs + j);
  const VU h0 = hn::And(hn::Set(du, qh >> j) >> lane, one);
  const VU h1 = hn::And(hn::Set(du, qh >> (j + 16)) >> lane, one);
  *lo = hn::Or(Low4(q), hn::ShiftLeft<4>(h0));
  *hi = hn::Or(High4(q), hn::ShiftLeft<4>(h1));
}

struct DecQ5_0 {
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t g, Sink&& sink) {
    const BlockQ5_0& b = BlockAt<BlockQ5_0>(row, g);
    const VF d = hn::Set(df, Half(b.d));
    const VF sixteen = hn::Set(df, 16.0f);
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t j = 0; j < 16; j += n) {
      VU lo, hi;
      Q5Pair(b, j, &lo, &hi);
      sink(j, hn::Mul(hn::Sub(ToF(lo), sixteen), d));
      sink(j + 16, hn::Mul(hn::Sub(ToF(hi), sixteen), d));
    }
  }
};

struct DecQ5_1 {
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t g, Sink&& sink) {
    const BlockQ5_1& b = BlockAt<BlockQ5_1>(row, g);
    const VF d = hn::Set(df, Half(b.d)), m = hn::Set(df, Half(b.m));
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t j = 0; j < 16; j += n) {
      VU lo, hi;
      Q5Pair(b, j, &lo, &hi);
      sink(j, hn::MulAdd(ToF(lo), d, m));
      sink(j + 16, hn::MulAdd(ToF(hi), d, m));
    }
  }
};

struct DecIQ4_NL {
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t g, Sink&& sink) {
    static constexpr float kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};
    const BlockIQ4_NL& b = BlockAt<BlockIQ4_NL>(row, g);
    const VF d = hn::Set(df, Half(b.d));
    const DI di;
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t j = 0; j < 16; j += n) {
      const VU q = Bytes(b.qs + j);
      const VF lo = hn::GatherIndex(df, kLevels, hn::BitCast(di, Low4(q)));
      const VF hi = hn::GatherIndex(df, kLevels, hn::BitCast(di, High4(q)));
      sink(j, hn::Mul(d, lo));
      sink(j + 16, hn::Mul(d, hi));
    }
  }
};

// Q2_K group g: 2-bit plane p of the 32 bytes of half h.
struct DecQ2_K {
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t g, Sink&& sink) {
    const BlockQ2_K& b = BlockAt<BlockQ2_K>(row, g / 8);
    const int s = static_cast<int>(g % 8), h = s / 4, p = s % 4;
    const float d = Half(b.d), dmin = Half(b.dmin);
    const DU du;
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t l = 0; l < 32; l += n) {
      const uint8_t sc = b.scales[(s * 32 + l) / 16];
      const VF dl = hn::Set(df, d * static_cast<float>(sc & 0xF));
      const VF ml = hn::Set(df, dmin * static_cast<float>(sc >> 4));
      const VU q = hn::And(hn::ShiftRightSame(Bytes(b.qs + h * 32 + l), 2 * p), hn::Set(du, 3));
      sink(l, hn::MulSub(ToF(q), dl, ml));
    }
  }
};

struct DecQ3_K {
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t g, Sink&& sink) {
    const BlockQ3_K& b = BlockAt<BlockQ3_K>(row, g / 8);
    const int s = static_cast<int>(g % 8), h = s / 4, p = s % 4;
    const float d = Half(b.d);
    const DU du;
    const VF four = hn::Set(df, 4.0f);
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t l = 0; l < 32; l += n) {
      const VF dl = hn::Set(
          df, d * static_cast<float>(Q3KScale(b.scales, static_cast<int>(s * 32 + l) / 16)));
      const VU low = hn::And(hn::ShiftRightSame(Bytes(b.qs + h * 32 + l), 2 * p), hn::Set(du, 3));
      const VU high = hn::And(hn::ShiftRightSame(Bytes(b.hmask + l), h * 4 + p), hn::Set(du, 1));
      // low + 4 * high - 4: the 3-bit value minus 4, exact in f32.
      const VF q = hn::Sub(ToF(hn::Or(low, hn::ShiftLeft<2>(high))), four);
      sink(l, hn::Mul(dl, q));
    }
  }
};

// Q4_K (kFifth = false) and Q5_K: sub-block s of the super-block.
template <bool kFifth, class Block>
struct DecQ45_K {
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t g, Sink&& sink) {
    const Block& b = BlockAt<Block>(row, g / 8);
    const int s = static_cast<int>(g % 8);
    uint8_t sc, mn;
    KScaleMin(b.scales, s, &sc, &mn);
    const VF d1 = hn::Set(df, Half(b.d) * static_cast<float>(sc));
    const VF m1 = hn::Set(df, Half(b.dmin) * static_cast<float>(mn));
    const uint8_t* qs = b.qs + s / 2 * 32;
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t l = 0; l < 32; l += n) {
      const VU raw = Bytes(qs + l);
      VU q = s % 2 == 0 ? Low4(raw) : High4(raw);
      if constexpr (kFifth) {
        const VU bit = hn::And(hn::ShiftRightSame(Bytes(b.qh + l), s), hn::Set(DU(), 1));
        q = hn::Or(q, hn::ShiftLeft<4>(bit));
      }
      sink(l, hn::MulSub(ToF(q), d1, m1));
    }
  }
};
using DecQ4_K = DecQ45_K<false, BlockQ4_K>;
using DecQ5_K = DecQ45_K<true, BlockQ5_K>;

struct DecQ6_K {
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t g, Sink&& sink) {
    const BlockQ6_K& b = BlockAt<BlockQ6_K>(row, g / 8);
    const int s = static_cast<int>(g % 8), h = s / 4, p = s % 4;
    const float d = Half(b.d);
    const uint8_t* ql = b.ql + h * 64 + (p & 1) * 32;
    const uint8_t* qh = b.qh + h * 32;
    const VF thirty_two = hn::Set(df, 32.0f);
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t l = 0; l < 32; l += n) {
      const VF ds = hn::Set(df, d * static_cast<float>(b.scales[(s * 32 + l) / 16]));
      const VU raw = Bytes(ql + l);
      const VU lo = p < 2 ? Low4(raw) : High4(raw);
      const VU hi = hn::And(hn::ShiftRightSame(Bytes(qh + l), 2 * p), hn::Set(DU(), 3));
      const VF q = hn::Sub(ToF(hn::Or(lo, hn::ShiftLeft<4>(hi))), thirty_two);
      sink(l, hn::Mul(ds, q));
    }
  }
};

// Calls f(Dec{}) with the decoder of `type`; false (f not called) for the
// types with their own paths (F32, F16, BF16, Q8_0).
template <class F>
HWY_INLINE bool VisitGroupDecoder(WeightType type, F&& f) {
  switch (type) {
    case WeightType::kQ4_0:
      return f(DecQ4_0{}), true;
    case WeightType::kQ4_1:
      return f(DecQ4_1{}), true;
    case WeightType::kQ5_0:
      return f(DecQ5_0{}), true;
    case WeightType::kQ5_1:
      return f(DecQ5_1{}), true;
    case WeightType::kIQ4_NL:
      return f(DecIQ4_NL{}), true;
    case WeightType::kQ2_K:
      return f(DecQ2_K{}), true;
    case WeightType::kQ3_K:
      return f(DecQ3_K{}), true;
    case WeightType::kQ4_K:
      return f(DecQ4_K{}), true;
    case WeightType::kQ5_K:
      return f(DecQ5_K{}), true;
    case WeightType::kQ6_K:
      return f(DecQ6_K{}), true;
    default:
      return false;
  }
}

}  // namespace qd
}  // namespace HWY_NAMESPACE
}  // namespace kvq::ops
HWY_AFTER_NAMESPACE();

#endif  // KVQ_OPS_QUANT_DECODE_INL_H_
