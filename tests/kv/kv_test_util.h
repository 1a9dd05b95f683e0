// Helpers the kv tests share: seeded normal vectors, normalized error, and a
// codec that must parse.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kv/codec.h"

namespace kvq {

constexpr double kEps = 0x1p-24;  // f32 unit roundoff

// n draws of N(0, sigma^2), in order, from `rng`.
inline std::vector<float> Normal(size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Normalized mean squared error sum (a - b)^2 / sum b^2.
inline double Nmse(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    ref += static_cast<double>(b[i]) * b[i];
  }
  return err / std::max(ref, 1e-300);
}

// The codec `name` at head_dim `dim`; a failed parse fails the test.
inline std::unique_ptr<KvCodec> MustParse(const std::string& name, int64_t dim,
                                          CodecPath path = CodecPath::kSimd) {
  auto codec = ParseKvCodec(name, dim, path);
  EXPECT_TRUE(codec.ok()) << name << " dim " << dim << ": " << codec.status().message();
  return codec.ok() ? std::move(codec).value() : nullptr;
}

}  // namespace kvq
