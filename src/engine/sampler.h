// Next-token selection from logits: greedy, or temperature + top-k + top-p
// sampling with a seeded generator (same seed, same logits -> same token).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kvq {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax)
  int32_t top_k = 0;         // 0 = all tokens
  float top_p = 1.0f;        // nucleus mass in (0, 1]
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // logits: [vocab]. Ties in greedy mode go to the lowest id.
  int32_t Sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // scratch: (logit, id)
};

// Index of the largest value; the lowest index among equals.
int32_t ArgMax(const float* values, int64_t n);

}  // namespace kvq
