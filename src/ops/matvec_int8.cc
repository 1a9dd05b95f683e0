// Highway-dispatched integer-dot matvec (matvec_int8.h). Compiled once per
// SIMD target through foreach_target.h, AVX3_DL included (Highway 1.0.3
// only builds it on request), so AVX-512 VNNI machines get vpdpbusd.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1
#endif

#include "ops/matvec_int8.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "base/fp16.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/matvec_int8.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h (own include block so clang-format keeps the order).
#include "hwy/cache_control.h"
#include "ops/quant_dot-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq::ops {
namespace HWY_NAMESPACE {

#if KVQ_INT8_DOT_SIMD
using qdot::Dot;

HWY_INLINE float Half(uint16_t bits) { return _cvtsh_ss(bits); }

HWY_INLINE float HorizontalSum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// Prefetches the tile after this one at the rate this one is read (the R
// rows are R short interleaved streams the hardware prefetcher follows
// poorly; as matvec.cc).
struct Prefetcher {
  const uint8_t* next;  // nullptr if none
  int64_t tile_bytes, blocks, done = 0;
  HWY_INLINE void At(int64_t blk) {
    if (next == nullptr) return;
    for (const int64_t upto = (blk + 1) * tile_bytes / blocks; done < upto; done += 64) {
      hwy::Prefetch(next + done);
    }
  }
};

// The two 32-value activation blocks: BlockQ8_0 names its quants q and
// has no s.
HWY_INLINE const int8_t* ActQs(const BlockQ8_0& a) { return a.q; }
HWY_INLINE const int8_t* ActQs(const BlockQ8_1& a) { return a.qs; }
HWY_INLINE uint16_t ActS(const BlockQ8_0&) { return 0; }
HWY_INLINE uint16_t ActS(const BlockQ8_1& a) { return a.s; }

// y[t][r] for R rows of a 32-value block type against NT Q8_0 / Q8_1
// activation rows (act_bytes apart; y rows y_stride apart): per block, row
// and token, 8 int32 lanes of the exact dot product, converted to f32
// (exact: |lane| <= 4 * 128 * 127) and multiplied by d_w * d_x in f32, as
// the twin's per-block product; *_1 types add m_w * s_x (f32). Each row's
// block is unpacked once for the NT tokens; every (row, token) sees the
// same operations in the same order for any NT, so a batch equals its
// tokens one at a time bit for bit.
template <int R, int NT, class T, class Act>
KVQ_VNNI_ATTR HWY_INLINE void SmallTile(const uint8_t* row0, int64_t row_bytes, const uint8_t* acts,
                                        int64_t act_bytes, int64_t blocks, float* y,
                                        int64_t y_stride, Prefetcher pf) {
  __m256 acc[NT][R];
  float mins[NT][R];
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < R; ++r) acc[t][r] = _mm256_setzero_ps(), mins[t][r] = 0.0f;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    pf.At(b);
    const Act* a[NT];
    __m256i x[NT];
    float dx[NT];
    for (int t = 0; t < NT; ++t) {
      a[t] = reinterpret_cast<const Act*>(acts + t * act_bytes) + b;
      x[t] = qdot::Load32(ActQs(*a[t]));
      dx[t] = Half(a[t]->d);
    }
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = row0 + r * row_bytes;
      const __m256i w = T::Weights(row, b);
      const float dw = Half(T::D(row, b));
      for (int t = 0; t < NT; ++t) {
        const qdot::Operands o = qdot::Prepare<T::kSigned>(w, x[t]);
        const __m256i dot = Dot(_mm256_setzero_si256(), o.u, o.s);
        acc[t][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * dx[t]), acc[t][r]);
        if constexpr (T::kMin) mins[t][r] += Half(T::M(row, b)) * Half(ActS(*a[t]));
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < R; ++r) y[t * y_stride + r] = HorizontalSum(acc[t][r]) + mins[t][r];
  }
}

template <int... kG, class F>
HWY_INLINE void ForEachGroup(std::integer_sequence<int, kG...>, F&& f) {
  (f(std::integral_constant<int, kG>()), ...);
}

// y[t][r] for R rows of a K-quant against NT Q8_K activation rows: per
// super-block, row and token the int32 lanes of sum_i sc_i * dot_i (exact,
// and exact in f32: |lane| <= 8 * 128 * 4 * 32 * 127 < 2^24), times d_x *
// d_w in f32, minus d_x * dmin_w times the integer min correction (f32), as
// the twin. Lane i holds values 4i..4i+3 of each group (vpmaddubsw's i16
// pairs, then vpmaddwd with the scales), whatever the target. The scales
// are unpacked once per super-block and row, each group's weights once per
// row, and an offset type's kOffset * x once per token, for all NT tokens;
// the per-(row, token) arithmetic and its order do not depend on NT (as
// SmallTile). vpmaddubsw cannot saturate: weights are unsigned and at most
// 63, |x| <= 127, so a pair is at most 2 * 63 * 127 < 32767, and after the
// offset |q - kOffset| <= 32.
template <int R, int NT, class T>
KVQ_VNNI_ATTR HWY_INLINE void KTile(const uint8_t* row0, int64_t row_bytes, const uint8_t* acts,
                                    int64_t act_bytes, int64_t blocks, float* y, int64_t y_stride,
                                    Prefetcher pf) {
  __m256 acc[NT][R];
  float mins[NT][R];
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < R; ++r) acc[t][r] = _mm256_setzero_ps(), mins[t][r] = 0.0f;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    pf.At(b);
    const BlockQ8_K* a[NT];
    for (int t = 0; t < NT; ++t)
      a[t] = reinterpret_cast<const BlockQ8_K*>(acts + t * act_bytes) + b;
    qdot::KPrep p[R];
    for (int r = 0; r < R; ++r) p[r] = T::Prepare(row0 + r * row_bytes, b);
    __m256i isum[NT][R];
    for (int t = 0; t < NT; ++t) {
      for (int r = 0; r < R; ++r) isum[t][r] = _mm256_setzero_si256();
    }
    ForEachGroup(std::make_integer_sequence<int, 8>(), [&](auto gc) KVQ_VNNI_ATTR HWY_ATTR {
      constexpr int g = decltype(gc)::value;
      __m256i x[NT], offset[NT];
      for (int t = 0; t < NT; ++t) {
        x[t] = qdot::Load32(a[t]->qs + 32 * g);
        if constexpr (T::kOffset != 0) {
          offset[t] = _mm256_maddubs_epi16(qdot::Bytes(T::kOffset), x[t]);
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m256i w = T::template Weights<g>(row0 + r * row_bytes, b);
        const __m256i scale = T::template ScaleWords<g>(p[r]);
        for (int t = 0; t < NT; ++t) {
          __m256i words = _mm256_maddubs_epi16(w, x[t]);
          if constexpr (T::kOffset != 0) words = _mm256_sub_epi16(words, offset[t]);
          isum[t][r] = qdot::DotWords(isum[t][r], words, scale);
        }
      }
    });
    for (int t = 0; t < NT; ++t) {
      for (int r = 0; r < R; ++r) {
        const float dd = a[t]->d * Half(p[r].d);
        acc[t][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t][r]), _mm256_set1_ps(dd), acc[t][r]);
        const int32_t int_min = T::kMin ? qdot::IntMin(p[r], a[t]->bsums) : 0;
        mins[t][r] -= a[t]->d * Half(p[r].dmin) * static_cast<float>(int_min);
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < R; ++r) y[t * y_stride + r] = HorizontalSum(acc[t][r]) + mins[t][r];
  }
}

// Calls f(T{}, act_tag) with the integer unpacker of `type`.
template <class F>
HWY_INLINE void VisitIntType(WeightType type, F&& f) {
  switch (type) {
    case WeightType::kQ8_0:
      return f(qdot::IntQ8_0{}, BlockQ8_0{});
    case WeightType::kQ4_0:
      return f(qdot::IntQ4_0{}, BlockQ8_0{});
    case WeightType::kQ5_0:
      return f(qdot::IntQ5_0{}, BlockQ8_0{});
    case WeightType::kIQ4_NL:
      return f(qdot::IntIQ4_NL{}, BlockQ8_0{});
    case WeightType::kQ4_1:
      return f(qdot::IntQ4_1{}, BlockQ8_1{});
    case WeightType::kQ5_1:
      return f(qdot::IntQ5_1{}, BlockQ8_1{});
    case WeightType::kQ2_K:
      return f(qdot::IntQ2_K{}, BlockQ8_K{});
    case WeightType::kQ3_K:
      return f(qdot::IntQ3_K{}, BlockQ8_K{});
    case WeightType::kQ4_K:
      return f(qdot::IntQ4_K{}, BlockQ8_K{});
    case WeightType::kQ5_K:
      return f(qdot::IntQ5_K{}, BlockQ8_K{});
    case WeightType::kQ6_K:
      return f(qdot::IntQ6_K{}, BlockQ8_K{});
    default:
      return;
  }
}

// Activation rows a tile takes together: each unpacked weight block then
// serves this many dot products (then tiles of 2, then 1, for what is left).
// In session 19's runs of ops_bench's MatvecInt8Batch on AVX2, tiles of 4
// beat tiles of 2 on Q4_K and Q6_K from 4 tokens up (docs/benchmarks.md has
// 4 against the one-token kernel); more would spill the NT x R accumulators.
constexpr int kTileTokens = 4;

// Rows [r0, r0 + R) of y[n, w.rows] for all n activation rows, kTileTokens
// at a time; the R weight rows stay in L1 between tiles.
template <int R>
KVQ_VNNI_ATTR HWY_INLINE void RowsInt8(const WeightView& w, const uint8_t* acts, int64_t n,
                                       float* y, int64_t r0) {
  const int64_t act_bytes = Int8ActRowBytes(w.type, w.cols);
  const int64_t row_bytes = w.row_bytes();
  const uint8_t* next = r0 + 2 * R <= w.rows ? w.row(r0 + R) : nullptr;
  VisitIntType(w.type, [&](auto t, auto act) KVQ_VNNI_ATTR HWY_ATTR {
    using T = decltype(t);
    using A = decltype(act);
    const int64_t blocks = w.cols / (std::is_same_v<A, BlockQ8_K> ? kQKBlock : kQBlock);
    auto tile = [&](auto tokens, int64_t tok) KVQ_VNNI_ATTR HWY_ATTR {
      constexpr int kNT = decltype(tokens)::value;
      const uint8_t* at = acts + tok * act_bytes;
      float* yt = y + tok * w.rows + r0;
      const Prefetcher pf{tok == 0 ? next : nullptr, R * row_bytes, blocks};
      if constexpr (std::is_same_v<A, BlockQ8_K>) {
        KTile<R, kNT, T>(w.row(r0), row_bytes, at, act_bytes, blocks, yt, w.rows, pf);
      } else {
        SmallTile<R, kNT, T, A>(w.row(r0), row_bytes, at, act_bytes, blocks, yt, w.rows, pf);
      }
    };
    int64_t tok = 0;
    for (; tok + kTileTokens <= n; tok += kTileTokens) {
      tile(std::integral_constant<int, kTileTokens>(), tok);
    }
    for (; tok + 2 <= n; tok += 2) tile(std::integral_constant<int, 2>(), tok);
    for (; tok < n; ++tok) tile(std::integral_constant<int, 1>(), tok);
  });
}
#endif  // KVQ_INT8_DOT_SIMD

KVQ_VNNI_ATTR void MatvecInt8Impl(const WeightView& w, const uint8_t* HWY_RESTRICT acts, int64_t n,
                                  float* HWY_RESTRICT y, ThreadPool& pool) {
  constexpr int64_t kRowBlock = 4;
  const int64_t row_blocks = w.rows / kRowBlock;
  const int threads = w.bytes() >= (int64_t{64} << 10) ? pool.size() : 1;
#if KVQ_INT8_DOT_SIMD
  pool.ForEach(
      row_blocks, Schedule::kStatic,
      [&](int64_t rb, int) KVQ_VNNI_ATTR { RowsInt8<kRowBlock>(w, acts, n, y, rb * kRowBlock); },
      threads);
  for (int64_t r = row_blocks * kRowBlock; r < w.rows; ++r) RowsInt8<1>(w, acts, n, y, r);
#else
  // No SIMD kernel on this target: the scalar twin, rows split as above.
  const int64_t act_bytes = Int8ActRowBytes(w.type, w.cols);
  pool.ForEach(
      row_blocks + 1, Schedule::kStatic,
      [&](int64_t c, int) {
        const int64_t r0 = c * kRowBlock;
        const int64_t count = std::min(kRowBlock, w.rows - r0);
        if (count <= 0) return;
        const WeightView slice{w.type, count, w.cols, w.row(r0)};
        for (int64_t t = 0; t < n; ++t) {
          MatvecInt8Ref(slice, acts + t * act_bytes, y + t * w.rows + r0, nullptr);
        }
      },
      threads);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::ops {

HWY_EXPORT(MatvecInt8Impl);

void MatvecInt8(const WeightView& w, const uint8_t* acts, int64_t n, float* y, ThreadPool& pool) {
  HWY_DYNAMIC_DISPATCH(MatvecInt8Impl)(w, acts, n, y, pool);
}

}  // namespace kvq::ops
#endif  // HWY_ONCE
