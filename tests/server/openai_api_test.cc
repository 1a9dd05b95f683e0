#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

namespace kvq {
namespace {

ApiError ParseError(const std::string& body, bool chat = false) {
  CompletionRequest request;
  ApiError error;
  EXPECT_FALSE(ParseCompletionRequest(body, chat, &request, &error)) << body;
  EXPECT_EQ(error.http_status, 400);
  return error;
}

TEST(OpenAiApiTest, ParsesCompletion) {
  CompletionRequest r;
  ApiError e;
  ASSERT_TRUE(ParseCompletionRequest(
      R"({"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"top_p":0.5,"seed":7,)"
      R"("stop":["a","b"],"stream":true,"stream_options":{"include_usage":true}})",
      false, &r, &e))
      << e.message;
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt, "hi");
  EXPECT_EQ(*r.max_tokens, 5);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(*r.seed, 7u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAiApiTest, ParsesChat) {
  CompletionRequest r;
  ApiError e;
  ASSERT_TRUE(ParseCompletionRequest(
      R"({"model":"m","messages":[{"role":"system","content":"be brief"},)"
      R"({"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],)"
      R"("max_completion_tokens":3,"stop":"x"})",
      true, &r, &e))
      << e.message;
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(*r.max_tokens, 3);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
}

TEST(OpenAiApiTest, RejectsBadInputNamingTheField) {
  EXPECT_EQ(ParseError("{not json").param, "");
  EXPECT_EQ(ParseError("[1,2]").param, "");
  EXPECT_EQ(ParseError(R"({"prompt":"x"})").param, "model");
  EXPECT_EQ(ParseError(R"({"model":"m"})").param, "prompt");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":5})").param, "prompt");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","max_tokens":-1})").param, "max_tokens");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","max_tokens":"5"})").param, "max_tokens");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","max_tokens":1.5})").param, "max_tokens");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","temperature":"hot"})").param, "temperature");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","temperature":3})").param, "temperature");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","n":2})").param, "n");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","stop":[1]})").param, "stop");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","stream":"yes"})").param, "stream");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","logprobs":3})").param, "logprobs");
  EXPECT_EQ(ParseError(R"({"model":"m","messages":[]})", true).param, "messages");
  EXPECT_EQ(ParseError(R"({"model":"m","messages":[{"role":"user"}]})", true).param,
            "messages[0].content");
  EXPECT_EQ(ParseError(R"({"model":"m","messages":[{"role":"tool","content":"x"}]})", true).param,
            "messages[0].role");
}

TEST(OpenAiApiTest, HugeMaxTokensParsesAndIsBoundedLater) {
  // 2^64 - 1 does not fit int64: clamped, so the context check rejects it.
  CompletionRequest r;
  ApiError e;
  ASSERT_TRUE(ParseCompletionRequest(
      R"({"model":"m","prompt":"x","max_tokens":18446744073709551615})", false, &r, &e));
  EXPECT_EQ(*r.max_tokens, std::numeric_limits<int64_t>::max());
}

TEST(OpenAiApiTest, ResponsesAreOpenAiShaped) {
  CompletionRequest r;
  r.chat = true;
  r.model = "m";
  auto body = nlohmann::json::parse(CompletionJson(r, "chatcmpl-1", 42, "hey", "stop", {3, 1}));
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "hey");
  EXPECT_EQ(body["usage"]["total_tokens"], 4);
  const std::string chunk = StreamChunk(r, "chatcmpl-1", 42, "a", "", true, nullptr);
  ASSERT_EQ(chunk.rfind("data: ", 0), 0u);
  ASSERT_EQ(chunk.substr(chunk.size() - 2), "\n\n");
  auto c = nlohmann::json::parse(chunk.substr(6));
  EXPECT_EQ(c["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  // Invalid UTF-8 in model output is replaced, never thrown.
  EXPECT_NO_THROW(nlohmann::json::parse(CompletionJson(r, "x", 1, "\xff\xfe", "length", {1, 1})));
}

// The parser never crashes on arbitrary bytes or mutated valid bodies.
TEST(OpenAiApiTest, RandomBytesAndMutationsNeverCrash) {
  std::mt19937 rng(11);
  const std::string valid =
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stop":["x"]})";
  for (int i = 0; i < 20000; ++i) {
    std::string body = valid;
    const int edits = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < edits; ++k) {
      const size_t at = rng() % body.size();
      switch (rng() % 3) {
        case 0:
          body[at] = static_cast<char>(rng());
          break;
        case 1:
          body.erase(at, 1 + rng() % 4);
          break;
        default:
          body.insert(at, 1, static_cast<char>(rng()));
          break;
      }
      if (body.empty()) body = "{";
    }
    CompletionRequest r;
    ApiError e;
    ParseCompletionRequest(body, (i & 1) != 0, &r, &e);
  }
}

}  // namespace
}  // namespace kvq
