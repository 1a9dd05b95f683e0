// Next-token selection from logits: greedy, or temperature + top-k + top-p
// sampling with a seeded generator (same seed, same logits -> same token).
// Before either, OpenAI's logit processing: logit_bias is added to the
// logits, and for every token already in this sampler's output,
// logit -= count * frequency_penalty + presence_penalty (OpenAI's formula;
// vLLM's and llama-server's as well).
#pragma once

#include <cstdint>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvq {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax)
  int32_t top_k = 0;         // 0 = all tokens
  float top_p = 1.0f;        // nucleus mass in (0, 1]
  uint64_t seed = 0;
  // (token id, value added to its logit); ids must be inside the vocabulary.
  std::vector<std::pair<int32_t, float>> logit_bias;
  float presence_penalty = 0.0f;   // once per token that appeared in the output
  float frequency_penalty = 0.0f;  // times the number of times it appeared
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // logits: [vocab]. Ties in greedy mode go to the lowest id. The returned
  // token counts as output for the penalties of later calls.
  int32_t Sample(const float* logits, int64_t vocab);

 private:
  // The logits after bias and penalties (the input itself when none apply).
  const float* Processed(const float* logits, int64_t vocab);
  int32_t Draw(const float* logits, int64_t vocab);

  SamplingParams params_;
  std::unordered_map<int32_t, int32_t> counts_;  // output tokens so far
  std::vector<float> processed_;                 // scratch: processed logits
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // scratch: (logit, id)
};

// Index of the largest value; the lowest index among equals.
int32_t ArgMax(const float* values, int64_t n);

}  // namespace kvq
