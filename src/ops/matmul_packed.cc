// Highway kernel for MatmulPacked (matmul.h): register-blocked GEMM over
// weight panels decoded to f32 once per call. Compiled once per SIMD target
// through foreach_target.h; the HWY_ONCE section holds the dispatcher.
//
// Why this shape (measured in bench/ops_bench.cc, see docs/benchmarks.md):
// the 4-row x 4-token dot-product tiles of MatvecBatch decode every weight
// vector again for every 64 tokens, spend one load per FMA pair and end in a
// horizontal sum per output; at n = 512 they ran at 0.4-0.7 of OpenBLAS f32
// sgemm's speed. Here a panel of kPanelRows weight rows x kDepth columns is
// decoded (and transposed) into an L1-resident f32 buffer once, then reused
// for every token: each k step loads kTileVecs weight vectors and broadcasts
// kTileTokens activations into kTileTokens x kTileVecs accumulators, which
// hold whole output vectors (y is [n, rows], rows contiguous), so there is
// no horizontal reduction and no conversion in the inner loop (0.85-1.13 of
// sgemm). Activations are repacked once per call so each tile streams one
// contiguous run; the next weight block is prefetched while a block is in
// use, since a model's weights come from DRAM.

#include <algorithm>
#include <cstring>

#include "base/fp16.h"
#include "ops/matmul.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/matmul_packed.cc"
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

constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(DF()));

// Tile = kTileTokens tokens x kTileVecs vectors of output rows. Register
// budget: tokens * vecs accumulators + vecs weight vectors + 1 broadcast
// must fit the register file (32 on AVX-512, 16 below) without spilling.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kTileTokens = 6;
constexpr int kTileVecs = 4;
#else
// 6 x 2 on AVX2 (12 + 2 + 1 = 15 of 16 registers), the shape of BLIS's
// Haswell kernel: against 4 x 2, each broadcast and weight load feeds more
// FMAs and 12 independent accumulators hide the FMA latency with slack.
// Measured 1.09x pp512 on Qwen2.5-Coder-0.5B (docs/benchmarks.md, session 20).
constexpr int kTileTokens = 6;
constexpr int kTileVecs = 2;
#endif
constexpr int64_t kPanelRows = kTileVecs * kLanes;

// Fully unrolls the tile's loops over tokens and vectors before GCC's
// scalar replacement runs, so the accumulator array lives in registers
// instead of being copied through the stack around the k loop.
#if defined(__clang__)
#define KVQ_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define KVQ_UNROLL _Pragma("GCC unroll 32")
#else
#define KVQ_UNROLL
#endif

// Columns per decoded panel: kPanelRows * kDepth f32 = 32 KiB on AVX-512,
// which stays in the 48 KiB L1 next to the activation lines being streamed.
// A multiple of the Q8_0 block so a panel never splits a block.
constexpr int64_t kDepth = 128;
static_assert(kDepth % kQ8_0BlockSize == 0, "panels must not split Q8_0 blocks");
static_assert(kDepth % kQBlock == 0, "panels must not split decoder groups");

// out[depth] = row r of w, columns [k0, k0 + depth), decoded to f32 (exact).
void DecodeSegment(const WeightView& w, int64_t r, int64_t k0, int64_t depth,
                   float* HWY_RESTRICT out) {
  const DF df;
  const uint8_t* row = w.row(r);
  switch (w.type) {
    default:
      // Groups of 32 (k0 and depth are multiples of 32; K-quant super-blocks
      // are entered at any of their eight groups).
      qd::VisitGroupDecoder(w.type, [&](auto dec) HWY_ATTR {
        qd::DecodeGroups<decltype(dec)>(df, row, k0 / kQBlock, depth / kQBlock,
                                        [&](int64_t j, VF v)
                                            HWY_ATTR { hn::StoreU(v, df, out + j); });
      });
      return;
    case WeightType::kF32:
      std::memcpy(out, reinterpret_cast<const float*>(row) + k0,
                  static_cast<size_t>(depth) * sizeof(float));
      return;
    case WeightType::kF16: {
      const hn::Rebind<hwy::float16_t, DF> dh;
      const auto* src = reinterpret_cast<const hwy::float16_t*>(row) + k0;
      int64_t i = 0;
      for (; i + kLanes <= depth; i += kLanes) {
        hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, src + i)), df, out + i);
      }
      const auto* bits = reinterpret_cast<const uint16_t*>(row) + k0;
      for (; i < depth; ++i) out[i] = F16ToF32(bits[i]);
      return;
    }
    case WeightType::kBF16: {
      const hn::Rebind<hwy::bfloat16_t, DF> dh;
      const auto* src = reinterpret_cast<const hwy::bfloat16_t*>(row) + k0;
      int64_t i = 0;
      for (; i + kLanes <= depth; i += kLanes) {
        hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, src + i)), df, out + i);
      }
      const auto* bits = reinterpret_cast<const uint16_t*>(row) + k0;
      for (; i < depth; ++i) out[i] = Bf16ToF32(bits[i]);
      return;
    }
    case WeightType::kQ8_0: {
      // k0 and depth are multiples of 32 (kDepth is; Q8_0 cols are).
      const hn::Rebind<int32_t, DF> di32;
      const hn::Rebind<int8_t, DF> di8;
      const auto* blocks = reinterpret_cast<const BlockQ8_0*>(row) + k0 / kQ8_0BlockSize;
      for (int64_t b = 0; b < depth / kQ8_0BlockSize; ++b) {
        // d * q is exact in f32 (11 + 8 significant bits), as in MatmulRef.
        const VF d = hn::Set(df, F16ToF32(blocks[b].d));
        for (int64_t j = 0; j < kQ8_0BlockSize; j += kLanes) {
          const VF q = hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(di8, blocks[b].q + j)));
          hn::StoreU(hn::Mul(d, q), df, out + b * kQ8_0BlockSize + j);
        }
      }
      return;
    }
  }
}

// panel[depth, kPanelRows] = rows [r0, r0 + valid) x columns [k0, k0 + depth)
// of w, transposed, f32; rows past `valid` are zero so the tile can compute
// whole vectors (their outputs are discarded). kLanes rows at a time are
// decoded into `rows` and transposed by gathers (one vector of the panel per
// gather); with one scalar store per weight instead, packing dominated small
// batches (n = 16 ran at half the speed it does now).
void PackPanel(const WeightView& w, int64_t r0, int64_t valid, int64_t k0, int64_t depth,
               float* HWY_RESTRICT panel) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  HWY_ALIGN float rows[kLanes * kDepth];  // [kLanes, kDepth] decoded row segments
  const auto stride = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(kDepth)));
  for (int64_t rb = 0; rb < kPanelRows; rb += kLanes) {
    for (int64_t r = 0; r < kLanes; ++r) {
      if (rb + r < valid) {
        DecodeSegment(w, r0 + rb + r, k0, depth, rows + r * kDepth);
      } else {
        std::fill_n(rows + r * kDepth, depth, 0.0f);
      }
    }
    for (int64_t k = 0; k < depth; ++k) {
      hn::Store(hn::GatherIndex(df, rows + k, stride), df, panel + k * kPanelRows + rb);
    }
  }
}

// Bytes [begin, end) of one weight row that columns [k0, k0 + depth) occupy.
struct ByteRange {
  int64_t begin, end;
};
ByteRange SegmentBytes(WeightType type, int64_t k0, int64_t depth) {
  const int64_t block = BlockSize(type), bytes = BlockBytes(type);
  return {k0 / block * bytes, (k0 + depth + block - 1) / block * bytes};
}

// The weight block PackPanel reads after the current one, prefetched a few
// rows per tile while the current block is being multiplied: the block's
// rows are short segments of different rows (64 x 256 bytes for F16), which
// the hardware prefetcher does not follow, and every call reads its weights
// from DRAM (a model's weights do not fit in cache).
struct NextBlock {
  const uint8_t* first_row = nullptr;  // nullptr: nothing to prefetch
  int64_t rows = 0, row_bytes = 0;
  ByteRange bytes{0, 0};
  int64_t next_row = 0;  // rows already prefetched

  void PrefetchRows(int64_t count) {
    for (; count > 0 && next_row < rows; --count, ++next_row) {
      const uint8_t* row = first_row + next_row * row_bytes;
      for (int64_t b = bytes.begin; b < bytes.end; b += 64) hwy::Prefetch(row + b);
    }
  }
};

// c[T, kPanelRows] (+)= xp[depth, kTileTokens] · panel[depth, kPanelRows] for the
// first T <= kTileTokens packed tokens; c rows are ldc apart. `accumulate`
// adds to c (a later depth block), otherwise c is overwritten.
template <int T>
HWY_INLINE void Tile(const float* HWY_RESTRICT panel, int64_t depth, const float* HWY_RESTRICT xp,
                     float* HWY_RESTRICT c, int64_t ldc, bool accumulate) {
  const DF df;
  VF acc[T * kTileVecs];
  if (accumulate) {
    KVQ_UNROLL
    for (int t = 0; t < T; ++t) {
      KVQ_UNROLL
      for (int v = 0; v < kTileVecs; ++v) {
        acc[t * kTileVecs + v] = hn::LoadU(df, c + t * ldc + v * kLanes);
      }
    }
  } else {
    KVQ_UNROLL
    for (int a = 0; a < T * kTileVecs; ++a) acc[a] = hn::Zero(df);
  }
  for (int64_t k = 0; k < depth; ++k) {
    const float* p = panel + k * kPanelRows;
    VF wv[kTileVecs];
    KVQ_UNROLL
    for (int v = 0; v < kTileVecs; ++v) wv[v] = hn::Load(df, p + v * kLanes);
    KVQ_UNROLL
    for (int t = 0; t < T; ++t) {
      const VF xb = hn::Set(df, xp[k * kTileTokens + t]);
      KVQ_UNROLL
      for (int v = 0; v < kTileVecs; ++v) {
        acc[t * kTileVecs + v] = hn::MulAdd(wv[v], xb, acc[t * kTileVecs + v]);
      }
    }
  }
  KVQ_UNROLL
  for (int t = 0; t < T; ++t) {
    KVQ_UNROLL
    for (int v = 0; v < kTileVecs; ++v) {
      hn::StoreU(acc[t * kTileVecs + v], df, c + t * ldc + v * kLanes);
    }
  }
}

// Out of line so each token count gets its own register allocation.
template <int T>
HWY_NOINLINE void TileT(const float* HWY_RESTRICT panel, int64_t depth,
                        const float* HWY_RESTRICT xp, float* HWY_RESTRICT c, int64_t ldc,
                        bool accumulate) {
  Tile<T>(panel, depth, xp, c, ldc, accumulate);
}

// TileT<T> for T = tokens (1 <= tokens <= kTileTokens).
template <int T = kTileTokens>
HWY_INLINE void RunTile(int64_t tokens, const float* HWY_RESTRICT panel, int64_t depth,
                        const float* HWY_RESTRICT xp, float* HWY_RESTRICT c, int64_t ldc,
                        bool accumulate) {
  if constexpr (T > 1) {
    if (tokens < T) return RunTile<T - 1>(tokens, panel, depth, xp, c, ldc, accumulate);
  }
  TileT<T>(panel, depth, xp, c, ldc, accumulate);
}

// Packed activations: token group g (tokens [g * kTileTokens, ...)) of
// depth block k0 starts at XpOffset and holds [depth, kTileTokens], so one
// tile streams one contiguous run and a whole depth block (all groups) is
// contiguous too.
int64_t XpOffset(int64_t groups, int64_t k0, int64_t depth, int64_t g) {
  return (k0 * groups + g * depth) * kTileTokens;
}

// Packs token group g of x[n, cols]; tokens past n are zero. A full group
// is interleaved by gathers: kLanes consecutive columns of its kTileTokens
// rows fill exactly kTileTokens vectors of the packed run, whose lanes come
// from fixed offsets (lane p: token p % kTileTokens, column p / kTileTokens).
void PackTokens(const float* HWY_RESTRICT x, int64_t n, int64_t cols, int64_t groups, int64_t g,
                float* HWY_RESTRICT xp) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const int64_t t0 = g * kTileTokens;
  const int64_t tokens = std::min<int64_t>(kTileTokens, n - t0);
  HWY_ALIGN int32_t offsets[kTileTokens * kLanes];  // [kTileTokens vectors, kLanes]
  for (int64_t p = 0; p < kTileTokens * kLanes; ++p) {
    offsets[p] = static_cast<int32_t>(p % kTileTokens * cols + p / kTileTokens);
  }
  for (int64_t k0 = 0; k0 < cols; k0 += kDepth) {
    const int64_t depth = std::min(kDepth, cols - k0);
    const float* src = x + t0 * cols + k0;             // [tokens, cols] from column k0
    float* dst = xp + XpOffset(groups, k0, depth, g);  // [depth, kTileTokens]
    int64_t k = 0;
    if (tokens == kTileTokens) {
      for (; k + kLanes <= depth; k += kLanes) {
        for (int64_t j = 0; j < kTileTokens; ++j) {
          const auto idx = hn::Load(di, offsets + j * kLanes);
          hn::StoreU(hn::GatherIndex(df, src + k, idx), df, dst + k * kTileTokens + j * kLanes);
        }
      }
    }
    for (; k < depth; ++k) {
      for (int64_t t = 0; t < kTileTokens; ++t) {
        dst[k * kTileTokens + t] = t < tokens ? src[t * cols + k] : 0.0f;
      }
    }
  }
}

// Outputs y[:, r0 : r0 + valid) for all n tokens, one depth block at a time.
// The [n, kPanelRows] block of y being accumulated (128 KiB at n = 512)
// stays in L2 across the depth blocks. `next_panel` is the panel this
// thread probably does next (prefetched during the last depth block).
void PanelColumns(const WeightView& w, const float* HWY_RESTRICT xp, int64_t n,
                  float* HWY_RESTRICT y, int64_t r0, int64_t next_panel,
                  float* HWY_RESTRICT panel) {
  const int64_t valid = std::min(kPanelRows, w.rows - r0);
  const int64_t groups = (n + kTileTokens - 1) / kTileTokens;
  HWY_ALIGN float edge[kTileTokens * kPanelRows];  // [kTileTokens, kPanelRows] partial panels
  for (int64_t k0 = 0; k0 < w.cols; k0 += kDepth) {
    const int64_t depth = std::min(kDepth, w.cols - k0);
    const bool accumulate = k0 > 0;
    PackPanel(w, r0, valid, k0, depth, panel);
    NextBlock next;
    if (k0 + kDepth < w.cols) {
      next = {w.row(r0), valid, w.row_bytes(),
              SegmentBytes(w.type, k0 + kDepth, std::min(kDepth, w.cols - k0 - kDepth))};
    } else if (next_panel * kPanelRows < w.rows) {
      next = {w.row(next_panel * kPanelRows),
              std::min(kPanelRows, w.rows - next_panel * kPanelRows), w.row_bytes(),
              SegmentBytes(w.type, 0, std::min(kDepth, w.cols))};
    }
    const int64_t rows_per_tile = (next.rows + groups - 1) / groups;
    for (int64_t g = 0; g < groups; ++g) {
      next.PrefetchRows(rows_per_tile);
      const int64_t tokens = std::min<int64_t>(kTileTokens, n - g * kTileTokens);
      const float* xt = xp + XpOffset(groups, k0, depth, g);
      float* yt = y + g * kTileTokens * w.rows + r0;
      if (valid == kPanelRows) {
        RunTile(tokens, panel, depth, xt, yt, w.rows, accumulate);
        continue;
      }
      // Last, partial panel: compute whole vectors into `edge`, keep `valid`.
      for (int64_t t = 0; t < tokens && accumulate; ++t) {
        std::memcpy(edge + t * kPanelRows, yt + t * w.rows, static_cast<size_t>(valid) * 4);
      }
      RunTile(tokens, panel, depth, xt, edge, kPanelRows, accumulate);
      for (int64_t t = 0; t < tokens; ++t) {
        std::memcpy(yt + t * w.rows, edge + t * kPanelRows, static_cast<size_t>(valid) * 4);
      }
    }
  }
}

// Bytes a panel is aligned to (a cache line; aligned vector loads).
constexpr uintptr_t kPanelAlign = 64;

void MatmulPackedImpl(const WeightView& w, const float* HWY_RESTRICT x, int64_t n,
                      float* HWY_RESTRICT y, ThreadPool& pool, MatmulWorkspace* workspace) {
  const int64_t panels = (w.rows + kPanelRows - 1) / kPanelRows;
  const int64_t groups = (n + kTileTokens - 1) / kTileTokens;
  const int threads =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(pool.size(), panels)));
  workspace->Reserve(threads, kPanelRows * kDepth + kPanelAlign / sizeof(float));
  float* xp = workspace->Shared(groups * kTileTokens * w.cols);  // packed x, see XpOffset
  pool.ForEach(
      groups, Schedule::kStatic,
      [&](int64_t g, int) HWY_ATTR { PackTokens(x, n, w.cols, groups, g, xp); }, threads);
  // Dynamic: a panel is ~0.5 ms of work at n = 512, and on a shared
  // machine a thread that loses its core should not hold up the others.
  pool.ForEach(
      panels, Schedule::kDynamic,
      [&](int64_t p, int thread) HWY_ATTR {
        float* raw = workspace->panel(thread);
        float* panel = reinterpret_cast<float*>(
            (reinterpret_cast<uintptr_t>(raw) + kPanelAlign - 1) & ~uintptr_t{kPanelAlign - 1});
        PanelColumns(w, xp, n, y, p * kPanelRows, p + 1, panel);
      },
      threads);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::ops {

HWY_EXPORT(MatmulPackedImpl);

void MatmulPacked(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool,
                  MatmulWorkspace* workspace) {
  HWY_DYNAMIC_DISPATCH(MatmulPackedImpl)(w, x, n, y, pool, workspace);
}

}  // namespace kvq::ops
#endif  // HWY_ONCE
