// Fast Walsh-Hadamard rotation, compiled once per Highway target, and its
// explicit-matrix reference twin.
#include "kv/hadamard.h"

#include <cmath>
#include <string>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/hadamard.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// In-place unnormalized transform of one row: the stages with stride h pair
// element j with j + h (a, b) -> (a + b, a - b). Strides below the vector
// width work inside a register: lane i meets lane i ^ h through a
// permutation, lanes with bit h set take (partner - self) = a - b.
template <class D>
HWY_INLINE void FwhtRow(D d, float* HWY_RESTRICT x, int64_t dim) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const hn::RebindToSigned<D> di;
  const auto iota = hn::Iota(di, 0);
  for (int64_t i = 0; i < dim; i += lanes) {
    auto v = hn::LoadU(d, x + i);
    for (int64_t h = 1; h < lanes; h *= 2) {
      const auto hv = hn::Set(di, static_cast<int32_t>(h));
      const auto partner = hn::TableLookupLanes(v, hn::IndicesFromVec(d, hn::Xor(iota, hv)));
      v = hn::IfThenElse(hn::RebindMask(d, hn::TestBit(iota, hv)), hn::Sub(partner, v),
                         hn::Add(v, partner));
    }
    hn::StoreU(v, d, x + i);
  }
  for (int64_t h = lanes; h < dim; h *= 2) {
    for (int64_t block = 0; block < dim; block += 2 * h) {
      for (int64_t j = block; j < block + h; j += lanes) {
        const auto a = hn::LoadU(d, x + j);
        const auto b = hn::LoadU(d, x + j + h);
        hn::StoreU(hn::Add(a, b), d, x + j);
        hn::StoreU(hn::Sub(a, b), d, x + j + h);
      }
    }
  }
}

// Forward: row = (H · (signs ⊙ row)) · norm. Inverse (Rᵀ = D · H / sqrt(dim)):
// row = signs ⊙ (H · row) · norm. signs: [dim].
void HadamardImpl(float* HWY_RESTRICT x, int64_t n, int64_t dim, const float* HWY_RESTRICT signs,
                  float norm, bool inverse) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t t = 0; t < n; ++t) {
    float* row = x + t * dim;
    if (dim < lanes) {  // too short for a full vector: scalar butterflies
      if (!inverse) {
        for (int64_t i = 0; i < dim; ++i) row[i] *= signs[i];
      }
      for (int64_t h = 1; h < dim; h *= 2) {
        for (int64_t block = 0; block < dim; block += 2 * h) {
          for (int64_t j = block; j < block + h; ++j) {
            const float a = row[j], b = row[j + h];
            row[j] = a + b;
            row[j + h] = a - b;
          }
        }
      }
      for (int64_t i = 0; i < dim; ++i) row[i] *= inverse ? signs[i] * norm : norm;
      continue;
    }
    if (!inverse) {
      for (int64_t i = 0; i < dim; i += lanes) {
        hn::StoreU(hn::Mul(hn::LoadU(d, row + i), hn::LoadU(d, signs + i)), d, row + i);
      }
    }
    FwhtRow(d, row, dim);
    const auto vnorm = hn::Set(d, norm);
    for (int64_t i = 0; i < dim; i += lanes) {
      auto factor = vnorm;
      if (inverse) factor = hn::Mul(factor, hn::LoadU(d, signs + i));  // exact: signs are +-1
      hn::StoreU(hn::Mul(hn::LoadU(d, row + i), factor), d, row + i);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq {

HWY_EXPORT(HadamardImpl);

namespace {

// splitmix64's output function: a stateless, well-mixed hash of i.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr uint64_t kSignSeed = 0x6B7671486164616Dull;  // fixed forever: stored caches depend on it

Status Run(float* x, int64_t n, int64_t dim, bool inverse) {
  KVQ_RETURN_IF_ERROR(CheckHadamardDim(dim));
  if (n < 0) return Status::Error("Hadamard rotation: negative row count " + std::to_string(n));
  // The signs are recomputed per call (no global state); head_dims up to
  // 1024 keep them on the stack, so a decode step allocates nothing.
  constexpr int64_t kStackDim = 1024;
  float stack_signs[kStackDim];
  std::vector<float> heap_signs(dim > kStackDim ? static_cast<size_t>(dim) : 0);
  float* signs = dim > kStackDim ? heap_signs.data() : stack_signs;  // [dim]
  for (int64_t i = 0; i < dim; ++i) signs[i] = HadamardSign(i);
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
  HWY_DYNAMIC_DISPATCH(HadamardImpl)(x, n, dim, signs, norm, inverse);
  return Status::Ok();
}

Status RunRef(float* x, int64_t n, int64_t dim, bool inverse) {
  KVQ_RETURN_IF_ERROR(CheckHadamardDim(dim));
  if (n < 0) return Status::Error("Hadamard rotation: negative row count " + std::to_string(n));
  const double norm = 1.0 / std::sqrt(static_cast<double>(dim));
  // R[i][j] = (-1)^popcount(i & j) * sign(j) / sqrt(dim).
  auto r = [&](int64_t i, int64_t j) {
    const double h = (__builtin_popcountll(static_cast<uint64_t>(i & j)) & 1) ? -1.0 : 1.0;
    return h * HadamardSign(j) * norm;
  };
  std::vector<double> in(static_cast<size_t>(dim));  // [dim]
  for (int64_t t = 0; t < n; ++t) {
    float* row = x + t * dim;
    for (int64_t i = 0; i < dim; ++i) in[i] = row[i];
    for (int64_t i = 0; i < dim; ++i) {
      double sum = 0.0;
      for (int64_t j = 0; j < dim; ++j) sum += (inverse ? r(j, i) : r(i, j)) * in[j];
      row[i] = static_cast<float>(sum);
    }
  }
  return Status::Ok();
}

Status CheckBlocks(int64_t n, int64_t dim, int64_t block) {
  KVQ_RETURN_IF_ERROR(CheckHadamardDim(block));
  if (n < 0 || dim <= 0 || dim % block != 0) {
    return Status::Error("Walsh-Hadamard blocks: block " + std::to_string(block) +
                         " does not divide rows of " + std::to_string(dim) + " (" +
                         std::to_string(n) + " rows)");
  }
  return Status::Ok();
}

}  // namespace

Status WalshHadamardBlocks(float* x, int64_t n, int64_t dim, int64_t block) {
  KVQ_RETURN_IF_ERROR(CheckBlocks(n, dim, block));
  // Consecutive blocks of contiguous rows are rows of `block` values.
  constexpr int64_t kStackDim = 1024;
  float stack_ones[kStackDim];
  std::vector<float> heap_ones(block > kStackDim ? static_cast<size_t>(block) : 0);
  float* ones = block > kStackDim ? heap_ones.data() : stack_ones;
  for (int64_t i = 0; i < block; ++i) ones[i] = 1.0f;
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  HWY_DYNAMIC_DISPATCH(HadamardImpl)(x, n * (dim / block), block, ones, norm, false);
  return Status::Ok();
}

Status WalshHadamardBlocksRef(float* x, int64_t n, int64_t dim, int64_t block) {
  KVQ_RETURN_IF_ERROR(CheckBlocks(n, dim, block));
  const double norm = 1.0 / std::sqrt(static_cast<double>(block));
  std::vector<double> in(static_cast<size_t>(block));
  for (int64_t r = 0; r < n * (dim / block); ++r) {
    float* v = x + r * block;
    for (int64_t i = 0; i < block; ++i) in[i] = v[i];
    for (int64_t i = 0; i < block; ++i) {
      double sum = 0.0;
      for (int64_t j = 0; j < block; ++j) {
        sum += ((__builtin_popcountll(static_cast<uint64_t>(i & j)) & 1) ? -norm : norm) * in[j];
      }
      v[i] = static_cast<float>(sum);
    }
  }
  return Status::Ok();
}

Status CheckHadamardDim(int64_t dim) {
  if (dim < 1 || dim > (int64_t{1} << 16) || (dim & (dim - 1)) != 0) {
    return Status::Error(
        "Hadamard rotation needs head_dim to be a power of two (1 to 65536), got " +
        std::to_string(dim));
  }
  return Status::Ok();
}

float HadamardSign(int64_t i) {
  return (Mix(kSignSeed + static_cast<uint64_t>(i)) >> 63) ? -1.0f : 1.0f;
}

Status HadamardRotate(float* x, int64_t n, int64_t dim) { return Run(x, n, dim, false); }
Status HadamardUnrotate(float* x, int64_t n, int64_t dim) { return Run(x, n, dim, true); }
Status HadamardRotateRef(float* x, int64_t n, int64_t dim) { return RunRef(x, n, dim, false); }
Status HadamardUnrotateRef(float* x, int64_t n, int64_t dim) { return RunRef(x, n, dim, true); }

}  // namespace kvq
#endif  // HWY_ONCE
