#include "engine/chat_template.h"

#include <gtest/gtest.h>

namespace kvq {
namespace {

// Qwen2.5's template (abridged to the parts that decide the rendering).
constexpr const char* kQwenTemplate =
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
    "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are "
    "Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif "
    "%}{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
    "message.content + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- "
    "'<|im_start|>assistant\\n' }}{%- endif %}";

TEST(ChatTemplate, RendersQwenChatMLWithDefaultSystem) {
  auto t = ChatTemplate::FromJinja(kQwenTemplate);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->default_system,
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_EQ(t->Render({{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t->Render({{"system", "Be brief."}, {"user", "Hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, RendersLlama3) {
  auto t = ChatTemplate::FromJinja("{{ bos_token }}<|start_header_id|>...");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Render({{"user", "Hi"}}, true),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, RejectsUnknownTemplates) {
  EXPECT_FALSE(ChatTemplate::FromJinja("[INST] {{ messages }} [/INST]").ok());
  EXPECT_FALSE(ChatTemplate::FromJinja("").ok());
}

}  // namespace
}  // namespace kvq
