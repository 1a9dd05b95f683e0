// Highway kernels for Matvec and row decoding. This file is compiled once per
// SIMD target through foreach_target.h; the HWY_ONCE section at the end holds
// the dispatching entry points and the scalar reference twins.
#include "ops/matvec.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "base/fp16.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/matvec.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h (own include block so clang-format keeps the order).
#include "hwy/cache_control.h"
// After highway.h: per-target decoders of the other block types.
#include "ops/quant_decode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// N consecutive weights at p, widened to f32 (exact for every finite value;
// Highway's F16C-less emulation on SSSE3/SSE4 mis-decodes f16 inf/NaN, which
// model weights never contain).
HWY_INLINE VF LoadAsF32(DF df, const float* HWY_RESTRICT p) { return hn::LoadU(df, p); }
HWY_INLINE VF LoadAsF32(DF df, const hwy::float16_t* HWY_RESTRICT p) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, p));
}
HWY_INLINE VF LoadAsF32(DF df, const hwy::bfloat16_t* HWY_RESTRICT p) {
  const hn::Rebind<hwy::bfloat16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, p));
}

// Scalar decode for the tails shorter than a vector.
HWY_INLINE float ScalarToF32(float v) { return v; }
HWY_INLINE float ScalarToF32(hwy::float16_t v) {
  uint16_t bits;
  std::memcpy(&bits, &v, 2);
  return F16ToF32(bits);
}
HWY_INLINE float ScalarToF32(hwy::bfloat16_t v) {
  uint16_t bits;
  std::memcpy(&bits, &v, 2);
  return Bf16ToF32(bits);
}

// A Q8_0 block scale. F16C (on every AVX2+ target) converts in one
// instruction; the portable path branches on the exponent.
HWY_INLINE float ScaleToF32(uint16_t bits) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(bits);
#else
  return F16ToF32(bits);
#endif
}

// Row accessors: f32 vectors of weights for row r at column i (i a multiple
// of the lane count), and scalar values for the tails of dense rows.
template <typename T>
struct DenseRows {
  const T* HWY_RESTRICT w;  // first row of the tile
  int64_t stride;           // elements between rows
  HWY_INLINE VF Load(DF df, int r, int64_t i) const { return LoadAsF32(df, w + r * stride + i); }
  HWY_INLINE float Scalar(int r, int64_t i) const { return ScalarToF32(w[r * stride + i]); }
};

// Q8_0 decodes each vector to d * q before the FMA. d * q is exact in f32
// (11 + 8 significant bits), so the kernel sums exactly the products the
// f32 reference sums, and the same error bound applies as for dense types.
// Lane counts (1..16) divide 32, so a vector never straddles two blocks.
struct Q8Rows {
  const BlockQ8_0* HWY_RESTRICT w;  // first row of the tile
  int64_t stride;                   // blocks between rows
  HWY_INLINE VF Load(DF df, int r, int64_t i) const {
    const hn::Rebind<int32_t, DF> di32;
    const hn::Rebind<int8_t, DF> di8;
    const BlockQ8_0& b = w[r * stride + i / kQ8_0BlockSize];
    const VF q = hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(di8, b.q + i % kQ8_0BlockSize)));
    return hn::Mul(hn::Set(df, ScaleToF32(b.d)), q);
  }
  HWY_INLINE float Scalar(int r, int64_t i) const {
    const BlockQ8_0& b = w[r * stride + i / kQ8_0BlockSize];
    return F16ToF32(b.d) * static_cast<float>(b.q[i % kQ8_0BlockSize]);
  }
};

// y[k * ldy + r] = dot(row r, x[k * ldx ...]) for an R-row by K-token tile.
// Each weight vector is decoded once and feeds K tokens; each x vector
// feeds R rows; the R * K accumulator chains hide FMA latency.
//
// `next` (nullptr if none) is the start of the following tile's rows,
// `tile_bytes` their size: it is prefetched at the rate this tile is read.
// The R rows are R short interleaved streams (a Q8_0 row of 896 is 15
// cache lines) that the hardware prefetcher follows poorly; without this,
// Q8_0 decode reached a third of the read-bandwidth probe.
template <int R, int K, class Rows>
HWY_INLINE void DotTile(const Rows& rows, const float* HWY_RESTRICT x, int64_t ldx, int64_t cols,
                        float* HWY_RESTRICT y, int64_t ldy, const uint8_t* next,
                        int64_t tile_bytes) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  VF acc[R * K];
  for (int a = 0; a < R * K; ++a) acc[a] = hn::Zero(df);
  int64_t i = 0;
  int64_t prefetched = 0;  // bytes of `next` already prefetched
  for (; i + n <= cols; i += n) {
    if (next != nullptr) {
      const int64_t consumed = (i + n) * tile_bytes / cols;
      for (; prefetched < consumed; prefetched += 64) hwy::Prefetch(next + prefetched);
    }
    VF xv[K];
    for (int k = 0; k < K; ++k) xv[k] = hn::LoadU(df, x + k * ldx + i);
    for (int r = 0; r < R; ++r) {
      const VF wv = rows.Load(df, r, i);
      for (int k = 0; k < K; ++k) acc[r * K + k] = hn::MulAdd(wv, xv[k], acc[r * K + k]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < K; ++k) {
      float sum = hn::GetLane(hn::SumOfLanes(df, acc[r * K + k]));
      for (int64_t j = i; j < cols; ++j) sum += rows.Scalar(r, j) * x[k * ldx + j];
      y[k * ldy + r] = sum;
    }
  }
}

// Q8_0 tile: same arithmetic as DotTile over Q8Rows (each weight decoded to
// d * q, then FMA), but the scale of each block is converted and broadcast
// once per block and row instead of once per vector.
template <int R, int K>
HWY_INLINE void DotTileQ8(const Q8Rows& rows, const float* HWY_RESTRICT x, int64_t ldx,
                          int64_t cols, float* HWY_RESTRICT y, int64_t ldy, const uint8_t* next,
                          int64_t tile_bytes) {
  const DF df;
  const hn::Rebind<int32_t, DF> di32;
  const hn::Rebind<int8_t, DF> di8;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  VF acc[R * K];
  for (int a = 0; a < R * K; ++a) acc[a] = hn::Zero(df);
  const int64_t blocks = cols / kQ8_0BlockSize;
  int64_t prefetched = 0;  // bytes of `next` already prefetched
  for (int64_t b = 0; b < blocks; ++b) {
    if (next != nullptr) {
      const int64_t consumed = (b + 1) * tile_bytes / blocks;
      for (; prefetched < consumed; prefetched += 64) hwy::Prefetch(next + prefetched);
    }
    VF d[R];
    for (int r = 0; r < R; ++r) d[r] = hn::Set(df, ScaleToF32(rows.w[r * rows.stride + b].d));
    for (int64_t j = 0; j < kQ8_0BlockSize; j += n) {
      const int64_t i = b * kQ8_0BlockSize + j;
      VF xv[K];
      for (int k = 0; k < K; ++k) xv[k] = hn::LoadU(df, x + k * ldx + i);
      for (int r = 0; r < R; ++r) {
        const int8_t* q = rows.w[r * rows.stride + b].q + j;
        const VF wv = hn::Mul(d[r], hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(di8, q))));
        for (int k = 0; k < K; ++k) acc[r * K + k] = hn::MulAdd(wv, xv[k], acc[r * K + k]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < K; ++k) y[k * ldy + r] = hn::GetLane(hn::SumOfLanes(df, acc[r * K + k]));
  }
}

// Rows of a type with a group decoder (quant_decode-inl.h).
template <class Dec>
struct GroupRows {
  const uint8_t* HWY_RESTRICT w;  // first row of the tile
  int64_t row_bytes;
};

// Same arithmetic as DotTile (each weight decoded exactly, then one FMA per
// token), one block of every row at a time (scales unpacked once per block
// and row), then its 32-value groups; the decoder hands each vector
// straight to the FMAs, so decoded weights never leave registers.
template <int R, int K, class Dec>
HWY_INLINE void DotTileGroups(const GroupRows<Dec>& rows, const float* HWY_RESTRICT x, int64_t ldx,
                              int64_t cols, float* HWY_RESTRICT y, int64_t ldy, const uint8_t* next,
                              int64_t tile_bytes) {
  const DF df;
  VF acc[R * K];
  for (int a = 0; a < R * K; ++a) acc[a] = hn::Zero(df);
  constexpr int kGroups = Dec::kGroups;
  const int64_t blocks = cols / (kQBlock * kGroups);
  int64_t prefetched = 0;  // bytes of `next` already prefetched
  for (int64_t blk = 0; blk < blocks; ++blk) {
    if (next != nullptr) {
      const int64_t consumed = (blk + 1) * tile_bytes / blocks;
      for (; prefetched < consumed; prefetched += 64) hwy::Prefetch(next + prefetched);
    }
    typename Dec::Params p[R];
    for (int r = 0; r < R; ++r) p[r] = Dec::Prepare(rows.w + r * rows.row_bytes, blk);
    // Groups unrolled at compile time: each group's plane, nibble and
    // shift choices become constants (Q6_K 4.3 -> 6.1 Gweights/s, Q5_K 4.6
    // -> 6.0 in ops_bench MatvecL2).
    qd::ForEachGroup<kGroups>([&](int s) HWY_ATTR {
      const float* xg = x + (blk * kGroups + s) * kQBlock;
      for (int r = 0; r < R; ++r) {
        Dec::Group(df, rows.w + r * rows.row_bytes, blk, s, p[r], [&](int64_t j, VF wv) HWY_ATTR {
          for (int k = 0; k < K; ++k) {
            acc[r * K + k] = hn::MulAdd(wv, hn::LoadU(df, xg + k * ldx + j), acc[r * K + k]);
          }
        });
      }
    });
  }
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < K; ++k) y[k * ldy + r] = hn::GetLane(hn::SumOfLanes(df, acc[r * K + k]));
  }
}

template <class T>
struct IsGroupRows : std::false_type {};
template <class Dec>
struct IsGroupRows<GroupRows<Dec>> : std::true_type {};

template <int R, int K, class Rows>
HWY_INLINE void RunTile(const Rows& rows, const float* HWY_RESTRICT x, int64_t ldx, int64_t cols,
                        float* HWY_RESTRICT y, int64_t ldy, const uint8_t* next,
                        int64_t tile_bytes) {
  if constexpr (std::is_same_v<Rows, Q8Rows>) {
    DotTileQ8<R, K>(rows, x, ldx, cols, y, ldy, next, tile_bytes);
  } else if constexpr (IsGroupRows<Rows>::value) {
    DotTileGroups<R, K>(rows, x, ldx, cols, y, ldy, next, tile_bytes);
  } else {
    DotTile<R, K>(rows, x, ldx, cols, y, ldy, next, tile_bytes);
  }
}

// Most tokens one tile handles: 4 rows x 4 tokens = 16 accumulators, half
// the AVX-512 register file.
constexpr int64_t kTileTokens = 4;

// Rows [r0, r0 + R) of y[n, w.rows] for all n tokens, kTileTokens at a
// time; the R rows stay in L1 between token groups, so W is read from memory
// once whatever n is.
template <int R>
HWY_INLINE void MatvecRows(const WeightView& w, const float* HWY_RESTRICT x, int64_t n,
                           float* HWY_RESTRICT y, int64_t r0) {
  const uint8_t* next = r0 + 2 * R <= w.rows ? w.row(r0 + R) : nullptr;
  const int64_t tile_bytes = R * w.row_bytes();
  const auto run = [&](const auto& rows) {
    for (int64_t t = 0; t < n; t += kTileTokens) {
      const float* xt = x + t * w.cols;
      float* yt = y + t * w.rows + r0;
      const uint8_t* pf = t == 0 ? next : nullptr;
      switch (std::min(kTileTokens, n - t)) {
        case 1:
          RunTile<R, 1>(rows, xt, w.cols, w.cols, yt, w.rows, pf, tile_bytes);
          break;
        case 2:
          RunTile<R, 2>(rows, xt, w.cols, w.cols, yt, w.rows, pf, tile_bytes);
          break;
        case 3:
          RunTile<R, 3>(rows, xt, w.cols, w.cols, yt, w.rows, pf, tile_bytes);
          break;
        default:
          RunTile<R, 4>(rows, xt, w.cols, w.cols, yt, w.rows, pf, tile_bytes);
          break;
      }
    }
  };
  switch (w.type) {
    case WeightType::kF32:
      run(DenseRows<float>{reinterpret_cast<const float*>(w.row(r0)), w.cols});
      return;
    case WeightType::kF16:
      run(DenseRows<hwy::float16_t>{reinterpret_cast<const hwy::float16_t*>(w.row(r0)), w.cols});
      return;
    case WeightType::kBF16:
      run(DenseRows<hwy::bfloat16_t>{reinterpret_cast<const hwy::bfloat16_t*>(w.row(r0)), w.cols});
      return;
    case WeightType::kQ8_0:
      run(Q8Rows{reinterpret_cast<const BlockQ8_0*>(w.row(r0)), w.cols / kQ8_0BlockSize});
      return;
    default:
      qd::VisitGroupDecoder(w.type, [&](auto dec) HWY_ATTR {
        run(GroupRows<decltype(dec)>{w.row(r0), w.row_bytes()});
      });
      return;
  }
}

// Tokens per pass over W. A 64-token slice of x (64 x 4864 f32 = 1.2 MiB at
// most for Qwen2.5-0.5B, 229 KiB for cols 896) stays in L2 while each 4-row
// tile of W is reused from L1 across it, so W is read n / 64 times.
constexpr int64_t kTokenChunk = 64;

void MatvecBatchImpl(const WeightView& w, const float* HWY_RESTRICT x, int64_t n,
                     float* HWY_RESTRICT y, ThreadPool& pool) {
  constexpr int64_t kRowBlock = 4;
  const int64_t row_blocks = w.rows / kRowBlock;
  // Below ~64 KiB of weights the fork/join costs more than it saves.
  const int threads = w.bytes() >= (int64_t{64} << 10) ? pool.size() : 1;
  pool.RunOnThreads(threads, [&](int thread) HWY_ATTR {
    // Each thread keeps the same rows for every chunk of tokens, so no
    // barrier is needed between chunks.
    const auto [rb0, rb1] = ThreadPool::StaticRange(row_blocks, threads, thread);
    for (int64_t t0 = 0; t0 < n; t0 += kTokenChunk) {
      const int64_t tn = std::min(kTokenChunk, n - t0);
      for (int64_t rb = rb0; rb < rb1; ++rb) {
        MatvecRows<kRowBlock>(w, x + t0 * w.cols, tn, y + t0 * w.rows, rb * kRowBlock);
      }
    }
  });
  for (int64_t r = row_blocks * kRowBlock; r < w.rows; ++r) MatvecRows<1>(w, x, n, y, r);
}

template <typename T>
HWY_INLINE void WidenRow(const T* HWY_RESTRICT src, int64_t cols, float* HWY_RESTRICT dst) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + n <= cols; i += n) hn::StoreU(LoadAsF32(df, src + i), df, dst + i);
  for (; i < cols; ++i) dst[i] = ScalarToF32(src[i]);
}

// Rows [first, first + count) of a group-decoded type into out[count, cols].
template <class Dec>
HWY_INLINE void DecodeGroupRows(const WeightView& w, int64_t first, int64_t count,
                                float* HWY_RESTRICT out) {
  const DF df;
  for (int64_t r = 0; r < count; ++r) {
    float* dst = out + r * w.cols;
    qd::DecodeGroups<Dec>(df, w.row(first + r), 0, w.cols / kQBlock,
                          [&](int64_t j, VF v) HWY_ATTR { hn::StoreU(v, df, dst + j); });
  }
}

void DequantizeRowsImpl(const WeightView& w, int64_t first, int64_t count,
                        float* HWY_RESTRICT out) {
  const int64_t cols = w.cols;
  switch (w.type) {
    default:
      qd::VisitGroupDecoder(
          w.type, [&](auto dec) HWY_ATTR { DecodeGroupRows<decltype(dec)>(w, first, count, out); });
      return;
    case WeightType::kF32:
      std::memcpy(out, w.row(first), static_cast<size_t>(count * cols) * sizeof(float));
      return;
    case WeightType::kF16:
      for (int64_t r = 0; r < count; ++r) {
        WidenRow(reinterpret_cast<const hwy::float16_t*>(w.row(first + r)), cols, out + r * cols);
      }
      return;
    case WeightType::kBF16:
      for (int64_t r = 0; r < count; ++r) {
        WidenRow(reinterpret_cast<const hwy::bfloat16_t*>(w.row(first + r)), cols, out + r * cols);
      }
      return;
    case WeightType::kQ8_0: {
      const DF df;
      const hn::Rebind<int32_t, DF> di32;
      const hn::Rebind<int8_t, DF> di8;
      const int64_t n = static_cast<int64_t>(hn::Lanes(df));
      const int64_t blocks = cols / kQ8_0BlockSize;
      for (int64_t r = 0; r < count; ++r) {
        const BlockQ8_0* row = reinterpret_cast<const BlockQ8_0*>(w.row(first + r));
        float* dst = out + r * cols;
        for (int64_t b = 0; b < blocks; ++b) {
          const VF d = hn::Set(df, ScaleToF32(row[b].d));
          for (int64_t j = 0; j < kQ8_0BlockSize; j += n) {
            const VF q = hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(di8, row[b].q + j)));
            hn::StoreU(hn::Mul(d, q), df, dst + b * kQ8_0BlockSize + j);
          }
        }
      }
      return;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::ops {

HWY_EXPORT(MatvecBatchImpl);
HWY_EXPORT(DequantizeRowsImpl);

void Matvec(const WeightView& w, const float* x, float* y, ThreadPool& pool) {
  HWY_DYNAMIC_DISPATCH(MatvecBatchImpl)(w, x, 1, y, pool);
}

void MatvecBatch(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool) {
  HWY_DYNAMIC_DISPATCH(MatvecBatchImpl)(w, x, n, y, pool);
}

void MatvecRef(const WeightView& w, const float* x, float* y) {
  std::vector<float> row(static_cast<size_t>(w.cols));  // [cols]
  for (int64_t r = 0; r < w.rows; ++r) {
    DequantizeRowRef(w, r, row.data());
    double sum = 0.0;
    for (int64_t i = 0; i < w.cols; ++i) sum += static_cast<double>(row[i]) * x[i];
    y[r] = static_cast<float>(sum);
  }
}

void DequantizeRows(const WeightView& w, int64_t first, int64_t count, float* out) {
  HWY_DYNAMIC_DISPATCH(DequantizeRowsImpl)(w, first, count, out);
}

void Embed(const WeightView& table, const int32_t* ids, int64_t n, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    HWY_DYNAMIC_DISPATCH(DequantizeRowsImpl)(table, ids[t], 1, out + t * table.cols);
  }
}

void EmbedRef(const WeightView& table, const int32_t* ids, int64_t n, float* out) {
  for (int64_t t = 0; t < n; ++t) DequantizeRowRef(table, ids[t], out + t * table.cols);
}

}  // namespace kvq::ops
#endif  // HWY_ONCE
