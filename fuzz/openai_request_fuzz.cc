// libFuzzer target: OpenAI request bodies (/v1/completions and
// /v1/chat/completions) as kvq serve parses them, and the responses built
// from whatever parsed.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {false, true}) {
    kvq::CompletionRequest request;
    kvq::ApiError error;
    if (!kvq::ParseCompletionRequest(body, chat, &request, &error)) {
      // Every refusal is a 4xx with a message, and its JSON is well-formed.
      if (error.http_status < 400 || error.http_status > 499 || error.message.empty()) {
        __builtin_trap();
      }
      (void)kvq::ApiErrorJson(error);
      continue;
    }
    if (request.max_tokens && *request.max_tokens < 1) __builtin_trap();
    // Echo user-controlled strings (model name, prompt) into every response
    // shape: invalid UTF-8 must be replaced, never thrown.
    const kvq::CompletionUsage usage{1, 1};
    (void)kvq::CompletionJson(request, "id", 0, request.prompt, "stop", usage);
    (void)kvq::StreamChunk(request, "id", 0, request.prompt, "", true, &usage);
    (void)kvq::UsageChunk(request, "id", 0, usage);
  }
  return 0;
}
