// Matrix-matrix products for prefill and batched decode:
//   Y[n, w.rows] = X[n, w.cols] · W[w.rows, w.cols]ᵀ
// Three implementations, one policy (Matmul):
//  - MatvecBatch (matvec.h): Highway dot-product tiles that decode W on the
//    fly (4 rows x 4 tokens); best for small n (decode, short batches);
//  - MatmulPacked (matmul_packed.cc): register-blocked Highway GEMM over
//    weight panels decoded to f32 once per call; best from ~32 tokens;
//  - MatmulSgemm: OpenBLAS sgemm, fed F16/BF16/Q8_0 weights one decoded
//    row panel at a time (kept as a comparison baseline; it alone still
//    runs its threads through OpenMP, which OpenBLAS's build shares).
// Measured (bench/ops_bench.cc, docs/benchmarks.md; CPU-time GFLOP/s on
// the shared 2-core VM): at n = 512 MatmulPacked is 1.5-2.4x MatvecBatch
// and 0.85-1.1x OpenBLAS f32 sgemm at the same shape (with OpenBLAS forced
// to its AVX-512 kernels; this CPU is unknown to OpenBLAS 0.3.21, which
// falls back to SSE3 "Prescott" kernels, 3-5x slower than that here). The two Highway
// paths tie at n = 32 for every type, so Matmul switches there, f32
// included.
#pragma once

#include <cstdint>
#include <vector>

#include "base/thread_pool.h"
#include "ops/weights.h"

namespace kvq::ops {

// Scratch panels for MatmulSgemm, one per thread. Owned by the caller (one per
// inference context) so repeated calls reuse warm memory instead of paying
// for fresh pages every layer. Not shareable between concurrent calls.
class MatmulWorkspace {
 public:
  MatmulWorkspace() = default;
  MatmulWorkspace(const MatmulWorkspace&) = delete;
  MatmulWorkspace& operator=(const MatmulWorkspace&) = delete;

  // Makes sure threads [0, threads) each own at least `floats` floats.
  void Reserve(int threads, int64_t floats);
  // Thread t's panel; valid after Reserve(> t, ...).
  float* panel(int thread) { return panels_[static_cast<size_t>(thread)].data(); }
  // One buffer of at least `floats` floats shared by all threads of a call
  // (MatmulPacked's repacked activations).
  float* Shared(int64_t floats);
  // At least `bytes` bytes shared by all threads of a call (quantized
  // activation rows of the integer path).
  uint8_t* SharedBytes(int64_t bytes);
  // Total bytes held (for memory accounting).
  int64_t bytes() const;

 private:
  std::vector<std::vector<float>> panels_;  // [threads][floats]
  std::vector<float> shared_;               // [floats]
  std::vector<uint8_t> shared_bytes_;       // [bytes]
};

// Batches of at least this many tokens go to MatmulPacked, smaller ones to
// MatvecBatch or the integer path, on every weight type (the floor of
// PackedMinTokens).
inline constexpr int64_t kPackedMinTokens = 32;

// The arithmetic of the small-n (decode) products on block-quantized
// weights.
enum class DecodeArith : uint8_t {
  // The integer path (matvec_int8.h: x quantized to 8 bits per block,
  // ggml's q8_0 / q8_1 / q8_K, then integer dot products, llama.cpp's
  // arithmetic) on the types where it is measured faster than the f32 path
  // (Int8DotIsFaster), the f32 path on the others.
  kInt8Dot,
  // x kept in f32, W decoded exactly (matvec.h): the product of the stored
  // weights' f32 values, the truth the f32 reference paths compare with.
  kExactF32,
};

// The types whose integer-dot matvec beat the exact f32 one in one locked
// ops_bench run (2026-12-02, ops/matvec.h; L2-resident Gweights/s, one
// core): IQ4_NL 22.1 vs 3.3, Q3_K 10.9 vs 7.8, Q6_K 23.3 vs 16.6, Q4_K 20.5
// vs 20.0, Q2_K 18.2 vs 18.0. Since the K-quants' integer kernels take
// their scales in vpmaddwd (2026-12-07, docs/bench/kquant-dot-s38/builds,
// two rounds on an idle 2-vCPU Intel Xeon VM at 2.3 GHz, where the f32
// kernels ran at about half of 2026-12-02's AMD EPYC figures) every K
// type's integer path is 2.2-3.0x its f32 path,
// Q5_K included (18.1 vs 6.1), so Q5_K joined. Not (yet) the others, whose
// f32 kernels were as fast or faster on 2026-12-02: Q8_0 20.0 vs 31.1, Q4_1
// 22.6 vs 25.2, Q5_0 18.9 vs 20.7, Q5_1 18.1 vs 19.1, Q4_0 19.5 vs 20.8
// (on 2026-12-07's machine Q8_0's integer path was 1.3x its f32 path;
// switching a type changes the decode arithmetic of the models that use
// it, so it waits for a run on more than one machine).
bool Int8DotIsFaster(WeightType type);

// The row count from which Matmul takes MatmulPacked for `type` under
// `arith`: kPackedMinTokens, but on the integer path 48 for Q4_K and 64 for
// Q6_K. One thread, best of 12 (docs/bench/packed-crossover-s20/): the
// 4-token integer tiles (matvec_int8.cc) ran Q4_K 1.37x the packed GEMM at
// 32 rows and even at 48; Q6_K 1.56x at 32 and still 1.23x at 64, the most
// measured.
int64_t PackedMinTokens(WeightType type, DecodeArith arith);

// y[n, w.rows] = x[n, w.cols] · Wᵀ, choosing the implementation as above;
// below PackedMinTokens, the types of Int8DotIsFaster take the integer
// path when `arith` is kInt8Dot. x and y must not overlap.
// `workspace` holds MatmulPacked's buffers and the quantized activations;
// it may be null only when n < kPackedMinTokens (the integer path then
// allocates its activation rows).
void Matmul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool,
            MatmulWorkspace* workspace, DecodeArith arith);

// Matmul's small-n path for every n: each of the n rows of y bit for bit as
// Matmul gives it for that row alone (n = 1), whichever rows share the call.
// A decode step that takes it gives each sequence the logits it would get
// decoded alone (batch invariance), at the cost of MatmulPacked's speed from
// PackedMinTokens rows on. `workspace` may be null (the integer path then
// allocates its activation rows).
void MatmulRowwise(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool,
                   MatmulWorkspace* workspace, DecodeArith arith);

// Always sgemm (panels for non-F32 types, decoded into `workspace`, which
// F32 does not touch). The output rows are split into
// contiguous column blocks of y, one per thread; inside a block OpenBLAS runs
// single-threaded so the two thread pools never oversubscribe the cores.
void MatmulSgemm(const WeightView& w, const float* x, int64_t n, float* y, int num_threads,
                 MatmulWorkspace* workspace);

// Register-blocked GEMM (matmul_packed.cc): weight panels decoded to f32
// once per call into `workspace` (one small panel per thread), then reused
// for every token. Any n >= 1; f32 accumulation, same error bound as Matvec.
void MatmulPacked(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool,
                  MatmulWorkspace* workspace);

// Scalar twin: n independent MatvecRef calls.
void MatmulRef(const WeightView& w, const float* x, int64_t n, float* y);

// Rows of W decoded per panel for a given row length (exposed for the
// benchmark and tests, which exercise panel boundaries).
int64_t MatmulPanelRows(int64_t cols);

}  // namespace kvq::ops
