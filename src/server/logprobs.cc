#include "server/logprobs.h"

#include <algorithm>
#include <cmath>

namespace kvq {

TokenLogprob ComputeTokenLogprob(const float* logits, int64_t vocab, int32_t token, int32_t top_n) {
  float max_logit = logits[0];
  for (int64_t i = 1; i < vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const double log_normalizer = static_cast<double>(max_logit) + std::log(sum);

  TokenLogprob out;
  out.token = token;
  out.logprob = static_cast<float>(logits[token] - log_normalizer);
  // Top n by insertion into a short sorted list: one pass over the
  // vocabulary, and n <= 20 in practice. Scanning ids in ascending order and
  // inserting only past strictly smaller values keeps the lowest id first
  // among equal logits.
  const size_t n = static_cast<size_t>(std::clamp<int64_t>(top_n, 0, vocab));
  std::vector<std::pair<float, int32_t>> best;  // [<= n] (logit, id), descending
  best.reserve(n + 1);
  for (int64_t i = 0; i < vocab && n > 0; ++i) {
    const float v = logits[i];
    if (best.size() == n && !(v > best.back().first)) continue;
    auto at = std::upper_bound(best.begin(), best.end(), v,
                               [](float value, const auto& e) { return value > e.first; });
    best.insert(at, {v, static_cast<int32_t>(i)});
    if (best.size() > n) best.pop_back();
  }
  out.top.reserve(best.size());
  for (const auto& [logit, id] : best) {
    out.top.emplace_back(id, static_cast<float>(logit - log_normalizer));
  }
  return out;
}

}  // namespace kvq
