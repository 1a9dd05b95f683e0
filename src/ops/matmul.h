// Matrix-matrix products for prefill and batched decode:
//   Y[n, w.rows] = X[n, w.cols] · W[w.rows, w.cols]ᵀ
// Two implementations, one policy (Matmul):
//  - MatvecBatch (matvec.h): Highway tiles that decode W on the fly;
//  - MatmulSgemm: OpenBLAS sgemm, fed F16/BF16/Q8_0 weights one decoded
//    row panel at a time from a per-thread scratch panel (never a whole
//    converted matrix).
// Measured on this machine (bench/ops_bench.cc, docs/benchmarks.md), the
// Highway tiles beat panel+sgemm for every decoded type at every n tried
// (1.1-1.8x at n = 64..512: sgemm pays for decoding and then packing the
// panel again; 2-7x for n <= 8), and beat sgemm on F32 up to n = 8 while
// tying it from n = 64; F32 batches above 16 tokens go to sgemm.
#pragma once

#include <cstdint>
#include <vector>

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
  // Total bytes held (for memory accounting).
  int64_t bytes() const;

 private:
  std::vector<std::vector<float>> panels_;  // [threads][floats]
};

// F32 batches up to this many tokens go to MatvecBatch, larger to sgemm.
inline constexpr int64_t kF32SgemmMinTokens = 17;

// y[n, w.rows] = x[n, w.cols] · Wᵀ, choosing the implementation as above.
// x and y must not overlap. `workspace` holds sgemm panels should the
// routing send a decoded type to sgemm (today it never does; may be null).
void Matmul(const WeightView& w, const float* x, int64_t n, float* y, int num_threads,
            MatmulWorkspace* workspace);

// Always sgemm (panels for non-F32 types, decoded into `workspace`, which
// F32 does not touch). The output rows are split into
// contiguous column blocks of y, one per thread; inside a block OpenBLAS runs
// single-threaded so the two thread pools never oversubscribe the cores.
void MatmulSgemm(const WeightView& w, const float* x, int64_t n, float* y, int num_threads,
                 MatmulWorkspace* workspace);

// Scalar twin: n independent MatvecRef calls.
void MatmulRef(const WeightView& w, const float* x, int64_t n, float* y);

// Rows of W decoded per panel for a given row length (exposed for the
// benchmark and tests, which exercise panel boundaries).
int64_t MatmulPanelRows(int64_t cols);

}  // namespace kvq::ops
