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
  std::string model;
  std::string prompt;                 // completions: text prompt
  std::vector<int32_t> prompt_ids;    // completions: prompt given as token ids
  std::vector<ChatMessage> messages;  // chat
  std::optional<int64_t> max_tokens;  // absent: the server picks
  float temperature = 1.0f;           // OpenAI's default
  float top_p = 1.0f;
  int32_t top_k = 0;  // vLLM extension; 0 = off
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // vLLM extension
  bool echo = false;           // completions: prepend the prompt to the output
};

// Parses and type-checks a request body. Never throws; any malformed input
// gives an ApiError naming the field.
bool ParseCompletionRequest(std::string_view body, bool chat, CompletionRequest* request,
                            ApiError* error);

// Response bodies. `id` like "cmpl-..." / "chatcmpl-...", `created` in Unix
// seconds. Finish reason as OpenAI spells it ("stop", "length").
struct CompletionUsage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};
std::string CompletionJson(const CompletionRequest& request, const std::string& id, int64_t created,
                           const std::string& text, const std::string& finish_reason,
                           const CompletionUsage& usage);
// One server-sent event ("data: {...}\n\n"). `finish_reason` empty for a
// text chunk; `usage` attached when set. `first` adds the assistant role
// (chat). With include_usage the final usage travels in its own chunk with
// no choices (UsageChunk), as OpenAI sends it.
std::string StreamChunk(const CompletionRequest& request, const std::string& id, int64_t created,
                        const std::string& text, const std::string& finish_reason, bool first,
                        const CompletionUsage* usage);
std::string UsageChunk(const CompletionRequest& request, const std::string& id, int64_t created,
                       const CompletionUsage& usage);

}  // namespace kvq
