// Per-SIMD-target kernels shared by every codec: Decode, Scores and
// AccumulateV written once over a row format. Included by each codec family
// file inside its foreach_target loop (Highway's -inl.h toggle pattern).
//
// A format provides, per target:
//   using D = a float descriptor of at most 16 lanes (head_dim % Lanes == 0);
//   int64_t head_dim; size_t row_bytes;
//   Vec<D> Load(D, const uint8_t* row, int64_t i): values [i, i + Lanes) of
//     one row decoded to f32, exactly (i a multiple of Lanes).
// The kernels decode each vector of a row once and use it for up to
// kMaxHeadsPerPass query heads held in registers; larger GQA groups take
// several passes (the row is then in L1).

#if defined(KVQ_KV_CODEC_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_KV_CODEC_KERNELS_INL_H_
#undef KVQ_KV_CODEC_KERNELS_INL_H_
#else
#define KVQ_KV_CODEC_KERNELS_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvq::codec {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr int64_t kMaxHeadsPerPass = 4;
// Rows per AccumulateV pass: one pass walks every vector column of these rows
// (they stay in L1) while the accumulators stay in registers.
inline constexpr int64_t kAccumulateRowBlock = 32;

template <class Fmt>
HWY_INLINE void DecodeRows(const Fmt& fmt, const uint8_t* HWY_RESTRICT rows, int64_t n,
                           float* HWY_RESTRICT x) {
  using D = typename Fmt::D;
  const D d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = rows + t * static_cast<int64_t>(fmt.row_bytes);
    for (int64_t i = 0; i < fmt.head_dim; i += lanes) {
      hn::StoreU(fmt.Load(d, row, i), d, x + t * fmt.head_dim + i);
    }
  }
}

// q: [kHeads, head_dim]; scores[h * stride + t].
template <int64_t kHeads, class Fmt>
HWY_NOINLINE void ScoresPass(const Fmt& fmt, const uint8_t* HWY_RESTRICT rows, int64_t n,
                             const float* HWY_RESTRICT q, float scale, float* HWY_RESTRICT scores,
                             int64_t stride) {
  using D = typename Fmt::D;
  using V = hn::Vec<D>;
  const D d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t dim = fmt.head_dim;
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = rows + t * static_cast<int64_t>(fmt.row_bytes);
    V acc[kHeads];
    for (int64_t h = 0; h < kHeads; ++h) acc[h] = hn::Zero(d);
    for (int64_t i = 0; i < dim; i += lanes) {
      const V x = fmt.Load(d, row, i);
      for (int64_t h = 0; h < kHeads; ++h)
        acc[h] = hn::MulAdd(hn::LoadU(d, q + h * dim + i), x, acc[h]);
    }
    for (int64_t h = 0; h < kHeads; ++h) {
      scores[h * stride + t] = scale * hn::GetLane(hn::SumOfLanes(d, acc[h]));
    }
  }
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
  for (int64_t t0 = 0; t0 < n; t0 += kAccumulateRowBlock) {
    const int64_t t1 = std::min(n, t0 + kAccumulateRowBlock);
    for (int64_t i = 0; i < dim; i += lanes) {
      V a[kHeads];
      for (int64_t h = 0; h < kHeads; ++h) a[h] = hn::LoadU(d, acc + h * dim + i);
      for (int64_t t = t0; t < t1; ++t) {
        const V x = fmt.Load(d, rows + t * row_bytes, i);
        for (int64_t h = 0; h < kHeads; ++h)
          a[h] = hn::MulAdd(hn::Set(d, p[h * stride + t]), x, a[h]);
      }
      for (int64_t h = 0; h < kHeads; ++h) hn::StoreU(a[h], d, acc + h * dim + i);
    }
  }
}

template <class Fmt>
HWY_INLINE void Scores(const Fmt& fmt, const uint8_t* rows, int64_t n, const float* q,
                       int64_t group, float scale, float* scores, int64_t stride) {
  for (int64_t h0 = 0; h0 < group; h0 += kMaxHeadsPerPass) {
    const float* qh = q + h0 * fmt.head_dim;
    float* sh = scores + h0 * stride;
    switch (std::min(kMaxHeadsPerPass, group - h0)) {
      case 1:
        ScoresPass<1>(fmt, rows, n, qh, scale, sh, stride);
        break;
      case 2:
        ScoresPass<2>(fmt, rows, n, qh, scale, sh, stride);
        break;
      case 3:
        ScoresPass<3>(fmt, rows, n, qh, scale, sh, stride);
        break;
      default:
        ScoresPass<4>(fmt, rows, n, qh, scale, sh, stride);
        break;
    }
  }
}

template <class Fmt>
HWY_INLINE void AccumulateV(const Fmt& fmt, const uint8_t* rows, int64_t n, const float* p,
                            int64_t group, int64_t stride, float* acc) {
  for (int64_t h0 = 0; h0 < group; h0 += kMaxHeadsPerPass) {
    const float* ph = p + h0 * stride;
    float* ah = acc + h0 * fmt.head_dim;
    switch (std::min(kMaxHeadsPerPass, group - h0)) {
      case 1:
        AccumulatePass<1>(fmt, rows, n, ph, stride, ah);
        break;
      case 2:
        AccumulatePass<2>(fmt, rows, n, ph, stride, ah);
        break;
      case 3:
        AccumulatePass<3>(fmt, rows, n, ph, stride, ah);
        break;
      default:
        AccumulatePass<4>(fmt, rows, n, ph, stride, ah);
        break;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::codec
HWY_AFTER_NAMESPACE();

#endif  // KVQ_KV_CODEC_KERNELS_INL_H_
