// OpenAI-compatible request parsing and response formatting (the JSON side
// of /v1/completions and /v1/chat/completions), apart from any socket so the
// parser can be unit-tested and fuzzed on raw bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat_template.h"

namespace kvq {

// An error as OpenAI reports it: HTTP status + {"error": {...}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, or empty
  std::string code;   // e.g. "model_not_found", or empty
};
std::string ApiErrorJson(const ApiError& error);

struct CompletionRequest {
  bool chat = false;
  std::string model;                  // empty: the request named none (the server's only model)
  std::string prompt;                 // completions: text prompt
  std::vector<int32_t> prompt_ids;    // completions: prompt given as token ids
  std::vector<ChatMessage> messages;  // chat
  std::optional<int64_t> max_tokens;  // absent: the server picks
  float temperature = 1.0f;           // OpenAI's default
  float top_p = 1.0f;
  int32_t top_k = 0;               // vLLM extension; 0 = off
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]
  // logit_bias: {"token id": bias in [-100, 100]}; ids are checked against
  // the vocabulary by the server, which knows it.
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // vLLM extension
  bool echo = false;           // completions: prepend the prompt to the output
  // Alternatives per token with log probabilities; -1 = no log probabilities.
  // Completions: `logprobs: N` (0..5). Chat: `logprobs: true` with
  // `top_logprobs: N` (0..20, default 0).
  int32_t logprobs = -1;
};

// Parses and type-checks a request body. Never throws; any malformed input
// gives an ApiError naming the field. Every field is either honoured or
// refused: a field this server does not implement (best_of > 1, tools,
// response_format other than text, an unknown name...) is a 400 naming it,
// never silently ignored. Fields that cannot change the output (user,
// metadata, service_tier) are accepted.
bool ParseCompletionRequest(std::string_view body, bool chat, CompletionRequest* request,
                            ApiError* error);

// One output token's log probabilities with the tokens' text: their UTF-8
// bytes, which for a byte-level vocabulary may be part of a character.
struct LogprobToken {
  std::string token;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // most likely first
};
// The `logprobs` object of one choice (a whole response, or one chunk).
// Chat: {"content": [{token, logprob, bytes, top_logprobs}]}. Completions
// (OpenAI's legacy form): parallel arrays tokens, token_logprobs,
// top_logprobs ({token: logprob}, the sampled token always among them, so up
// to N + 1 entries as OpenAI documents) and text_offset.
struct ChoiceLogprobs {
  std::vector<LogprobToken> tokens;
  // Completions: characters of output text before tokens[0] (a stream's
  // earlier chunks); later offsets add up the tokens' characters.
  int64_t text_offset = 0;
};
// Characters (Unicode code points) in UTF-8 text, as text_offset counts
// them: every byte that does not continue a multi-byte character.
int64_t Utf8CharCount(std::string_view text);

// Response bodies. `id` like "cmpl-..." / "chatcmpl-...", `created` in Unix
// seconds. Finish reason as OpenAI spells it ("stop", "length").
struct CompletionUsage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};
std::string CompletionJson(const CompletionRequest& request, const std::string& id, int64_t created,
                           const std::string& text, const std::string& finish_reason,
                           const CompletionUsage& usage, const ChoiceLogprobs* logprobs = nullptr);
// One server-sent event ("data: {...}\n\n"). `finish_reason` empty for a
// text chunk; `usage` attached when set. `first` adds the assistant role
// (chat). `logprobs` (when set) covers the tokens of this chunk. With include_usage the final usage
// travels in its own chunk with no choices (UsageChunk), as OpenAI sends it.
std::string StreamChunk(const CompletionRequest& request, const std::string& id, int64_t created,
                        const std::string& text, const std::string& finish_reason, bool first,
                        const CompletionUsage* usage, const ChoiceLogprobs* logprobs = nullptr);
std::string UsageChunk(const CompletionRequest& request, const std::string& id, int64_t created,
                       const CompletionUsage& usage);

}  // namespace kvq
