#include "ops/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "ops/matvec.h"
#include "ops/matvec_int8.h"

namespace kvq::ops {
namespace {

// Rows per thread block are a multiple of this, so sgemm sees aligned,
// reasonably wide N dimensions.
constexpr int64_t kRowQuantum = 16;

// A decoded panel of ~512 KiB stays in this machine's 1 MiB L2 while sgemm
// packs it, leaving room for the packed X block.
constexpr int64_t kPanelBytes = int64_t{512} << 10;

// Y[:, r0:r0+count] = X · W[r0:r0+count]ᵀ, with W rows given as f32 `wf`
// [count, cols]; ldy = total rows of W.
void SgemmBlock(const float* x, int64_t n, int64_t cols, const float* wf, int64_t count, float* y,
                int64_t ldy) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(n),
              static_cast<blasint>(count), static_cast<blasint>(cols), 1.0f, x,
              static_cast<blasint>(cols), wf, static_cast<blasint>(cols), 0.0f, y,
              static_cast<blasint>(ldy));
}

}  // namespace

void MatmulWorkspace::Reserve(int threads, int64_t floats) {
  if (panels_.size() < static_cast<size_t>(threads)) panels_.resize(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    auto& p = panels_[static_cast<size_t>(t)];
    if (static_cast<int64_t>(p.size()) < floats) p.resize(static_cast<size_t>(floats));
  }
}

float* MatmulWorkspace::Shared(int64_t floats) {
  if (static_cast<int64_t>(shared_.size()) < floats) shared_.resize(static_cast<size_t>(floats));
  return shared_.data();
}

uint8_t* MatmulWorkspace::SharedBytes(int64_t bytes) {
  if (static_cast<int64_t>(shared_bytes_.size()) < bytes) {
    shared_bytes_.resize(static_cast<size_t>(bytes));
  }
  return shared_bytes_.data();
}

int64_t MatmulWorkspace::bytes() const {
  int64_t total = static_cast<int64_t>(shared_.size() * sizeof(float) + shared_bytes_.size());
  for (const auto& p : panels_) total += static_cast<int64_t>(p.size() * sizeof(float));
  return total;
}

int64_t MatmulPanelRows(int64_t cols) {
  const int64_t rows = kPanelBytes / (cols * static_cast<int64_t>(sizeof(float)));
  return std::max(kRowQuantum, rows / kRowQuantum * kRowQuantum);
}

bool Int8DotIsFaster(WeightType type) {
  switch (type) {
    case WeightType::kIQ4_NL:
    case WeightType::kQ2_K:
    case WeightType::kQ3_K:
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
    case WeightType::kQ6_K:
      return true;
    default:
      return false;
  }
}

int64_t PackedMinTokens(WeightType type, DecodeArith arith) {
  if (arith != DecodeArith::kInt8Dot) return kPackedMinTokens;
  if (type == WeightType::kQ4_K) return 48;
  if (type == WeightType::kQ6_K) return 64;
  return kPackedMinTokens;
}

void Matmul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool,
            MatmulWorkspace* workspace, DecodeArith arith) {
  if (n >= PackedMinTokens(w.type, arith)) {
    MatmulPacked(w, x, n, y, pool, workspace);
  } else {
    MatmulRowwise(w, x, n, y, pool, workspace, arith);
  }
}

void MatmulRowwise(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool,
                   MatmulWorkspace* workspace, DecodeArith arith) {
  if (arith == DecodeArith::kInt8Dot && Int8DotIsFaster(w.type)) {
    const int64_t bytes = n * Int8ActRowBytes(w.type, w.cols);
    std::vector<uint8_t> local;
    uint8_t* acts = workspace != nullptr ? workspace->SharedBytes(bytes) : nullptr;
    if (acts == nullptr) {
      local.resize(static_cast<size_t>(bytes));
      acts = local.data();
    }
    QuantizeActs(w.type, x, n, w.cols, acts);
    MatvecInt8(w, acts, n, y, pool);
  } else {
    MatvecBatch(w, x, n, y, pool);
  }
}

void MatmulSgemm(const WeightView& w, const float* x, int64_t n, float* y, int num_threads,
                 MatmulWorkspace* workspace) {
  // Contiguous row blocks, one per thread, each a multiple of kRowQuantum.
  const int64_t quanta = (w.rows + kRowQuantum - 1) / kRowQuantum;
  const int threads =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, quanta)));
  const int64_t panel_rows = MatmulPanelRows(w.cols);
  if (w.type != WeightType::kF32) workspace->Reserve(threads, panel_rows * w.cols);

#pragma omp parallel num_threads(threads)
  {
    // OpenBLAS (OpenMP build) runs single-threaded when the caller's
    // nthreads ICV is 1. Setting it here changes only this implicit task's
    // ICV, so the threads=1 case does not let sgemm fan out either.
    omp_set_num_threads(1);
    const int t = omp_get_thread_num();
    const int64_t per = (quanta + threads - 1) / threads;
    const int64_t r0 = std::min(w.rows, t * per * kRowQuantum);
    const int64_t r1 = std::min(w.rows, (t + 1) * per * kRowQuantum);
    if (w.type == WeightType::kF32) {
      if (r1 > r0) {
        SgemmBlock(x, n, w.cols, reinterpret_cast<const float*>(w.row(r0)), r1 - r0, y + r0,
                   w.rows);
      }
    } else {
      float* panel = workspace->panel(t);  // [panel_rows, cols]
      for (int64_t p = r0; p < r1; p += panel_rows) {
        const int64_t count = std::min(panel_rows, r1 - p);
        DequantizeRows(w, p, count, panel);
        SgemmBlock(x, n, w.cols, panel, count, y + p, w.rows);
      }
    }
  }
}

void MatmulRef(const WeightView& w, const float* x, int64_t n, float* y) {
  for (int64_t t = 0; t < n; ++t) MatvecRef(w, x + t * w.cols, y + t * w.rows);
}

}  // namespace kvq::ops
