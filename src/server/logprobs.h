// Log probabilities of generated tokens, as OpenAI's and vLLM's servers
// report them: the log-softmax of the model's raw logits, i.e. before
// temperature, top-k and top-p reshape the distribution the sampler draws
// from (vLLM's default `logprobs_mode=raw_logprobs`). So a token sampled at
// temperature 1.5 is reported with its probability under the model itself,
// and greedy decoding always reports the largest log probability.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace kvq {

struct TokenLogprob {
  int32_t token = 0;  // the sampled token
  float logprob = 0;  // log p(token) under the model
  // [top_n] (token, log p), most likely first; equal values lowest id first.
  std::vector<std::pair<int32_t, float>> top;
};

// logits: [vocab], the model's output for one position. `token` in
// [0, vocab); `top_n` in [0, vocab]. The normalizer is accumulated in double
// after subtracting the largest logit, so it neither overflows nor loses the
// tail of a 150K-token vocabulary.
TokenLogprob ComputeTokenLogprob(const float* logits, int64_t vocab, int32_t token, int32_t top_n);

}  // namespace kvq
