#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace kvq {

int32_t ArgMax(const float* values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (values[i] > values[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

const float* Sampler::Processed(const float* logits, int64_t vocab) {
  const bool penalties = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  if (params_.logit_bias.empty() && (!penalties || counts_.empty())) return logits;
  processed_.assign(logits, logits + vocab);
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id >= 0 && id < vocab) processed_[static_cast<size_t>(id)] += bias;
  }
  if (penalties) {
    for (const auto& [id, count] : counts_) {
      if (id < 0 || id >= vocab) continue;
      processed_[static_cast<size_t>(id)] -=
          static_cast<float>(count) * params_.frequency_penalty + params_.presence_penalty;
    }
  }
  return processed_.data();
}

int32_t Sampler::Sample(const float* logits, int64_t vocab) {
  const int32_t token = Draw(Processed(logits, vocab), vocab);
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) ++counts_[token];
  return token;
}

int32_t Sampler::Draw(const float* logits, int64_t vocab) {
  if (params_.temperature <= 0.0f || params_.top_k == 1) return ArgMax(logits, vocab);
  candidates_.clear();
  candidates_.reserve(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
  // Highest logit first; ties by id so the order never depends on the sort.
  auto higher = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), higher);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), higher);
  }
  candidates_.resize(keep);
  // Softmax at the temperature, in double so tiny tails still add up.
  std::vector<double> probs(keep);
  const double max_logit = candidates_[0].first;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((candidates_[i].first - max_logit) / params_.temperature);
    sum += probs[i];
  }
  // Nucleus: the smallest prefix whose mass reaches top_p.
  size_t nucleus = keep;
  if (params_.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) {
      mass += probs[i] / sum;
      if (mass >= params_.top_p) {
        nucleus = i + 1;
        break;
      }
    }
  }
  double nucleus_sum = 0;
  for (size_t i = 0; i < nucleus; ++i) nucleus_sum += probs[i];
  std::uniform_real_distribution<double> uniform(0.0, nucleus_sum);
  double r = uniform(rng_);
  for (size_t i = 0; i < nucleus; ++i) {
    r -= probs[i];
    if (r <= 0) return candidates_[i].second;
  }
  return candidates_[nucleus - 1].second;
}

}  // namespace kvq
