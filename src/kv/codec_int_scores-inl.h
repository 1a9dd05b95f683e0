// Per-SIMD-target integer Scores for the int8/int4/int2 codecs (the math and
// the scalar twins' declarations are in codec_int_scores.h). Included by
// codec_int.cc inside its foreach_target loop (Highway's -inl.h toggle).
//
// Layout of the work: one vector lane per cache row (token). Each code dword
// (4 bytes at the same offset of every row) is gathered across the rows of a
// vector, so the products of one query head land in one int32 lane per row
// and no horizontal reduction is needed; per group the lanes are scaled in
// f32 by the row's scale (gathered the same way) and the head's q scale. A
// dword holds 4 consecutive elements per field: int8 one field, int4 two
// (low nibbles = elements j.., high = j+16..), int2 four (j.., j+8.., j+16..,
// j+24..), following the packing in codec.h.
//
// The integer products: on AVX3_DL (AVX-512 VNNI) one vpdpbusd per (head,
// field) multiplies the 4 unsigned code bytes of each lane by the 4 signed q8
// bytes and adds them to the lane. Elsewhere the codes are split into int16
// pairs (bytes 0,2 and 1,3) and ReorderWidenMulAccumulate (vpmaddwd on x86)
// does 2 products per int32 lane. Both give the same exact integers.
//
// No overflow, and exact conversion to f32: per lane and group the sum is
// over G <= 128 products |q8 * u| <= 127 * 255, so |I| <= 4,145,280 < 2^24 <
// 2^31 (and |I - 2^(B-1) Q| <= 128 * 127 * 128 = 2,080,768); each vpmaddwd
// pair sum is <= 2 * 127 * 255 = 64,770, and the int16 operands (codes <=
// 255, |q8| <= 127) are in range.

#if defined(KVQ_KV_CODEC_INT_SCORES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_KV_CODEC_INT_SCORES_INL_H_
#undef KVQ_KV_CODEC_INT_SCORES_INL_H_
#else
#define KVQ_KV_CODEC_INT_SCORES_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "kv/codec_int_scores.h"
#include "kv/codec_kernels-inl.h"  // kMaxHeadsPerPass, WithHeadCount

HWY_BEFORE_NAMESPACE();
namespace kvq::codec {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rows per vector (int32 lanes).
using RowTagI = hn::CappedTag<int32_t, 16>;
using RowTagF = hn::Rebind<float, RowTagI>;

#if HWY_TARGET == HWY_AVX3_DL
inline constexpr bool kByteDot = true;
// acc += per lane, sum over its 4 bytes of codes (unsigned) * q4 (signed,
// the same 4 bytes broadcast to every lane). Inline asm because Highway
// 1.0's AVX3_DL target attributes do not enable avx512vnni intrinsics,
// although it only selects AVX3_DL on CPUs with AVX512_VNNI.
HWY_INLINE hn::Vec512<int32_t> DotBytes(hn::Vec512<int32_t> acc, hn::Vec512<int32_t> codes,
                                        const int8_t* q4) {
  __m512i a = acc.raw;
  // The 4 bytes at q4 (any alignment) are a broadcast memory operand.
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(a)
      : "v"(codes.raw), "m"(*reinterpret_cast<const int8_t(*)[4]>(q4)));
  return hn::Vec512<int32_t>{a};
}
#else
inline constexpr bool kByteDot = false;
#endif

// acc (+ acc1) += per lane, lo16(pairs) * lo16(word) + hi16(pairs) *
// hi16(word), both halves signed int16: vpmaddwd on x86. Only the sum of
// acc and acc1 is defined (Highway's Reorder contract).
HWY_INLINE hn::Vec<RowTagI> MulPairsAdd(hn::Vec<RowTagI> pairs, int32_t word, hn::Vec<RowTagI> acc,
                                        hn::Vec<RowTagI>& acc1) {
  const RowTagI di;
#if HWY_TARGET == HWY_SCALAR
  (void)acc1;
  const uint32_t c = static_cast<uint32_t>(hn::GetLane(pairs)), q = static_cast<uint32_t>(word);
  const int32_t sum = static_cast<int16_t>(c & 0xFFFF) * static_cast<int16_t>(q & 0xFFFF) +
                      static_cast<int16_t>(c >> 16) * static_cast<int16_t>(q >> 16);
  return hn::Add(acc, hn::Set(di, sum));
#else
  const hn::Repartition<int16_t, RowTagI> di16;
  return hn::ReorderWidenMulAccumulate(di, hn::BitCast(di16, pairs),
                                       hn::BitCast(di16, hn::Set(di, word)), acc, acc1);
#endif
}

// int32 words per query head on the pair path: two int16 pairs per (code
// dword, field). The byte dot reads its 4 q8 bytes straight from q8.
constexpr int64_t QueryWordsPerHead(int64_t dim) { return dim / 2; }

// Element index of byte 0 of field f of code dword w (codec.h's packing).
template <int kBits>
HWY_INLINE int64_t FieldElement(int64_t w, int f) {
  constexpr uint64_t kBlockBytes = 4 * kBits;  // one 32-value block (a power of 2)
  constexpr uint64_t kFieldStride = 32 / (8 / kBits);
  // Unsigned: w >= 0, and / and % by a power of 2 become a shift and a mask.
  const uint64_t byte = 4 * static_cast<uint64_t>(w);
  return static_cast<int64_t>(byte / kBlockBytes * 32 + byte % kBlockBytes +
                              static_cast<uint64_t>(f) * kFieldStride);
}

// Query heads, per group: q: [heads, dim] -> q8 [heads, dim], qscale and qsum
// [heads, dim / group] (heads <= kMaxHeadsPerPass); the same operations as
// QuantizeQueryRef. The two divisions per group run as vector divisions over
// every (head, group) at once (IEEE division rounds the same either way).
HWY_INLINE void QuantizeQueryHeads(const float* HWY_RESTRICT q, int64_t heads, int64_t dim,
                                   int64_t group, int8_t* HWY_RESTRICT q8,
                                   float* HWY_RESTRICT qscale, int32_t* HWY_RESTRICT qsum) {
  const RowTagF df;
  const RowTagI di;
  const hn::Rebind<int8_t, RowTagI> d8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t count = heads * (dim / group);  // (head, group) pairs
  // [count] rounded up to whole vectors.
  alignas(64) float absmax[kMaxHeadsPerPass * kMaxParamGroups + 16];
  alignas(64) float inv[kMaxHeadsPerPass * kMaxParamGroups + 16];
  for (int64_t k = 0; k < count; ++k) {
    const float* qg = q + k * group;
    auto vmax = hn::Zero(df);
    for (int64_t i = 0; i < group; i += lanes) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, qg + i)));
    absmax[k] = hn::GetLane(hn::MaxOfLanes(df, vmax));
  }
  for (int64_t k = count; k % lanes != 0; ++k) absmax[k] = 0.0f;
  for (int64_t k = 0; k < count; k += lanes) {
    const auto qs = hn::Div(hn::Load(df, absmax + k), hn::Set(df, static_cast<float>(kQueryMax)));
    hn::Store(qs, df, absmax + k);
    hn::Store(hn::IfThenElseZero(hn::Ne(qs, hn::Zero(df)), hn::Div(hn::Set(df, 1.0f), qs)), df,
              inv + k);
  }
  for (int64_t k = 0; k < count; ++k) {
    const float* qg = q + k * group;
    const auto vinv = hn::Set(df, inv[k]);
    auto vsum = hn::Zero(di);
    for (int64_t i = 0; i < group; i += lanes) {
      auto qi = hn::NearestInt(hn::Mul(hn::LoadU(df, qg + i), vinv));
      qi = hn::Min(hn::Max(qi, hn::Set(di, -kQueryMax)), hn::Set(di, kQueryMax));
      vsum = hn::Add(vsum, qi);
      hn::StoreU(hn::DemoteTo(d8, qi), d8, q8 + k * group + i);
    }
    qscale[k] = absmax[k];
    qsum[k] = hn::GetLane(hn::SumOfLanes(di, vsum));
  }
}

// q8: [heads, dim] -> words: [heads, QueryWordsPerHead(dim)], in the order the
// pair path reads them: per code dword w and field f with e = FieldElement(w,
// f), the int16 pairs (e, e + 2) and (e + 1, e + 3), matching the code pairs
// split from the dword.
template <int kBits>
void BuildQueryWords(const int8_t* HWY_RESTRICT q8, int64_t heads, int64_t dim,
                     int32_t* HWY_RESTRICT words) {
  constexpr int kFields = 8 / kBits;
  const int64_t dwords = dim * kBits / 32, per_head = QueryWordsPerHead(dim);
  for (int64_t h = 0; h < heads; ++h) {
    const int8_t* qh = q8 + h * dim;
    int32_t* out = words + h * per_head;
    for (int64_t w = 0; w < dwords; ++w) {
      for (int f = 0; f < kFields; ++f) {
        const int64_t e = FieldElement<kBits>(w, f);
        for (int p = 0; p < 2; ++p) {
          const uint32_t lo = static_cast<uint16_t>(static_cast<int16_t>(qh[e + p]));
          const uint32_t hi = static_cast<uint16_t>(static_cast<int16_t>(qh[e + p + 2]));
          *out++ = static_cast<int32_t>(lo | (hi << 16));
        }
      }
    }
  }
}

// f16 bits in the low 16 bits of each lane -> f32, exact for every finite
// half (scales and mins are always finite): the magnitude bits moved into an
// f32 are the value times 2^-112 (subnormal halves become f32 subnormals),
// so one exact multiply restores it.
HWY_INLINE hn::Vec<RowTagF> HalfBitsToF32(hn::Vec<RowTagI> h) {
  const RowTagI di;
  const RowTagF df;
  const auto mag = hn::ShiftLeft<13>(hn::And(h, hn::Set(di, 0x7FFF)));
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(di, 0x8000)));
  return hn::Or(hn::Mul(hn::BitCast(df, mag), hn::Set(df, 0x1p112f)), hn::BitCast(df, sign));
}

// The f16 at byte `at` of each lane's row (at >= 2: the dword ending there is
// read, so nothing past the row is touched).
HWY_INLINE hn::Vec<RowTagF> GatherHalf(const uint8_t* rows, hn::Vec<RowTagI> offsets, int64_t at) {
  const RowTagI di;
  const hn::RebindToUnsigned<RowTagI> du;
  const auto dword = hn::GatherOffset(di, reinterpret_cast<const int32_t*>(rows + at - 2), offsets);
  return HalfBitsToF32(hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, dword))));
}

struct IntRowLayout {
  int64_t dim, row_bytes, code_bytes, group, groups;
};

// Rows whose code dwords are transposed in registers instead of gathered:
// up to this many dwords (int8 at head_dim 128), a multiple of 4.
inline constexpr int64_t kMaxTransposedDwords = 32;

// out[w], lane r = dword w of the row at base + r * row_bytes, for w <
// dwords (a multiple of 4) and every lane r: exactly what GatherOffset of
// dword w over the rows gives, from 128-bit row loads instead of one load per
// lane (a gather is 16 loads and was most of the scores kernel's time). Per
// 4 dwords, input vector i holds in its 128-bit block j the 4 dwords of row
// i + 4j; a 4x4 transpose inside every block (two rounds of interleaves)
// then puts dword w of rows 4j..4j+3 in block j of out[w], lane r = row r.
HWY_INLINE void LoadRowDwordsTransposed(const uint8_t* HWY_RESTRICT base, int64_t row_bytes,
                                        int64_t dwords, hn::Vec<RowTagI>* HWY_RESTRICT out) {
  const RowTagI di;
#if HWY_TARGET == HWY_SCALAR  // one lane: row 0's dwords
  (void)row_bytes;
  for (int64_t w = 0; w < dwords; ++w) {
    int32_t word;
    std::memcpy(&word, base + 4 * w, 4);
    out[w] = hn::Set(di, word);
  }
#else
  const hn::Repartition<int64_t, RowTagI> d64;
  const int32_t blocks = static_cast<int32_t>(hn::Lanes(di) / 4);
  const auto block_of_lane = hn::ShiftRight<2>(hn::Iota(di, 0));
  for (int64_t s = 0; s < dwords; s += 4) {
    hn::Vec<RowTagI> r[4];
    for (int i = 0; i < 4; ++i) {
      const uint8_t* row = base + i * row_bytes + 4 * s;
      auto v = hn::LoadDup128(di, reinterpret_cast<const int32_t*>(row));
      for (int32_t j = 1; j < blocks; ++j) {
        const auto* rj = reinterpret_cast<const int32_t*>(row + 4 * j * row_bytes);
        v = hn::IfThenElse(hn::Eq(block_of_lane, hn::Set(di, j)), hn::LoadDup128(di, rj), v);
      }
      r[i] = v;
    }
    const auto t0 = hn::BitCast(d64, hn::InterleaveLower(di, r[0], r[1]));
    const auto t1 = hn::BitCast(d64, hn::InterleaveUpper(di, r[0], r[1]));
    const auto t2 = hn::BitCast(d64, hn::InterleaveLower(di, r[2], r[3]));
    const auto t3 = hn::BitCast(d64, hn::InterleaveUpper(di, r[2], r[3]));
    out[s + 0] = hn::BitCast(di, hn::InterleaveLower(d64, t0, t2));
    out[s + 1] = hn::BitCast(di, hn::InterleaveUpper(d64, t0, t2));
    out[s + 2] = hn::BitCast(di, hn::InterleaveLower(d64, t1, t3));
    out[s + 3] = hn::BitCast(di, hn::InterleaveUpper(d64, t1, t3));
  }
#endif
}

// Scores (or, with kDotsOnly, the raw group dots) of rows [0, n) for kHeads
// quantized heads. q8: [kHeads, dim] (byte dot) or words: [kHeads,
// QueryWordsPerHead] (pair path); qscale, qsum:
// [kHeads, groups]. Scores: scores[h * stride + t]; dots: [kHeads, n, groups].
// Without kRowParams the rows are bare codes (per-channel tiles, whose scales
// are folded into q by the caller): score = scale * (bias[h] + sum_g qscale *
// I_g).
template <int64_t kHeads, int kBits, bool kSymmetric, bool kDotsOnly, bool kRowParams = true>
HWY_NOINLINE void IntDotPass(const IntRowLayout& L, const uint8_t* HWY_RESTRICT rows, int64_t n,
                             const int8_t* HWY_RESTRICT q8, const int32_t* HWY_RESTRICT words,
                             const float* HWY_RESTRICT qscale, const int32_t* HWY_RESTRICT qsum,
                             float scale, float* HWY_RESTRICT scores, int64_t stride,
                             int32_t* HWY_RESTRICT dots, const float* HWY_RESTRICT bias = nullptr) {
  using VI = hn::Vec<RowTagI>;
  using VF = hn::Vec<RowTagF>;
  const RowTagI di;
  const RowTagF df;
  constexpr int kFields = 8 / kBits;
  constexpr int32_t kMask8 = static_cast<int32_t>(((1u << kBits) - 1) * 0x01010101u);
  constexpr int32_t kMask16 = static_cast<int32_t>(((1u << kBits) - 1) * 0x00010001u);
  constexpr int32_t kCenter = 1 << (kBits - 1);
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(di));
  const int64_t per_head = QueryWordsPerHead(L.dim);
  const int64_t dwords_per_group = L.group * kBits / 32;
  // Rows with few enough code dwords load a whole vector of rows transposed.
  const int64_t code_dwords = L.code_bytes / 4;
  const bool transposable = code_dwords % 4 == 0 && code_dwords <= kMaxTransposedDwords;
  for (int64_t t0 = 0; t0 < n; t0 += lanes) {
    const int64_t count = std::min(lanes, n - t0);
    const uint8_t* base = rows + t0 * L.row_bytes;
    // Lanes past the last row re-read it (valid memory); they are not stored.
    const VI offsets =
        hn::Mul(hn::Min(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(count - 1))),
                hn::Set(di, static_cast<int32_t>(L.row_bytes)));
    PrefetchAhead(base, base + lanes * L.row_bytes);
    const bool transposed = transposable && count == lanes;  // a partial vector gathers
    VI codes_of[kMaxTransposedDwords];
    if (transposed) LoadRowDwordsTransposed(base, L.row_bytes, code_dwords, codes_of);
    VF score[kHeads];
    for (int64_t h = 0; h < kHeads; ++h) {
      score[h] = kRowParams ? hn::Zero(df) : hn::Set(df, bias[h]);
    }
    for (int64_t g = 0; g < L.groups; ++g) {
      VI acc[kHeads], acc1[kHeads];
      for (int64_t h = 0; h < kHeads; ++h) acc[h] = acc1[h] = hn::Zero(di);
      for (int64_t w = g * dwords_per_group; w < (g + 1) * dwords_per_group; ++w) {
        const VI v = transposed ? codes_of[w]
                                : hn::GatherOffset(
                                      di, reinterpret_cast<const int32_t*>(base + 4 * w), offsets);
        for (int f = 0; f < kFields; ++f) {
#if HWY_TARGET == HWY_AVX3_DL
          (void)per_head;
          VI codes = v;
          if constexpr (kBits < 8) {
            codes = hn::And(hn::ShiftRightSame(v, kBits * f), hn::Set(di, kMask8));
          }
          for (int64_t h = 0; h < kHeads; ++h) {
            acc[h] = DotBytes(acc[h], codes, q8 + h * L.dim + FieldElement<kBits>(w, f));
          }
#else
          (void)kMask8;
          for (int p = 0; p < 2; ++p) {
            const VI pairs =
                hn::And(hn::ShiftRightSame(v, 8 * p + kBits * f), hn::Set(di, kMask16));
            for (int64_t h = 0; h < kHeads; ++h) {
              const int32_t word = words[h * per_head + (w * kFields + f) * 2 + p];
              acc[h] = MulPairsAdd(pairs, word, acc[h], acc1[h]);
            }
          }
#endif
        }
      }
      for (int64_t h = 0; h < kHeads; ++h) acc[h] = hn::Add(acc[h], acc1[h]);
      if constexpr (kDotsOnly) {
        for (int64_t h = 0; h < kHeads; ++h) {
          alignas(64) int32_t lane_dots[16];
          hn::Store(acc[h], di, lane_dots);
          for (int64_t r = 0; r < count; ++r) dots[(h * n + t0 + r) * L.groups + g] = lane_dots[r];
        }
        continue;
      }
      if constexpr (!kRowParams) {
        for (int64_t h = 0; h < kHeads; ++h) {
          score[h] = hn::MulAdd(hn::ConvertTo(df, acc[h]), hn::Set(df, qscale[h * L.groups + g]),
                                score[h]);
        }
        continue;
      }
      const VF s = GatherHalf(base, offsets, L.code_bytes + 2 * g);
      VF m = hn::Zero(df);
      if constexpr (!kSymmetric) m = GatherHalf(base, offsets, L.code_bytes + 2 * (L.groups + g));
      for (int64_t h = 0; h < kHeads; ++h) {
        const float qs = qscale[h * L.groups + g];
        const int32_t q_sum = qsum[h * L.groups + g];
        const VF s_qs = hn::Mul(s, hn::Set(df, qs));
        if constexpr (kSymmetric) {
          // sum q8 * (u - 2^(B-1)), exact (bound above).
          const VI centered = hn::Sub(acc[h], hn::Set(di, kCenter * q_sum));
          score[h] = hn::MulAdd(hn::ConvertTo(df, centered), s_qs, score[h]);
        } else {
          score[h] = hn::MulAdd(m, hn::Set(df, qs * static_cast<float>(q_sum)), score[h]);
          score[h] = hn::MulAdd(hn::ConvertTo(df, acc[h]), s_qs, score[h]);
        }
      }
    }
    if constexpr (!kDotsOnly) {
      const VF vscale = hn::Set(df, scale);
      for (int64_t h = 0; h < kHeads; ++h) {
        float* out = scores + h * stride + t0;
        if (count == lanes) {
          hn::StoreU(hn::Mul(score[h], vscale), df, out);
        } else {
          hn::BlendedStore(hn::Mul(score[h], vscale), hn::FirstN(df, static_cast<size_t>(count)),
                           df, out);
        }
      }
    }
  }
}

// A quantized query (KvCodec::PrepareQuery, and each pass of IntDotScores):
// every head's q8, pair-path words, qscale and qsum. Offsets are 64-byte
// aligned inside the buffer.
struct PreparedLayout {
  size_t q8, words, qscale, qsum, bytes;
};
constexpr PreparedLayout PreparedQueryLayout(int64_t heads, int64_t dim, int64_t groups) {
  auto up = [](size_t x) { return (x + 63) / 64 * 64; };
  PreparedLayout p{};
  p.q8 = 0;
  p.words = up(static_cast<size_t>(heads * dim));
  p.qscale = p.words + up(static_cast<size_t>(heads * QueryWordsPerHead(dim)) * 4);
  p.qsum = p.qscale + up(static_cast<size_t>(heads * groups) * 4);
  p.bytes = p.qsum + up(static_cast<size_t>(heads * groups) * 4);
  return p;
}
// Bytes of one pass of kMaxHeadsPerPass heads of any codec shape (a stack buffer).
inline constexpr size_t kPreparedPassBytes =
    PreparedQueryLayout(kMaxHeadsPerPass, kMaxCodecHeadDim, kMaxParamGroups).bytes;

// Quantizes `heads` query heads (q: [heads, dim]) into `prepared`, per pass
// of kMaxHeadsPerPass heads as the dot passes read them.
template <int kBits>
void PrepareQueryHeads(const IntRowLayout& L, const float* q, int64_t heads, uint8_t* prepared) {
  const PreparedLayout P = PreparedQueryLayout(heads, L.dim, L.groups);
  auto* q8 = reinterpret_cast<int8_t*>(prepared + P.q8);
  auto* words = reinterpret_cast<int32_t*>(prepared + P.words);
  auto* qscale = reinterpret_cast<float*>(prepared + P.qscale);
  auto* qsum = reinterpret_cast<int32_t*>(prepared + P.qsum);
  for (int64_t h0 = 0; h0 < heads; h0 += kMaxHeadsPerPass) {
    const int64_t count = std::min(kMaxHeadsPerPass, heads - h0);
    QuantizeQueryHeads(q + h0 * L.dim, count, L.dim, L.group, q8 + h0 * L.dim,
                       qscale + h0 * L.groups, qsum + h0 * L.groups);
    if constexpr (!kByteDot) {
      BuildQueryWords<kBits>(q8 + h0 * L.dim, count, L.dim, words + h0 * QueryWordsPerHead(L.dim));
    }
  }
}

// Scores of rows [0, n) for a prepared query of `heads` heads. Without
// kRowParams (per-channel tiles): score = scale * (bias[h] + sum_g qscale I_g).
template <int kBits, bool kSymmetric, bool kRowParams = true>
void IntDotScoresPrepared(const IntRowLayout& L, const uint8_t* rows, int64_t n,
                          const uint8_t* prepared, int64_t heads, float scale, float* scores,
                          int64_t stride, const float* bias = nullptr) {
  if (n <= 0) return;
  const PreparedLayout P = PreparedQueryLayout(heads, L.dim, L.groups);
  const auto* q8 = reinterpret_cast<const int8_t*>(prepared + P.q8);
  const auto* words = reinterpret_cast<const int32_t*>(prepared + P.words);
  const auto* qscale = reinterpret_cast<const float*>(prepared + P.qscale);
  const auto* qsum = reinterpret_cast<const int32_t*>(prepared + P.qsum);
  for (int64_t h0 = 0; h0 < heads; h0 += kMaxHeadsPerPass) {
    const int64_t count = std::min(kMaxHeadsPerPass, heads - h0);
    WithHeadCount(count, [&](auto k) {
      IntDotPass<decltype(k)::value, kBits, kSymmetric, false, kRowParams>(
          L, rows, n, q8 + h0 * L.dim, words + h0 * QueryWordsPerHead(L.dim),
          qscale + h0 * L.groups, qsum + h0 * L.groups, scale, scores + h0 * stride, stride,
          nullptr, kRowParams ? nullptr : bias + h0);
    });
  }
}

// Scores of `heads` query heads (q: [heads, dim], f32), quantized one pass
// at a time into a stack buffer; or, with kDotsOnly, the raw dots of
// already-quantized heads (q8: [heads, dim]) into dots.
template <int kBits, bool kSymmetric, bool kDotsOnly>
void IntDotScores(const IntRowLayout& L, const uint8_t* rows, int64_t n, const float* q,
                  const int8_t* q8_in, int64_t heads, float scale, float* scores, int64_t stride,
                  int32_t* dots) {
  if (n <= 0) return;
  if constexpr (!kDotsOnly) {
    alignas(64) uint8_t prepared[kPreparedPassBytes];
    for (int64_t h0 = 0; h0 < heads; h0 += kMaxHeadsPerPass) {
      const int64_t count = std::min(kMaxHeadsPerPass, heads - h0);
      PrepareQueryHeads<kBits>(L, q + h0 * L.dim, count, prepared);
      IntDotScoresPrepared<kBits, kSymmetric>(L, rows, n, prepared, count, scale,
                                              scores + h0 * stride, stride);
    }
  } else {
    (void)q;
    alignas(64) int32_t words[kMaxHeadsPerPass * kMaxCodecHeadDim / 2];  // [heads, per_head]
    for (int64_t h0 = 0; h0 < heads; h0 += kMaxHeadsPerPass) {
      const int64_t count = std::min(kMaxHeadsPerPass, heads - h0);
      const int8_t* q8 = q8_in + h0 * L.dim;
      if constexpr (!kByteDot) BuildQueryWords<kBits>(q8, count, L.dim, words);
      WithHeadCount(count, [&](auto k) {
        IntDotPass<decltype(k)::value, kBits, kSymmetric, true>(L, rows, n, q8, words, nullptr,
                                                                nullptr, scale, nullptr, stride,
                                                                dots + h0 * n * L.groups);
      });
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::codec
HWY_AFTER_NAMESPACE();

#endif  // KVQ_KV_CODEC_INT_SCORES_INL_H_
