// Per-SIMD-target pieces of the integer-dot matvec (matvec_int8.cc): the
// 8-bit dot product of 32 weights with 32 activations, and each weight
// type's unpacking of one 32-value group to bytes. x86 AVX2 and up only;
// matvec_int8.cc runs the scalar twin on the other targets.
//
// Why raw intrinsics: Debian's Highway 1.0.3 has no u8 x i8 dot product
// (SumOfMulQuadAccumulate came later), and its AVX3_DL target string lacks
// avx512vnni, so the functions that issue vpdpbusd carry that attribute
// themselves (AVX3_DL's runtime check requires AVX512-VNNI). AVX2 and AVX3
// emulate vpdpbusd with vpmaddubsw + vpmaddwd, as ggml does on AVX2; both
// give the same int32 lanes (lane i holds bytes 4i .. 4i + 3), and the
// pair sums of vpmaddubsw cannot saturate here: weights are at most 128
// (|w| of a signed type, or an unsigned type's 63), activations at most
// 127 in magnitude, 2 * 128 * 127 < 32767.
//
// The K-quants take vpmaddubsw's i16 pairs straight to vpmaddwd with their
// per-group scales (vpdpwssd on VNNI), ggml's arithmetic: the scales ride
// in the multiply the dot needs anyway, instead of an i32 multiply after it.
//
// Lanes 0-3 of a group's dot hold values 0-15, lanes 4-7 values 16-31, so
// per-16 scales (Q2_K, Q3_K, Q6_K) multiply lanes, never split one.

#if defined(KVQ_OPS_QUANT_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_OPS_QUANT_DOT_INL_H_
#undef KVQ_OPS_QUANT_DOT_INL_H_
#else
#define KVQ_OPS_QUANT_DOT_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "ops/weights.h"

#undef KVQ_INT8_DOT_SIMD
#undef KVQ_VNNI_ATTR
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define KVQ_INT8_DOT_SIMD 1
#include <immintrin.h>
#if HWY_TARGET == HWY_AVX3_DL
#define KVQ_VNNI_ATTR __attribute__((target("avx512vnni")))
#else
#define KVQ_VNNI_ATTR
#endif
#else
#define KVQ_INT8_DOT_SIMD 0
#define KVQ_VNNI_ATTR
#endif

HWY_BEFORE_NAMESPACE();
namespace kvq::ops {
namespace HWY_NAMESPACE {
namespace qdot {

#if KVQ_INT8_DOT_SIMD

HWY_INLINE __m256i Load32(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
HWY_INLINE __m256i Bytes(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }

#if HWY_TARGET == HWY_AVX3_DL
// AVX512-VNNI's vpdpbusd on ymm lanes, always EVEX-encoded. GCC 12 emits
// _mm256_dpbusd_epi32 as AVX-VNNI's VEX form ("{vex} vpdpbusd") whenever the
// registers allow, even without -mavxvnni; CPUs with AVX512-VNNI but not
// AVX-VNNI (AMD Zen 4) fault on it with SIGILL. The no_avx_vnni test checks
// the binaries for the VEX form.
HWY_INLINE __m256i DpBusdEvex(__m256i acc, __m256i u, __m256i s) {
  asm("%{evex%} vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}
// vpdpwssd likewise (GCC 12 emits "{vex} vpdpwssd" for _mm256_dpwssd_epi32).
HWY_INLINE __m256i DpWssdEvex(__m256i acc, __m256i a, __m256i b) {
  asm("%{evex%} vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}
#endif

// acc + lanes of sum(u[k] * s[k]), u unsigned, s signed bytes.
KVQ_VNNI_ATTR HWY_INLINE __m256i Dot(__m256i acc, __m256i u, __m256i s) {
#if HWY_TARGET == HWY_AVX3_DL
  return DpBusdEvex(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// acc + lanes of sum(words[2i] * scale[2i] + words[2i + 1] * scale[2i + 1])
// (i16 words and scales, i32 lanes): vpmaddwd, fused on VNNI.
KVQ_VNNI_ATTR HWY_INLINE __m256i DotWords(__m256i acc, __m256i words, __m256i scale) {
#if HWY_TARGET == HWY_AVX3_DL
  return DpWssdEvex(acc, words, scale);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(words, scale));
#endif
}

// Signed weights: |w| times x with w's sign (vpsignb zeroes x where w = 0,
// where the product is 0 anyway). |-128| = 128 read as unsigned is exact.
struct Operands {
  __m256i u, s;
};
template <bool kSigned>
HWY_INLINE Operands Prepare(__m256i w, __m256i x) {
  if constexpr (kSigned) return {_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)};
  return {w, x};
}

// 16 bytes of nibbles -> 32 values 0..15 (byte j: value j low, j + 16 high).
HWY_INLINE __m256i Nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0xF);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

// Byte j = 16 where bit j of the little-endian u32 at qh is set, else 0.
HWY_INLINE __m256i FifthBits(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
#if HWY_TARGET <= HWY_AVX3
  return _mm256_maskz_set1_epi8(bits, 16);
#else
  // Byte j takes byte j / 8 of the bits, then tests its bit j % 8.
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                           2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel), Bytes(16));
#endif
}

template <class Block>
HWY_INLINE const Block& BlockAt(const uint8_t* row, int64_t b) {
  return reinterpret_cast<const Block*>(row)[b];
}

// 32-value block types: Weights(row, b) is the block's 32 integers (minus
// the type's offset for the signed ones), D and M (from BlockScales) the
// block's f16 scale and, for the types with one, its f16 min (else 0).
template <class Block, bool kHasMin>
struct BlockScales {
  static constexpr bool kMin = kHasMin;
  static HWY_INLINE uint16_t D(const uint8_t* row, int64_t b) { return BlockAt<Block>(row, b).d; }
  static HWY_INLINE uint16_t M(const uint8_t* row, int64_t b) {
    if constexpr (kHasMin) {
      return BlockAt<Block>(row, b).m;
    } else {
      (void)row, (void)b;
      return 0;
    }
  }
};
struct IntQ8_0 : BlockScales<BlockQ8_0, false> {
  static constexpr bool kSigned = true;
  static HWY_INLINE __m256i Weights(const uint8_t* row, int64_t b) {
    return Load32(BlockAt<BlockQ8_0>(row, b).q);
  }
};
struct IntQ4_0 : BlockScales<BlockQ4_0, false> {
  static constexpr bool kSigned = true;
  static HWY_INLINE __m256i Weights(const uint8_t* row, int64_t b) {
    return _mm256_sub_epi8(Nibbles(BlockAt<BlockQ4_0>(row, b).qs), Bytes(8));
  }
};
struct IntQ4_1 : BlockScales<BlockQ4_1, true> {
  static constexpr bool kSigned = false;
  static HWY_INLINE __m256i Weights(const uint8_t* row, int64_t b) {
    return Nibbles(BlockAt<BlockQ4_1>(row, b).qs);
  }
};
struct IntQ5_0 : BlockScales<BlockQ5_0, false> {
  static constexpr bool kSigned = true;
  static HWY_INLINE __m256i Weights(const uint8_t* row, int64_t b) {
    const BlockQ5_0& k = BlockAt<BlockQ5_0>(row, b);
    return _mm256_sub_epi8(_mm256_or_si256(Nibbles(k.qs), FifthBits(k.qh)), Bytes(16));
  }
};
struct IntQ5_1 : BlockScales<BlockQ5_1, true> {
  static constexpr bool kSigned = false;
  static HWY_INLINE __m256i Weights(const uint8_t* row, int64_t b) {
    const BlockQ5_1& k = BlockAt<BlockQ5_1>(row, b);
    return _mm256_or_si256(Nibbles(k.qs), FifthBits(k.qh));
  }
};
struct IntIQ4_NL : BlockScales<BlockIQ4_NL, false> {
  static constexpr bool kSigned = true;
  static HWY_INLINE __m256i Weights(const uint8_t* row, int64_t b) {
    const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues));
    return _mm256_shuffle_epi8(_mm256_set_m128i(levels, levels),
                               Nibbles(BlockAt<BlockIQ4_NL>(row, b).qs));
  }
};

// K-quant super-blocks. Prepare unpacks a block's scales and mins once
// per row, into i16 lanes, for every activation row; ScaleWords<g> gives
// group g's scale per i16 lane of a maddubs result (lanes 0-7: values
// 0-15, lanes 8-15: values 16-31); IntMin is one activation row's integer
// min correction sum_i mn_i * bsums_i (0 for the types without mins).
// Weights<g>(row, b) is group g's 32 unsigned integers; a type with an
// offset (kOffset: Q3_K 4, Q6_K 32) means q - kOffset, subtracted from the
// pair sums as vpmaddubsw(kOffset, x) (KTile, once per token and group),
// which keeps every weight operand unsigned without the sign trick. g is a
// constant (0..7), so the shifts and shuffles are immediates.
struct KPrep {
  uint16_t d, dmin;   // f16 bits (dmin 0 where the type has none)
  __m256i scales[2];  // i16 scales, in the layout the type's ScaleWords reads
  __m256i mins;       // i16 min of each 16 values (types with mins)
};

HWY_INLINE int32_t HorizontalSumI32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}
HWY_INLINE int32_t IntMin(const KPrep& p, const int16_t* bsums) {
  return HorizontalSumI32(_mm256_madd_epi16(p.mins, Load32(bsums)));
}

// A vpshufb control that fills the low 128 bits with i16 lane `lo` and the
// high 128 bits with lane `hi` of each half (lanes 0-7).
HWY_INLINE __m256i WordsFrom(int lo, int hi) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * hi)),
                          _mm_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * lo)));
}
// 16 per-16-value scales (i16 lanes 0-15) as two vectors holding lanes
// 0-7 resp. 8-15 in both halves; ScaleWords16 picks group g's pair.
HWY_INLINE void SplitScales16(__m256i words, __m256i* out) {
  out[0] = _mm256_permute4x64_epi64(words, 0x44);
  out[1] = _mm256_permute4x64_epi64(words, 0xEE);
}
template <int g>
HWY_INLINE __m256i ScaleWords16(const KPrep& p) {
  return _mm256_shuffle_epi8(p.scales[g / 4], WordsFrom((2 * g) % 8, (2 * g) % 8 + 1));
}

HWY_INLINE __m256i Srl16(__m256i v, int n) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)); }

template <bool kFifth, class Block>
struct IntQ45_K {
  static constexpr bool kMin = true;
  static constexpr int kOffset = 0;
  static HWY_INLINE KPrep Prepare(const uint8_t* row, int64_t b) {
    const Block& k = BlockAt<Block>(row, b);
    uint64_t sc, mn;
    KScalesMins(k.scales, &sc, &mn);
    const __m128i mins8 = _mm_cvtsi64_si128(static_cast<int64_t>(mn));
    KPrep p{k.d, k.dmin, {}, {}};
    p.scales[0] =
        _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
    p.mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins8, mins8));  // a min per 32 values
    return p;
  }
  template <int g>
  static HWY_INLINE __m256i ScaleWords(const KPrep& p) {
    return _mm256_shuffle_epi8(p.scales[0], WordsFrom(g, g));
  }
  template <int g>
  static HWY_INLINE __m256i Weights(const uint8_t* row, int64_t b) {
    const Block& k = BlockAt<Block>(row, b);
    const __m256i raw = Load32(k.qs + g / 2 * 32);
    __m256i q = _mm256_and_si256(g % 2 == 0 ? raw : _mm256_srli_epi16(raw, 4), Bytes(0xF));
    if constexpr (kFifth) {
      const __m256i bit = _mm256_and_si256(Srl16(Load32(k.qh), g), Bytes(1));
      q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
    }
    return q;
  }
};
using IntQ4_K = IntQ45_K<false, BlockQ4_K>;
using IntQ5_K = IntQ45_K<true, BlockQ5_K>;

struct IntQ6_K {
  static constexpr bool kMin = false;
  static constexpr int kOffset = 32;
  static HWY_INLINE KPrep Prepare(const uint8_t* row, int64_t b) {
    const BlockQ6_K& k = BlockAt<BlockQ6_K>(row, b);
    KPrep p{k.d, 0, {}, _mm256_setzero_si256()};
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k.scales));
    SplitScales16(_mm256_cvtepi8_epi16(sc), p.scales);
    return p;
  }
  template <int g>
  static HWY_INLINE __m256i ScaleWords(const KPrep& p) {
    return ScaleWords16<g>(p);
  }
  template <int g>
  static HWY_INLINE __m256i Weights(const uint8_t* row, int64_t b) {
    constexpr int h = g / 4, pl = g % 4;
    const BlockQ6_K& k = BlockAt<BlockQ6_K>(row, b);
    const __m256i ql = Load32(k.ql + h * 64 + (pl & 1) * 32);
    const __m256i lo = _mm256_and_si256(pl < 2 ? ql : _mm256_srli_epi16(ql, 4), Bytes(0xF));
    const __m256i hi = _mm256_and_si256(Srl16(Load32(k.qh + h * 32), 2 * pl), Bytes(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
  }
};

struct IntQ3_K {
  static constexpr bool kMin = false;
  static constexpr int kOffset = 4;
  static HWY_INLINE KPrep Prepare(const uint8_t* row, int64_t b) {
    const BlockQ3_K& k = BlockAt<BlockQ3_K>(row, b);
    KPrep p{k.d, 0, {}, _mm256_setzero_si256()};
    int8_t sc[16];
    Q3KScales(k.scales, sc);
    SplitScales16(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc))),
                  p.scales);
    return p;
  }
  template <int g>
  static HWY_INLINE __m256i ScaleWords(const KPrep& p) {
    return ScaleWords16<g>(p);
  }
  template <int g>
  static HWY_INLINE __m256i Weights(const uint8_t* row, int64_t b) {
    constexpr int h = g / 4, pl = g % 4;
    const BlockQ3_K& k = BlockAt<BlockQ3_K>(row, b);
    const __m256i low = _mm256_and_si256(Srl16(Load32(k.qs + h * 32), 2 * pl), Bytes(3));
    const __m256i high = _mm256_and_si256(Srl16(Load32(k.hmask), 4 * h + pl), Bytes(1));
    return _mm256_or_si256(low, _mm256_slli_epi16(high, 2));
  }
};

struct IntQ2_K {
  static constexpr bool kMin = true;
  static constexpr int kOffset = 0;
  static HWY_INLINE KPrep Prepare(const uint8_t* row, int64_t b) {
    const BlockQ2_K& k = BlockAt<BlockQ2_K>(row, b);
    KPrep p{k.d, k.dmin, {}, {}};
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k.scales));
    const __m128i low4 = _mm_set1_epi8(0xF);
    SplitScales16(_mm256_cvtepu8_epi16(_mm_and_si128(s, low4)), p.scales);
    p.mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), low4));
    return p;
  }
  template <int g>
  static HWY_INLINE __m256i ScaleWords(const KPrep& p) {
    return ScaleWords16<g>(p);
  }
  template <int g>
  static HWY_INLINE __m256i Weights(const uint8_t* row, int64_t b) {
    constexpr int h = g / 4, pl = g % 4;
    const BlockQ2_K& k = BlockAt<BlockQ2_K>(row, b);
    return _mm256_and_si256(Srl16(Load32(k.qs + h * 32), 2 * pl), Bytes(3));
  }
};

#endif  // KVQ_INT8_DOT_SIMD

}  // namespace qdot
}  // namespace HWY_NAMESPACE
}  // namespace kvq::ops
HWY_AFTER_NAMESPACE();

#endif  // KVQ_OPS_QUANT_DOT_INL_H_
