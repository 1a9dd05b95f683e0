#include "kv/hadamard.h"

#include <cmath>

namespace kvq {

void HadamardRotate(float* x, int64_t n, int64_t dim) {
  const float norm = 1.0f / std::sqrt(static_cast<float>(dim));
  for (int64_t r = 0; r < n; ++r) {
    float* row = x + r * dim;
    for (int64_t len = 1; len < dim; len <<= 1) {
      for (int64_t i = 0; i < dim; i += 2 * len) {
        for (int64_t j = i; j < i + len; ++j) {
          const float a = row[j], b = row[j + len];
          row[j] = a + b;
          row[j + len] = a - b;
        }
      }
    }
    for (int64_t d = 0; d < dim; ++d) row[d] *= norm;
  }
}

void HadamardUnrotate(float* x, int64_t n, int64_t dim) { HadamardRotate(x, n, dim); }

}  // namespace kvq
