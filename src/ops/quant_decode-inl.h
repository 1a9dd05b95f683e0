// Per-SIMD-target decoders for the block-quantized weight types other than
// Q8_0 (ops/weights.h), shared by matvec.cc and matmul_packed.cc inside their
// foreach_target loops (Highway's -inl.h toggle pattern).
//
// Every decoder works on one group of 32 consecutive values of a row (a
// whole block for Q4_0 ... IQ4_NL, one of the kGroups = 8 groups of a
// K-quant super-block):
//   p = Dec::Prepare(row, block): the block's scales, unpacked to f32;
//   Dec::Group(df, row, block, s, p, sink) calls sink(j, v) for j = 0, N,
//   2N ... 31 (N = lanes, any order), v = values [32 s + j, 32 s + j + N)
//   of the block as f32.
// The values are bit-identical to DequantizeRowRef: each is a * q + b with
// a * q exact in f32, computed as one FMA (a single rounding, the same one
// ggml's separate multiply and add makes), or Q6_K's (d * sc) * q with
// d * sc formed in scalar f32 first, as ggml does. Scales are unpacked once
// per block and row (Prepare); a sink that multiplies straight into
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
#include <utility>

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

// Blocks of 32 values: one group per block, parameters d (and m).
struct SmallParams {
  float d, m;
};

struct DecQ4_0 {
  static constexpr int kGroups = 1;
  using Params = SmallParams;
  static HWY_INLINE Params Prepare(const uint8_t* row, int64_t blk) {
    return {Half(BlockAt<BlockQ4_0>(row, blk).d), 0.0f};
  }
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t blk, int /*s*/, const Params& p,
                               Sink&& sink) {
    const BlockQ4_0& b = BlockAt<BlockQ4_0>(row, blk);
    // (q - 8) * d, as the reference: exact, and -0 where q = 8 and d < 0
    // (q * d - 8 d would give +0 there).
    const VF d = hn::Set(df, p.d), eight = hn::Set(df, 8.0f);
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t j = 0; j < 16; j += n) {
      const VU q = Bytes(b.qs + j);
      sink(j, hn::Mul(hn::Sub(ToF(Low4(q)), eight), d));
      sink(j + 16, hn::Mul(hn::Sub(ToF(High4(q)), eight), d));
    }
  }
};

struct DecQ4_1 {
  static constexpr int kGroups = 1;
  using Params = SmallParams;
  static HWY_INLINE Params Prepare(const uint8_t* row, int64_t blk) {
    const BlockQ4_1& b = BlockAt<BlockQ4_1>(row, blk);
    return {Half(b.d), Half(b.m)};
  }
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t blk, int /*s*/, const Params& p,
                               Sink&& sink) {
    const BlockQ4_1& b = BlockAt<BlockQ4_1>(row, blk);
    const VF d = hn::Set(df, p.d), m = hn::Set(df, p.m);
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t j = 0; j < 16; j += n) {
      const VU q = Bytes(b.qs + j);
      sink(j, hn::MulAdd(ToF(Low4(q)), d, m));
      sink(j + 16, hn::MulAdd(ToF(High4(q)), d, m));
    }
  }
};

// 5-bit values j ... j + N and j + 16 ... of a Q5 block, as u32 lanes. The
// fifth bits come as a lane mask straight from qh (a mask register load on
// AVX-512) and set bit 4 where present.
template <class Block>
HWY_INLINE void Q5Pair(const Block& b, int64_t j, VU* lo, VU* hi) {
  const DU du;
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  const uint64_t bits_lo = qh >> j, bits_hi = qh >> (j + 16);  // bit i = lane i
  const auto m_lo = hn::LoadMaskBits(du, reinterpret_cast<const uint8_t*>(&bits_lo));
  const auto m_hi = hn::LoadMaskBits(du, reinterpret_cast<const uint8_t*>(&bits_hi));
  const VU sixteen = hn::Set(du, 16);
  const VU q = Bytes(b.qs + j);
  const VU q_lo = Low4(q), q_hi = High4(q);
  *lo = hn::IfThenElse(m_lo, hn::Or(q_lo, sixteen), q_lo);
  *hi = hn::IfThenElse(m_hi, hn::Or(q_hi, sixteen), q_hi);
}

struct DecQ5_0 {
  static constexpr int kGroups = 1;
  using Params = SmallParams;
  static HWY_INLINE Params Prepare(const uint8_t* row, int64_t blk) {
    return {Half(BlockAt<BlockQ5_0>(row, blk).d), 0.0f};
  }
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t blk, int /*s*/, const Params& p,
                               Sink&& sink) {
    const BlockQ5_0& b = BlockAt<BlockQ5_0>(row, blk);
    const VF d = hn::Set(df, p.d), sixteen = hn::Set(df, 16.0f);  // as Q4_0
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
  static constexpr int kGroups = 1;
  using Params = SmallParams;
  static HWY_INLINE Params Prepare(const uint8_t* row, int64_t blk) {
    const BlockQ5_1& b = BlockAt<BlockQ5_1>(row, blk);
    return {Half(b.d), Half(b.m)};
  }
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t blk, int /*s*/, const Params& p,
                               Sink&& sink) {
    const BlockQ5_1& b = BlockAt<BlockQ5_1>(row, blk);
    const VF d = hn::Set(df, p.d), m = hn::Set(df, p.m);
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
  static constexpr int kGroups = 1;
  using Params = SmallParams;
  static HWY_INLINE Params Prepare(const uint8_t* row, int64_t blk) {
    return {Half(BlockAt<BlockIQ4_NL>(row, blk).d), 0.0f};
  }
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t blk, int /*s*/, const Params& p,
                               Sink&& sink) {
    static constexpr float kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};
    const BlockIQ4_NL& b = BlockAt<BlockIQ4_NL>(row, blk);
    const VF d = hn::Set(df, p.d);
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

// K-quant super-blocks: 8 groups of 32; the parameters are the f32
// multiplier and subtrahend of each 16 values (i = value / 16), unpacked
// once per super-block and row.
struct KParams {
  float mul[16], sub[16];
};

struct DecQ2_K {
  static constexpr int kGroups = 8;
  using Params = KParams;
  static HWY_INLINE Params Prepare(const uint8_t* row, int64_t blk) {
    const BlockQ2_K& b = BlockAt<BlockQ2_K>(row, blk);
    const float d = Half(b.d), dmin = Half(b.dmin);
    Params p;
    for (int i = 0; i < 16; ++i) {
      p.mul[i] = d * static_cast<float>(b.scales[i] & 0xF);
      p.sub[i] = dmin * static_cast<float>(b.scales[i] >> 4);
    }
    return p;
  }
  // Group s: 2-bit plane s % 4 of the 32 bytes of half s / 4.
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t blk, int s, const Params& p,
                               Sink&& sink) {
    const BlockQ2_K& b = BlockAt<BlockQ2_K>(row, blk);
    const int h = s / 4, shift = 2 * (s % 4);
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t l = 0; l < 32; l += n) {
      const int i = 2 * s + static_cast<int>(l / 16);
      const VU q = hn::And(hn::ShiftRightSame(Bytes(b.qs + h * 32 + l), shift), hn::Set(DU(), 3));
      sink(l, hn::MulSub(ToF(q), hn::Set(df, p.mul[i]), hn::Set(df, p.sub[i])));
    }
  }
};

struct DecQ3_K {
  static constexpr int kGroups = 8;
  using Params = KParams;
  static HWY_INLINE Params Prepare(const uint8_t* row, int64_t blk) {
    const BlockQ3_K& b = BlockAt<BlockQ3_K>(row, blk);
    const float d = Half(b.d);
    Params p;
    for (int i = 0; i < 16; ++i) {
      p.mul[i] = d * static_cast<float>(Q3KScale(b.scales, i));
      p.sub[i] = 0.0f;
    }
    return p;
  }
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t blk, int s, const Params& p,
                               Sink&& sink) {
    const BlockQ3_K& b = BlockAt<BlockQ3_K>(row, blk);
    const int h = s / 4, pl = s % 4;
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t l = 0; l < 32; l += n) {
      const int i = 2 * s + static_cast<int>(l / 16);
      const VU low =
          hn::And(hn::ShiftRightSame(Bytes(b.qs + h * 32 + l), 2 * pl), hn::Set(DU(), 3));
      const VU high = hn::And(hn::ShiftRightSame(Bytes(b.hmask + l), h * 4 + pl), hn::Set(DU(), 1));
      // low + 4 high - 4: the 3-bit value minus 4, exact in f32; then times
      // dl, as the reference (keeps its -0 for a zero value and dl < 0).
      const VF q = hn::Sub(ToF(hn::Or(low, hn::ShiftLeft<2>(high))), hn::Set(df, 4.0f));
      sink(l, hn::Mul(hn::Set(df, p.mul[i]), q));
    }
  }
};

// Q4_K (kFifth = false) and Q5_K: group s is sub-block s.
template <bool kFifth, class Block>
struct DecQ45_K {
  static constexpr int kGroups = 8;
  using Params = KParams;
  static HWY_INLINE Params Prepare(const uint8_t* row, int64_t blk) {
    const Block& b = BlockAt<Block>(row, blk);
    const float d = Half(b.d), dmin = Half(b.dmin);
    Params p;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      KScaleMin(b.scales, j, &sc, &mn);
      p.mul[2 * j] = p.mul[2 * j + 1] = d * static_cast<float>(sc);
      p.sub[2 * j] = p.sub[2 * j + 1] = dmin * static_cast<float>(mn);
    }
    return p;
  }
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t blk, int s, const Params& p,
                               Sink&& sink) {
    const Block& b = BlockAt<Block>(row, blk);
    const VF d1 = hn::Set(df, p.mul[2 * s]), m1 = hn::Set(df, p.sub[2 * s]);
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
  static constexpr int kGroups = 8;
  using Params = KParams;
  static HWY_INLINE Params Prepare(const uint8_t* row, int64_t blk) {
    const BlockQ6_K& b = BlockAt<BlockQ6_K>(row, blk);
    const float d = Half(b.d);
    Params p;
    for (int i = 0; i < 16; ++i) {
      p.mul[i] = d * static_cast<float>(b.scales[i]);
      p.sub[i] = 0.0f;
    }
    return p;
  }
  // Group s: plane s % 4 of half s / 4.
  template <class Sink>
  static HWY_INLINE void Group(DF df, const uint8_t* row, int64_t blk, int s, const Params& p,
                               Sink&& sink) {
    const BlockQ6_K& b = BlockAt<BlockQ6_K>(row, blk);
    const int h = s / 4, pl = s % 4;
    const uint8_t* ql = b.ql + h * 64 + (pl & 1) * 32;
    const uint8_t* qh = b.qh + h * 32;
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t l = 0; l < 32; l += n) {
      const int i = 2 * s + static_cast<int>(l / 16);
      const VU raw = Bytes(ql + l);
      const VU lo = pl < 2 ? Low4(raw) : High4(raw);
      // Bits 2pl, 2pl + 1 of qh moved straight to bits 4, 5.
      const VU h = Bytes(qh + l);
      const VU hi = hn::And(pl < 3 ? hn::ShiftLeftSame(h, 4 - 2 * pl) : hn::ShiftRight<2>(h),
                            hn::Set(DU(), 0x30));
      // ds * (q - 32), the reference's one rounding of (d * sc) * (q - 32)
      // (an FMA q * ds - 32 ds would round the same but give +0 for -0).
      const VF q = hn::Sub(ToF(hn::Or(lo, hi)), hn::Set(df, 32.0f));
      sink(l, hn::Mul(hn::Set(df, p.mul[i]), q));
    }
  }
};

// f(0), f(1) ... f(kCount - 1) as straight-line code, so a decoder inlined
// into f sees its group index as a constant.
template <int kCount, class F, int... kS>
HWY_INLINE void ForEachGroupImpl(F&& f, std::integer_sequence<int, kS...>) {
  (f(kS), ...);
}
template <int kCount, class F>
HWY_INLINE void ForEachGroup(F&& f) {
  ForEachGroupImpl<kCount>(f, std::make_integer_sequence<int, kCount>());
}

// Groups [g0, g0 + count) of one row (any start, K-quant super-blocks
// entered in the middle included), parameters prepared once per block.
template <class Dec, class Sink>
HWY_INLINE void DecodeGroups(DF df, const uint8_t* row, int64_t g0, int64_t count, Sink&& sink) {
  for (int64_t g = g0; g < g0 + count;) {
    const int64_t blk = g / Dec::kGroups;
    const typename Dec::Params p = Dec::Prepare(row, blk);
    for (; g < g0 + count && g / Dec::kGroups == blk; ++g) {
      const int64_t base = (g - g0) * kQBlock;
      Dec::Group(df, row, blk, static_cast<int>(g % Dec::kGroups), p,
                 [&](int64_t j, VF v) HWY_ATTR { sink(base + j, v); });
    }
  }
}

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
