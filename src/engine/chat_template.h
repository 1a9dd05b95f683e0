// Chat prompt formatting. Models ship a Jinja chat_template; kvq does not run
// Jinja. It recognizes the two template families it supports (ChatML, as used
// by Qwen2/Qwen2.5 and kvq's own model, and Llama-3's header format) and
// renders them natively; any other template is a clear error.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace kvq {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct ChatTemplate {
  enum class Family { kChatML, kLlama3 } family = Family::kChatML;
  // System message the template inserts when the conversation has none
  // (Qwen2.5: "You are Qwen, created by Alibaba Cloud. ..."); may be empty.
  std::string default_system;
  std::string bos_text;  // Llama-3 prepends "<|begin_of_text|>" in the template

  // Recognizes the family from the Jinja source.
  static StatusOr<ChatTemplate> FromJinja(const std::string& jinja);

  // The prompt text for `messages`, ending with the assistant header when
  // add_generation_prompt is set (special tokens appear as text: encode
  // with special-token parsing on).
  std::string Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
};

}  // namespace kvq
