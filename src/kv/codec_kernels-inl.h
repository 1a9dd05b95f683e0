// Per-SIMD-target kernels shared by every codec: Decode, Scores and
// AccumulateV written once over a row format. Included by each codec family
// file inside its foreach_target loop (Highway's -inl.h toggle pattern).
//
// A format provides, per target:
//   using D = a float descriptor of at most 16 lanes (head_dim % Lanes == 0);
//   static constexpr bool kHasParams: rows carry per-group (scale, offset);
//   int64_t head_dim; size_t row_bytes;
//   int64_t ParamGroup(): values sharing one (scale, offset) (head_dim if none);
//   GroupParams Params(const uint8_t* row, int64_t g): group g's scale and offset;
//   Vec<D> Load(D, const uint8_t* row, int64_t i, Vec<D> scale, Vec<D> offset):
//     values [i, i + Lanes) of one row decoded to f32, exactly (i a multiple
//     of Lanes; scale/offset the broadcast Params of i's group);
// optionally void Patch(const uint8_t* rows, int64_t n, float* x): fixes up
//   rows [0, n) that Load decoded into x (exact outliers); Load alone then
//   gives the values before the patch, so such a format is always read
//   through decoded blocks (TakesDecodedBlocks).
// Group parameters are converted once per group and row, not per vector.
// The kernels decode each vector of a row once and use it for up to
// kMaxHeadsPerPass query heads held in registers; larger GQA groups take
// several passes (the row is then in L1). 8 covers the common GQA ratios
// (4 for Llama-3-8B and Mistral, 7 for Qwen2.5, 8 for Llama-3-70B).

#if defined(KVQ_KV_CODEC_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_KV_CODEC_KERNELS_INL_H_
#undef KVQ_KV_CODEC_KERNELS_INL_H_
#else
#define KVQ_KV_CODEC_KERNELS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvq::codec {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr int64_t kMaxHeadsPerPass = 8;
// Rows per AccumulateV pass: one pass walks every vector column of these rows
// (they stay in L1) while the accumulators stay in registers.
inline constexpr int64_t kAccumulateRowBlock = 32;

// How far ahead of the rows a kernel is reading it prefetches. A codec call
// reads its rows as one sequential stream, yet on this project's machine
// (AMD EPYC, KVM) the hardware prefetchers did not keep ahead of short-row
// streams: codec_bench's cold int4 Scores ran 3.5x faster with a software
// prefetch spread through the loop (docs/benchmarks.md, "in-kernel prefetch").
// Past the last row the lines are those of the next blocks of the same head
// (slot-major tiles) or of nothing in particular; a prefetch never faults.
inline constexpr int64_t kPrefetchBytes = 4096;

// Prefetches the cache lines of [begin, end) shifted kPrefetchBytes ahead.
// Kernels call it once per step with the bytes the step reads, so a stream's
// prefetches are issued a few at a time instead of in bursts.
HWY_INLINE void PrefetchAhead(const uint8_t* begin, const uint8_t* end) {
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + kPrefetchBytes) & ~uintptr_t{63};
  const uintptr_t last = reinterpret_cast<uintptr_t>(end) + kPrefetchBytes;
  for (uintptr_t a = first; a < last; a += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(a));
  }
}
// Most parameter groups a row can have (head_dim <= 1024, groups >= 32 values).
inline constexpr int64_t kMaxParamGroups = kMaxCodecHeadDim / 32;

struct ScaleOffset {
  float scale, offset;
};

// Codes of elements [i, i + Lanes(d)) of one row packed as the integer
// formats pack them (codec.h: int8 a byte each; int4 byte j = elements j |
// j + 16 of a 32-value block; int2 byte j = elements j, j + 8, j + 16, j + 24),
// as signed lanes. i is a multiple of Lanes(d); Lanes(d) <= 16 (int2: <= 8).
template <int kBits, class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> LoadIntCodes(D /*d*/, const uint8_t* codes, int64_t i) {
  const hn::RebindToSigned<D> di;
  const hn::Rebind<uint8_t, D> du8;
  if constexpr (kBits == 8) {
    return hn::PromoteTo(di, hn::LoadU(du8, codes + i));
  } else if constexpr (kBits == 4) {
    const int64_t within = i & 31;
    const auto raw = hn::PromoteTo(di, hn::LoadU(du8, codes + (i >> 5) * 16 + (within & 15)));
    return within < 16 ? hn::And(raw, hn::Set(di, 0xF)) : hn::ShiftRight<4>(raw);
  } else {
    const int64_t within = i & 31;
    const auto raw = hn::PromoteTo(di, hn::LoadU(du8, codes + (i >> 5) * 8 + (within & 7)));
    return hn::And(hn::ShiftRightSame(raw, static_cast<int>(2 * (within >> 3))), hn::Set(di, 3));
  }
}

template <class Fmt, class = void>
struct HasPatch : std::false_type {};
template <class Fmt>
struct HasPatch<Fmt, std::void_t<decltype(&Fmt::Patch)>> : std::true_type {};

template <class Fmt>
HWY_INLINE void DecodeRows(const Fmt& fmt, const uint8_t* HWY_RESTRICT rows, int64_t n,
                           float* HWY_RESTRICT x) {
  using D = typename Fmt::D;
  const D d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t group = fmt.ParamGroup();
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = rows + t * static_cast<int64_t>(fmt.row_bytes);
    for (int64_t g = 0; g * group < fmt.head_dim; ++g) {
      const ScaleOffset so = fmt.Params(row, g);
      const auto vs = hn::Set(d, so.scale), vo = hn::Set(d, so.offset);
      for (int64_t i = g * group; i < (g + 1) * group; i += lanes) {
        hn::StoreU(fmt.Load(d, row, i, vs, vo), d, x + t * fmt.head_dim + i);
      }
    }
  }
  if constexpr (HasPatch<Fmt>::value) fmt.Patch(rows, n, x);
}

#if HWY_TARGET == HWY_SCALAR
template <class D>
HWY_INLINE void SumOf4(D d, hn::Vec<D> a, hn::Vec<D> b, hn::Vec<D> c, hn::Vec<D> e,
                       float* HWY_RESTRICT out) {
  out[0] = hn::GetLane(a);
  out[1] = hn::GetLane(b);
  out[2] = hn::GetLane(c);
  out[3] = hn::GetLane(e);
}
#else
// Adds the halves of v until one 128-bit block is left, then stores it.
template <class D>
HWY_INLINE void FoldAndStore(D d, hn::Vec<D> v, float* HWY_RESTRICT out) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    FoldAndStore(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out);
  } else {
    hn::StoreU(v, d, out);
  }
}

// out[0..3] = the lane sums of a, b, c, e (vectors of at least 4 lanes).
// Four vectors reduce together in ~10 shuffles and adds instead of four
// separate reductions of ~8 each: interleaving pairs within each 128-bit
// block leaves [a, b, c, e] partial sums in every block; blocks then fold.
template <class D>
HWY_INLINE void SumOf4(D d, hn::Vec<D> a, hn::Vec<D> b, hn::Vec<D> c, hn::Vec<D> e,
                       float* HWY_RESTRICT out) {
  static_assert(hn::MaxLanes(D()) >= 4, "SumOf4 needs whole 128-bit blocks");
  const hn::Repartition<uint64_t, D> d64;
  const auto ab =
      hn::BitCast(d64, hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b)));
  const auto ce =
      hn::BitCast(d64, hn::Add(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e)));
  FoldAndStore(d,
               hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, ab, ce)),
                       hn::BitCast(d, hn::InterleaveUpper(d64, ab, ce))),
               out);
}
#endif

// Scores of kRows consecutive rows starting at `row` (the t-th of the tile)
// for kHeads heads: each q vector is loaded once for all kRows rows.
template <int64_t kHeads, int64_t kRows, class Fmt>
HWY_INLINE void ScoresRows(const Fmt& fmt, const uint8_t* HWY_RESTRICT row, int64_t t,
                           const float* HWY_RESTRICT q, float scale, float* HWY_RESTRICT scores,
                           int64_t stride) {
  using D = typename Fmt::D;
  using V = hn::Vec<D>;
  const D d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t dim = fmt.head_dim;
  const int64_t row_bytes = static_cast<int64_t>(fmt.row_bytes);
  constexpr int64_t kPadded = (kHeads + 3) / 4 * 4;
  V acc[kRows][kPadded];
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t h = 0; h < kPadded; ++h) acc[r][h] = hn::Zero(d);
  }
  const int64_t group = fmt.ParamGroup();
  for (int64_t g = 0; g * group < dim; ++g) {
    V vs[kRows], vo[kRows];
    for (int64_t r = 0; r < kRows; ++r) {
      const ScaleOffset so = fmt.Params(row + r * row_bytes, g);
      vs[r] = hn::Set(d, so.scale);
      vo[r] = hn::Set(d, so.offset);
    }
    for (int64_t i = g * group; i < (g + 1) * group; i += lanes) {
      V x[kRows];
      for (int64_t r = 0; r < kRows; ++r) x[r] = fmt.Load(d, row + r * row_bytes, i, vs[r], vo[r]);
      for (int64_t h = 0; h < kHeads; ++h) {
        const V qv = hn::LoadU(d, q + h * dim + i);
        for (int64_t r = 0; r < kRows; ++r) acc[r][h] = hn::MulAdd(qv, x[r], acc[r][h]);
      }
    }
  }
  for (int64_t r = 0; r < kRows; ++r) {
    float sums[kPadded];
    for (int64_t h = 0; h < kPadded; h += 4) {
      SumOf4(d, acc[r][h], acc[r][h + 1], acc[r][h + 2], acc[r][h + 3], sums + h);
    }
    for (int64_t h = 0; h < kHeads; ++h) scores[h * stride + t + r] = scale * sums[h];
  }
}

// q: [kHeads, head_dim]; scores[h * stride + t]. Two rows at a time while
// their accumulators fit the register file (up to 4 heads), else one.
template <int64_t kHeads, class Fmt>
HWY_NOINLINE void ScoresPass(const Fmt& fmt, const uint8_t* HWY_RESTRICT rows, int64_t n,
                             const float* HWY_RESTRICT q, float scale, float* HWY_RESTRICT scores,
                             int64_t stride) {
  constexpr int64_t kRows = kHeads <= 4 ? 2 : 1;
  const int64_t row_bytes = static_cast<int64_t>(fmt.row_bytes);
  int64_t t = 0;
  for (; t + kRows <= n; t += kRows) {
    PrefetchAhead(rows + t * row_bytes, rows + (t + kRows) * row_bytes);
    ScoresRows<kHeads, kRows>(fmt, rows + t * row_bytes, t, q, scale, scores, stride);
  }
  for (; t < n; ++t) ScoresRows<kHeads, 1>(fmt, rows + t * row_bytes, t, q, scale, scores, stride);
}

// p: p[h * stride + t]; acc: [kHeads, head_dim].
template <int64_t kHeads, class Fmt>
HWY_NOINLINE void AccumulatePass(const Fmt& fmt, const uint8_t* HWY_RESTRICT rows, int64_t n,
                                 const float* HWY_RESTRICT p, int64_t stride,
                                 float* HWY_RESTRICT acc) {
  using D = typename Fmt::D;
  using V = hn::Vec<D>;
  const D d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t dim = fmt.head_dim;
  const int64_t row_bytes = static_cast<int64_t>(fmt.row_bytes);
  const int64_t group = fmt.ParamGroup();
  const int64_t groups = dim / group;
  // Parameters of every (row, group) of the block, converted once: the loop
  // below visits each row once per vector column.
  float scales[Fmt::kHasParams ? kAccumulateRowBlock * kMaxParamGroups : 1];   // [rows, groups]
  float offsets[Fmt::kHasParams ? kAccumulateRowBlock * kMaxParamGroups : 1];  // [rows, groups]
  for (int64_t t0 = 0; t0 < n; t0 += kAccumulateRowBlock) {
    const int64_t t1 = std::min(n, t0 + kAccumulateRowBlock);
    PrefetchAhead(rows + t0 * row_bytes, rows + t1 * row_bytes);
    if constexpr (Fmt::kHasParams) {
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t g = 0; g < groups; ++g) {
          const ScaleOffset so = fmt.Params(rows + t * row_bytes, g);
          scales[(t - t0) * groups + g] = so.scale;
          offsets[(t - t0) * groups + g] = so.offset;
        }
      }
    }
    for (int64_t i = 0; i < dim; i += lanes) {
      V a[kHeads];
      for (int64_t h = 0; h < kHeads; ++h) a[h] = hn::LoadU(d, acc + h * dim + i);
      const int64_t g = i / group;
      for (int64_t t = t0; t < t1; ++t) {
        V vs = hn::Zero(d), vo = hn::Zero(d);
        if constexpr (Fmt::kHasParams) {
          vs = hn::Set(d, scales[(t - t0) * groups + g]);
          vo = hn::Set(d, offsets[(t - t0) * groups + g]);
        }
        const V x = fmt.Load(d, rows + t * row_bytes, i, vs, vo);
        for (int64_t h = 0; h < kHeads; ++h)
          a[h] = hn::MulAdd(hn::Set(d, p[h * stride + t]), x, a[h]);
      }
      for (int64_t h = 0; h < kHeads; ++h) hn::StoreU(a[h], d, acc + h * dim + i);
    }
  }
}

// Floats of the block of rows ForEachDecodedBlock decodes at a time: 32 KiB, an L1's
// worth (at least 8 rows: head_dim <= kMaxCodecHeadDim).
inline constexpr int64_t kDecodedBlockFloats = 8192;

// f32 rows: the f32 codec's format, and rows DecodeRows has decoded, read
// with the lanes of the format they came from (Scores then sums each row's
// lanes in the same order).
template <class DF>
struct DecodedFmt {
  using D = DF;
  static constexpr bool kHasParams = false;
  int64_t head_dim;
  size_t row_bytes;
  int64_t ParamGroup() const { return head_dim; }
  ScaleOffset Params(const uint8_t* /*row*/, int64_t /*g*/) const { return {}; }
  HWY_INLINE hn::Vec<D> Load(D d, const uint8_t* row, int64_t i, hn::Vec<D>, hn::Vec<D>) const {
    return hn::LoadU(d, reinterpret_cast<const float*>(row) + i);
  }
};

// A format whose Load costs several times its multiply-adds (a table lookup
// per value, patched outliers) declares kDecodeOnce. Measured with
// codec_bench's prefill tile (Hot/.../d128/g30, docs/benchmarks.md, session
// 34): AccumulateV 1.6-4x faster on the non-uniform (KVQuant) rows and about
// a quarter faster on llama.cpp's blocks; the integer, float, per-channel
// and TurboQuant rows, whose loads are a shift or a conversion, ran as fast
// or slower reading the decoded floats, so they decode in every pass.
template <class Fmt, class = void>
struct DecodesOnce : std::false_type {};
template <class Fmt>
struct DecodesOnce<Fmt, std::void_t<decltype(Fmt::kDecodeOnce)>>
    : std::bool_constant<Fmt::kDecodeOnce> {};

// More query rows than one pass holds (a prefill tile: 30 rows on
// Qwen2.5-1.5B) would decode every vector once per pass, and decoding a
// 3-bit non-uniform row costs several times its multiply-adds. Instead each
// block of rows is decoded once into L1 and every pass reads the floats: the
// same values in the same order, so the results are bit-identical.
// pass(decoded_fmt, decoded_rows, t0, count) runs on rows [t0, t0 + count).
template <class Fmt, class Pass>
HWY_INLINE void ForEachDecodedBlock(const Fmt& fmt, const uint8_t* HWY_RESTRICT rows, int64_t n,
                                    const Pass& pass) {
  HWY_ALIGN float decoded[kDecodedBlockFloats];  // [block, head_dim]
  const int64_t block = kDecodedBlockFloats / fmt.head_dim;
  const DecodedFmt<typename Fmt::D> floats{fmt.head_dim, fmt.head_dim * sizeof(float)};
  for (int64_t t0 = 0; t0 < n; t0 += block) {
    const int64_t count = std::min(block, n - t0);
    DecodeRows(fmt, rows + t0 * static_cast<int64_t>(fmt.row_bytes), count, decoded);
    pass(floats, reinterpret_cast<const uint8_t*>(decoded), t0, count);
  }
}

template <class Fmt>
HWY_INLINE bool TakesDecodedBlocks(int64_t group) {
  return HasPatch<Fmt>::value || (group > kMaxHeadsPerPass && DecodesOnce<Fmt>::value);
}

// Calls body(std::integral_constant<int64_t, K>()) with K = heads, clamped to
// [1, kMaxHeadsPerPass], so each pass is compiled with a fixed accumulator count.
template <class Body>
HWY_INLINE void WithHeadCount(int64_t heads, const Body& body) {
  switch (heads) {
    case 1:
      return body(std::integral_constant<int64_t, 1>());
    case 2:
      return body(std::integral_constant<int64_t, 2>());
    case 3:
      return body(std::integral_constant<int64_t, 3>());
    case 4:
      return body(std::integral_constant<int64_t, 4>());
    case 5:
      return body(std::integral_constant<int64_t, 5>());
    case 6:
      return body(std::integral_constant<int64_t, 6>());
    case 7:
      return body(std::integral_constant<int64_t, 7>());
    default:
      return body(std::integral_constant<int64_t, kMaxHeadsPerPass>());
  }
}

template <class Fmt>
HWY_INLINE void ScoresInPasses(const Fmt& fmt, const uint8_t* rows, int64_t n, const float* q,
                               int64_t group, float scale, float* scores, int64_t stride) {
  for (int64_t h0 = 0; h0 < group; h0 += kMaxHeadsPerPass) {
    const float* qh = q + h0 * fmt.head_dim;
    float* sh = scores + h0 * stride;
    WithHeadCount(std::min(kMaxHeadsPerPass, group - h0), [&](auto heads) {
      ScoresPass<decltype(heads)::value>(fmt, rows, n, qh, scale, sh, stride);
    });
  }
}

template <class Fmt>
HWY_INLINE void AccumulateVInPasses(const Fmt& fmt, const uint8_t* rows, int64_t n, const float* p,
                                    int64_t group, int64_t stride, float* acc) {
  for (int64_t h0 = 0; h0 < group; h0 += kMaxHeadsPerPass) {
    const float* ph = p + h0 * stride;
    float* ah = acc + h0 * fmt.head_dim;
    WithHeadCount(std::min(kMaxHeadsPerPass, group - h0), [&](auto heads) {
      AccumulatePass<decltype(heads)::value>(fmt, rows, n, ph, stride, ah);
    });
  }
}

// q: [group, head_dim]; scores[h * stride + t] for the n rows.
template <class Fmt>
HWY_INLINE void Scores(const Fmt& fmt, const uint8_t* rows, int64_t n, const float* q,
                       int64_t group, float scale, float* scores, int64_t stride) {
  if (!TakesDecodedBlocks<Fmt>(group))
    return ScoresInPasses(fmt, rows, n, q, group, scale, scores, stride);
  ForEachDecodedBlock(
      fmt, rows, n, [&](const auto& floats, const uint8_t* decoded, int64_t t0, int64_t count) {
        ScoresInPasses(floats, decoded, count, q, group, scale, scores + t0, stride);
      });
}

// p[h * stride + t] for the n rows; acc: [group, head_dim], accumulated into.
template <class Fmt>
HWY_INLINE void AccumulateV(const Fmt& fmt, const uint8_t* rows, int64_t n, const float* p,
                            int64_t group, int64_t stride, float* acc) {
  if (!TakesDecodedBlocks<Fmt>(group))
    return AccumulateVInPasses(fmt, rows, n, p, group, stride, acc);
  ForEachDecodedBlock(fmt, rows, n,
                      [&](const auto& floats, const uint8_t* decoded, int64_t t0, int64_t count) {
                        AccumulateVInPasses(floats, decoded, count, p + t0, group, stride, acc);
                      });
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::codec
HWY_AFTER_NAMESPACE();

#endif  // KVQ_KV_CODEC_KERNELS_INL_H_
