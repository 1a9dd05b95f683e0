#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <algorithm>
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
  EXPECT_EQ(ParseError(R"({"model":5,"prompt":"x"})").param, "model");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","presence_penalty":2.1})").param,
            "presence_penalty");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","frequency_penalty":-3})").param,
            "frequency_penalty");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","logit_bias":{"1":1e9}})").param, "logit_bias");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","logit_bias":[1]})").param, "logit_bias");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","logit_bias":{"-1":1}})").param, "logit_bias");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","best_of":2})").param, "best_of");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","frobnicate":1})").param, "frobnicate");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","suffix":"y"})").param, "suffix");
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
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","logprobs":6})").param, "logprobs");
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

TEST(OpenAiApiTest, ParsesLogprobs) {
  CompletionRequest r;
  ApiError e;
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":"x","logprobs":5})", false, &r, &e));
  EXPECT_EQ(r.logprobs, 5);
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":"x","logprobs":0})", false, &r, &e));
  EXPECT_EQ(r.logprobs, 0);
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":"x"})", false, &r, &e));
  EXPECT_EQ(r.logprobs, -1);
  // A chat body with `extra` fields appended.
  auto chat = [](std::string_view extra) {
    std::string body = R"({"model":"m","messages":[{"role":"user","content":"hi"}])";
    body.append(extra);
    return body;
  };
  ASSERT_TRUE(ParseCompletionRequest(chat(R"(,"logprobs":true,"top_logprobs":20})"), true, &r, &e));
  EXPECT_EQ(r.logprobs, 20);
  ASSERT_TRUE(ParseCompletionRequest(chat(R"(,"logprobs":true})"), true, &r, &e));
  EXPECT_EQ(r.logprobs, 0);
  ASSERT_TRUE(ParseCompletionRequest(chat(R"(,"logprobs":false})"), true, &r, &e));
  EXPECT_EQ(r.logprobs, -1);

  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","logprobs":-1})").param, "logprobs");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","logprobs":true})").param, "logprobs");
  EXPECT_EQ(ParseError(R"({"model":"m","prompt":"x","logprobs":2,"echo":true})").param, "echo");
  EXPECT_EQ(ParseError(chat(R"(,"logprobs":3})"), true).param, "logprobs");
  EXPECT_EQ(ParseError(chat(R"(,"top_logprobs":3})"), true).param, "top_logprobs");
  EXPECT_EQ(ParseError(chat(R"(,"logprobs":true,"top_logprobs":21})"), true).param, "top_logprobs");
}

// "é" is two bytes and one character; a token may also hold part of one.
ChoiceLogprobs SampleLogprobs() {
  ChoiceLogprobs lp;
  lp.text_offset = 7;
  lp.tokens.push_back({"caf", -0.5f, {{"caf", -0.5f}, {"ca", -1.5f}}});
  lp.tokens.push_back({"\xc3\xa9", -2.0f, {{"e", -0.25f}, {"s", -1.75f}}});
  lp.tokens.push_back({"\xc3", -0.125f, {}});
  return lp;
}

TEST(OpenAiApiTest, CompletionLogprobsInTheLegacyForm) {
  CompletionRequest r;
  r.model = "m";
  r.logprobs = 2;
  const ChoiceLogprobs lp = SampleLogprobs();
  auto body =
      nlohmann::json::parse(CompletionJson(r, "cmpl-1", 1, "caf\xc3\xa9", "length", {1, 3}, &lp));
  const auto& j = body["choices"][0]["logprobs"];
  EXPECT_EQ(j["tokens"].size(), 3u);
  EXPECT_EQ(j["tokens"][1], "\xc3\xa9");
  EXPECT_EQ(j["tokens"][2], "\ufffd");  // a partial character, replaced in JSON
  EXPECT_EQ(j["token_logprobs"], nlohmann::json::parse("[-0.5, -2.0, -0.125]"));
  EXPECT_EQ(j["text_offset"], nlohmann::json::parse("[7, 10, 11]"));
  // Top alternatives plus the sampled token when it is not among them.
  EXPECT_EQ(j["top_logprobs"][0], nlohmann::json::parse(R"({"caf": -0.5, "ca": -1.5})"));
  EXPECT_EQ(j["top_logprobs"][1],
            nlohmann::json::parse(R"({"e": -0.25, "s": -1.75, "\u00e9": -2.0})"));
  EXPECT_EQ(j["top_logprobs"][2].size(), 1u);
  // Without logprobs the field is null, as OpenAI sends it.
  body = nlohmann::json::parse(CompletionJson(r, "cmpl-1", 1, "x", "length", {1, 1}));
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  // A stream chunk carries the same object for its own tokens.
  const std::string chunk = StreamChunk(r, "cmpl-1", 1, "caf", "", false, nullptr, &lp);
  auto c = nlohmann::json::parse(chunk.substr(6));
  EXPECT_EQ(c["choices"][0]["logprobs"]["text_offset"][0], 7);
}

TEST(OpenAiApiTest, ChatLogprobsInTheChatForm) {
  CompletionRequest r;
  r.chat = true;
  r.model = "m";
  r.logprobs = 2;
  const ChoiceLogprobs lp = SampleLogprobs();
  auto body = nlohmann::json::parse(CompletionJson(r, "chatcmpl-1", 1, "caf", "stop", {1, 3}, &lp));
  const auto& content = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u);
  EXPECT_EQ(content[0]["token"], "caf");
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[0]["bytes"], nlohmann::json::parse("[99, 97, 102]"));
  EXPECT_EQ(content[1]["bytes"], nlohmann::json::parse("[195, 169]"));
  EXPECT_EQ(content[2]["bytes"], nlohmann::json::parse("[195]"));
  ASSERT_EQ(content[1]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[1]["top_logprobs"][0],
            nlohmann::json::parse(R"({"token": "e", "logprob": -0.25, "bytes": [101]})"));
  EXPECT_TRUE(content[2]["top_logprobs"].empty());
  auto c = nlohmann::json::parse(
      StreamChunk(r, "chatcmpl-1", 1, "caf", "", true, nullptr, &lp).substr(6));
  EXPECT_EQ(c["choices"][0]["logprobs"]["content"].size(), 3u);
}

// The parser never crashes on arbitrary bytes or mutated valid bodies.
TEST(OpenAiApiTest, RandomBytesAndMutationsNeverCrash) {
  std::mt19937 rng(11);
  // Valid bodies to mutate: chat, completion and chat with log probabilities.
  const std::string valid[] = {
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stop":["x"]})",
      R"({"model":"m","prompt":"hi","logprobs":5,"echo":false,"max_tokens":3})",
      R"({"model":"m","messages":[{"role":"user","content":"a"}],"logprobs":true,)"
      R"("top_logprobs":3})"};
  for (int i = 0; i < 20000; ++i) {
    std::string body = valid[i % 3];
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
      if (body.empty()) body.push_back('{');
    }
    CompletionRequest r;
    ApiError e;
    ParseCompletionRequest(body, (i & 1) != 0, &r, &e);
  }
}

// Issue 21, failures 7 and 9: model may be omitted; penalties and
// logit_bias are parsed into the request (the sampler applies them).
TEST(OpenAiApiTest, ModelOptionalPenaltiesAndBiasParsed) {
  CompletionRequest r;
  ApiError error;
  ASSERT_TRUE(ParseCompletionRequest(
      R"({"prompt":"x","presence_penalty":0.5,"frequency_penalty":-1,"logit_bias":{"7":-100,"12":3.5},"best_of":1,"user":"u"})",
      false, &r, &error))
      << error.message;
  EXPECT_EQ(r.model, "");
  EXPECT_FLOAT_EQ(r.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.frequency_penalty, -1.0f);
  ASSERT_EQ(r.logit_bias.size(), 2u);
  std::sort(r.logit_bias.begin(), r.logit_bias.end());  // JSON objects have no order
  EXPECT_EQ(r.logit_bias[0], (std::pair<int32_t, float>{7, -100.0f}));
  EXPECT_EQ(r.logit_bias[1], (std::pair<int32_t, float>{12, 3.5f}));
}

}  // namespace
}  // namespace kvq
