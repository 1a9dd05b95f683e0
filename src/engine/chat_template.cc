#include "engine/chat_template.h"

namespace kvq {
namespace {

// Finds the default system message written as a literal in a ChatML
// template: '<|im_start|>system\n' + TEXT + '<|im_end|>' inside one string
// literal. Jinja sources spell the newline as the two characters "\n".
std::string FindDefaultSystem(const std::string& jinja) {
  for (const std::string opener : {"<|im_start|>system\\n", "<|im_start|>system\n"}) {
    size_t pos = 0;
    while ((pos = jinja.find(opener, pos)) != std::string::npos) {
      const size_t start = pos + opener.size();
      const size_t end = jinja.find("<|im_end|>", start);
      if (end == std::string::npos) break;
      const std::string text = jinja.substr(start, end - start);
      // A literal, not template code such as "' + message['content'] + '".
      if (text.find('\'') == std::string::npos && text.find('{') == std::string::npos &&
          !text.empty()) {
        return text;
      }
      pos = start;
    }
  }
  return "";
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::FromJinja(const std::string& jinja) {
  ChatTemplate t;
  if (jinja.find("<|im_start|>") != std::string::npos) {
    t.family = Family::kChatML;
    t.default_system = FindDefaultSystem(jinja);
    return t;
  }
  if (jinja.find("<|start_header_id|>") != std::string::npos) {
    t.family = Family::kLlama3;
    if (jinja.find("bos_token") != std::string::npos ||
        jinja.find("<|begin_of_text|>") != std::string::npos) {
      t.bos_text = "<|begin_of_text|>";
    }
    return t;
  }
  if (jinja.empty()) return Status::Error("the model has no chat_template");
  return Status::Error(
      "unsupported chat template (kvq renders ChatML and Llama-3 header templates)");
}

std::string ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  std::string out;
  if (family == Family::kChatML) {
    if (!default_system.empty() && (messages.empty() || messages[0].role != "system")) {
      out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
    }
    for (const ChatMessage& m : messages) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }
  out += bos_text;
  for (const ChatMessage& m : messages) {
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace kvq
