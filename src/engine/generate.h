// Text generation: prompt -> prefill -> token-by-token decode, streaming
// decoded text as it is produced, with the figures a user needs to judge
// speed (tokens/s, bytes read per token, implied bandwidth, peak memory).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "engine/loaded_model.h"
#include "engine/sampler.h"
#include "kv/kv_cache.h"

namespace kvq {

// Batch-invariant prefill (here and in kvq serve): a prompt is cut where
// multiples of the chunk size fall, whatever else runs. The default is one
// constant so that generate and serve agree unless told otherwise.
inline constexpr int64_t kDefaultPrefillChunk = 256;
// Tokens of the chunk that starts after `computed` of `prompt_tokens`: up to
// the next multiple of `chunk`, within the prompt (chunk >= 1).
inline int64_t InvariantPromptChunk(int64_t computed, int64_t prompt_tokens, int64_t chunk) {
  return std::min(prompt_tokens - computed, chunk - computed % chunk);
}

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  SamplingParams sampling;
  bool chat = false;  // wrap the prompt as one user turn with the model's chat template
  bool stop_at_eos = true;
  // The arithmetic of `kvq serve --batch-invariant` (SchedulerOptions):
  // BatchArith::kInvariant, the prompt prefilled in the chunks of
  // InvariantPromptChunk, so the output is the one that server gives.
  bool batch_invariant = false;
  int64_t prefill_chunk = kDefaultPrefillChunk;  // with batch_invariant
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t weight_bytes_per_token = 0;  // every weight matrix read once per decoded token
  double kv_bytes_per_token = 0;       // mean cache bytes read per decoded token
  int64_t kv_bytes_final = 0;          // cache size at the end
  int64_t peak_rss_bytes = 0;
  std::string stop_reason;  // "eos", "length" (max_new_tokens), "context" (cache full)
};

// Streams text through `on_text` (always whole UTF-8 characters). The cache
// must be empty for sequence 0; it is released at the end.
Status Generate(LoadedModel& model, KvCache& cache, const std::string& prompt,
                const GenerateOptions& options,
                const std::function<void(std::string_view)>& on_text, GenerateStats* stats);

// The prompt's token ids as Generate builds them (chat template, BOS).
StatusOr<std::vector<int32_t>> BuildPrompt(const LoadedModel& model, const std::string& prompt,
                                           bool chat);

// Length of the longest prefix of `bytes` that ends on a UTF-8 character
// boundary (an incomplete trailing sequence is held back for the next piece).
size_t CompleteUtf8Prefix(std::string_view bytes);

}  // namespace kvq
