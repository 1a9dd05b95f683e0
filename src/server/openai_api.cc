#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace kvq {
namespace {

using json = nlohmann::json;

// Model output may hold invalid UTF-8 (a token can end inside a character
// when generation stops); replace it rather than throw.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

bool Fail(ApiError* error, const std::string& param, const std::string& message) {
  error->http_status = 400;
  error->type = "invalid_request_error";
  error->param = param;
  error->message = message;
  return false;
}

// Integer field; a JSON number with a fraction or a value past int64 is an error.
bool GetInt(const json& body, const char* name, int64_t min, int64_t max,
            std::optional<int64_t>* out, ApiError* error) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_number_integer()) {
    return Fail(error, name, std::string("'") + name + "' must be an integer");
  }
  int64_t value;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    value = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                ? std::numeric_limits<int64_t>::max()
                : static_cast<int64_t>(u);
  } else {
    value = it->get<int64_t>();
  }
  if (value < min || value > max) {
    return Fail(error, name,
                std::string("'") + name + "' must be between " + std::to_string(min) + " and " +
                    std::to_string(max) + ", got " + it->dump());
  }
  *out = value;
  return true;
}

bool GetFloat(const json& body, const char* name, double min, double max, float* out,
              ApiError* error) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_number()) return Fail(error, name, std::string("'") + name + "' must be a number");
  const double value = it->get<double>();
  if (!std::isfinite(value) || value < min || value > max) {
    return Fail(error, name,
                std::string("'") + name + "' must be between " + json(min).dump() + " and " +
                    json(max).dump() + ", got " + it->dump());
  }
  *out = static_cast<float>(value);
  return true;
}

bool GetBool(const json& body, const char* name, bool* out, ApiError* error) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_boolean()) return Fail(error, name, std::string("'") + name + "' must be a boolean");
  *out = it->get<bool>();
  return true;
}

// Message content: a string, or an array of {"type": "text", "text": ...} parts.
bool GetContent(const json& content, const std::string& param, std::string* out, ApiError* error) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return true;
  }
  if (!content.is_array()) return Fail(error, param, "'content' must be a string or an array");
  for (const json& part : content) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
        !part.contains("text") || !part["text"].is_string()) {
      return Fail(error, param, "only content parts of type 'text' are supported");
    }
    *out += part["text"].get<std::string>();
  }
  return true;
}

bool ParseMessages(const json& body, CompletionRequest* request, ApiError* error) {
  auto it = body.find("messages");
  if (it == body.end()) return Fail(error, "messages", "'messages' is required");
  if (!it->is_array() || it->empty()) {
    return Fail(error, "messages", "'messages' must be a non-empty array");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Fail(error, param, param + " must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Fail(error, param + ".role", param + ".role must be a string");
    }
    ChatMessage message;
    message.role = role->get<std::string>();
    if (message.role != "system" && message.role != "user" && message.role != "assistant" &&
        message.role != "developer") {
      return Fail(error, param + ".role",
                  "unsupported role '" + message.role + "' (system, developer, user, assistant)");
    }
    if (message.role == "developer") message.role = "system";
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      return Fail(error, param + ".content", param + ".content is required");
    }
    if (!GetContent(*content, param + ".content", &message.content, error)) return false;
    request->messages.push_back(std::move(message));
  }
  return true;
}

bool ParsePrompt(const json& body, CompletionRequest* request, ApiError* error) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return Fail(error, "prompt", "'prompt' is required");
  if (it->is_string()) {
    request->prompt = it->get<std::string>();
    return true;
  }
  if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
    request->prompt = (*it)[0].get<std::string>();
    return true;
  }
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
    for (const json& id : *it) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Fail(error, "prompt", "a token-id prompt must hold non-negative integers");
      }
      request->prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    return true;
  }
  return Fail(error, "prompt",
              "'prompt' must be a string, an array of one string, or an array of token ids "
              "(batched prompts are not supported)");
}

// {"123": 5.0, ...}: token ids as decimal strings, biases in [-100, 100].
bool ParseLogitBias(const json& body, CompletionRequest* request, ApiError* error) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_object()) {
    return Fail(error, "logit_bias", "'logit_bias' must be an object {\"token id\": bias}");
  }
  constexpr size_t kMaxEntries = 1024;
  if (it->size() > kMaxEntries) {
    return Fail(error, "logit_bias",
                "'logit_bias' has more than " + std::to_string(kMaxEntries) + " entries");
  }
  for (const auto& [key, value] : it->items()) {
    const bool digits = !key.empty() && key.size() <= 10 &&
                        key.find_first_not_of("0123456789") == std::string::npos;
    const int64_t id = digits ? std::stoll(key) : -1;
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
      return Fail(error, "logit_bias",
                  "'logit_bias' keys must be token ids (non-negative integers), got '" + key + "'");
    }
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100 ||
        value.get<double>() > 100) {
      return Fail(error, "logit_bias",
                  "'logit_bias' values must be numbers in [-100, 100], got " + value.dump() +
                      " for token " + key);
    }
    request->logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
  }
  return true;
}

// temperature, top_p, top_k, seed, n, penalties, logit_bias.
bool ParseSampling(const json& body, CompletionRequest* request, ApiError* error) {
  constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
  if (!GetFloat(body, "temperature", 0, 2, &request->temperature, error)) return false;
  if (!GetFloat(body, "top_p", 0, 1, &request->top_p, error)) return false;
  if (request->top_p <= 0) return Fail(error, "top_p", "'top_p' must be greater than 0");
  std::optional<int64_t> top_k, seed, n;
  if (!GetInt(body, "top_k", -1, std::numeric_limits<int32_t>::max(), &top_k, error)) return false;
  if (top_k) request->top_k = *top_k < 0 ? 0 : static_cast<int32_t>(*top_k);  // -1: off (vLLM)
  if (!GetInt(body, "seed", std::numeric_limits<int64_t>::min(), kMaxInt, &seed, error)) {
    return false;
  }
  if (seed) request->seed = static_cast<uint64_t>(*seed);
  if (!GetInt(body, "n", 1, 1, &n, error)) {
    error->message = "only n = 1 is supported";
    return false;
  }
  if (!GetFloat(body, "presence_penalty", -2, 2, &request->presence_penalty, error)) return false;
  if (!GetFloat(body, "frequency_penalty", -2, 2, &request->frequency_penalty, error)) {
    return false;
  }
  if (!ParseLogitBias(body, request, error)) return false;
  return true;
}

bool CheckDefaultsOnly(const json& body, ApiError* error);

// Every field is honoured, inert, or refused (see ParseCompletionRequest).
bool CheckFieldsKnown(const json& body, bool chat, ApiError* error) {
  static const char* kCommon[] = {"model",
                                  "max_tokens",
                                  "temperature",
                                  "top_p",
                                  "top_k",
                                  "seed",
                                  "n",
                                  "stream",
                                  "stream_options",
                                  "stop",
                                  "ignore_eos",
                                  "logprobs",
                                  "presence_penalty",
                                  "frequency_penalty",
                                  "logit_bias",
                                  "user",
                                  "best_of",
                                  "metadata",
                                  "service_tier",
                                  "store"};
  static const char* kChat[] = {"messages",  "max_completion_tokens", "top_logprobs",
                                "tools",     "tool_choice",           "parallel_tool_calls",
                                "functions", "function_call",         "response_format",
                                "modalities"};
  static const char* kCompletion[] = {"prompt", "echo", "suffix"};
  auto in = [](const auto& list, const std::string& key) {
    return std::find(std::begin(list), std::end(list), key) != std::end(list);
  };
  for (const auto& [key, value] : body.items()) {
    if (!in(kCommon, key) && !(chat ? in(kChat, key) : in(kCompletion, key))) {
      return Fail(error, key,
                  "unsupported field '" + key + "' (this server does not implement it)");
    }
  }
  return CheckDefaultsOnly(body, error);
}

// Fields implemented only at their default value: any other value would be
// ignored, so it is refused.
bool CheckDefaultsOnly(const json& body, ApiError* error) {
  auto refuse = [&](const char* field, const std::string& why) {
    return Fail(error, field, std::string("'") + field + "' " + why);
  };
  auto field = [&](const char* name) -> const json* {
    auto it = body.find(name);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* v = field("best_of"); v && *v != 1) {
    return refuse("best_of", "is not supported: only best_of = 1 (one sample per choice)");
  }
  if (const json* v = field("store"); v && *v != false) {
    return refuse("store", "is not supported: completions are not stored");
  }
  if (const json* v = field("user"); v && !v->is_string())
    return refuse("user", "must be a string");
  if (const json* v = field("service_tier"); v && !v->is_string()) {
    return refuse("service_tier", "must be a string");
  }
  if (const json* v = field("metadata"); v && !v->is_object()) {
    return refuse("metadata", "must be an object");
  }
  if (const json* v = field("suffix"); v && *v != "") {
    return refuse("suffix", "is not supported (insertion after the completion)");
  }
  if (const json* v = field("tools"); v && !(v->is_array() && v->empty())) {
    return refuse("tools", "are not supported (no tool calling)");
  }
  if (const json* v = field("functions"); v && !(v->is_array() && v->empty())) {
    return refuse("functions", "are not supported (no function calling)");
  }
  if (const json* v = field("tool_choice"); v && *v != "none") {
    return refuse("tool_choice", "is not supported (no tool calling)");
  }
  if (const json* v = field("function_call"); v && *v != "none") {
    return refuse("function_call", "is not supported (no function calling)");
  }
  if (const json* v = field("parallel_tool_calls"); v && !v->is_boolean()) {
    return refuse("parallel_tool_calls", "must be a boolean");
  }
  if (const json* v = field("response_format");
      v && !(v->is_object() && v->size() == 1 && v->value("type", "") == "text")) {
    return refuse("response_format", "is not supported: only {\"type\": \"text\"}");
  }
  if (const json* v = field("modalities"); v && *v != json::array({"text"})) {
    return refuse("modalities", "is not supported: only [\"text\"]");
  }
  return true;
}

json UsageJson(const CompletionUsage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json TokenBytes(const std::string& token) {
  json bytes = json::array();
  for (unsigned char c : token) bytes.push_back(static_cast<int>(c));
  return bytes;
}

json LogprobsJson(const CompletionRequest& request, const ChoiceLogprobs* logprobs) {
  if (logprobs == nullptr) return nullptr;
  if (request.chat) {
    json content = json::array();
    for (const LogprobToken& t : logprobs->tokens) {
      json top = json::array();
      for (const auto& [token, logprob] : t.top) {
        top.push_back({{"token", token}, {"logprob", logprob}, {"bytes", TokenBytes(token)}});
      }
      content.push_back({{"token", t.token},
                         {"logprob", t.logprob},
                         {"bytes", TokenBytes(t.token)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  int64_t offset = logprobs->text_offset;
  for (const LogprobToken& t : logprobs->tokens) {
    tokens.push_back(t.token);
    token_logprobs.push_back(t.logprob);
    // Alternatives whose text coincides keep the more likely value.
    json top = json::object();
    for (const auto& [token, logprob] : t.top) {
      if (!top.contains(token)) top[token] = logprob;
    }
    if (!top.contains(t.token)) top[t.token] = t.logprob;
    top_logprobs.push_back(top);
    text_offset.push_back(offset);
    offset += Utf8CharCount(t.token);
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top_logprobs},
          {"text_offset", text_offset}};
}

json FinishReason(const std::string& reason) {
  return reason.empty() ? json(nullptr) : json(reason);
}

}  // namespace

int64_t Utf8CharCount(std::string_view text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

std::string ApiErrorJson(const ApiError& error) {
  json body = {{"message", error.message},
               {"type", error.type},
               {"param", error.param.empty() ? json(nullptr) : json(error.param)},
               {"code", error.code.empty() ? json(nullptr) : json(error.code)}};
  return Dump(json{{"error", body}});
}

bool ParseCompletionRequest(std::string_view body_text, bool chat, CompletionRequest* request,
                            ApiError* error) {
  *request = CompletionRequest{};
  request->chat = chat;
  const json body = json::parse(body_text.begin(), body_text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (body.is_discarded()) return Fail(error, "", "the request body is not valid JSON");
  if (!body.is_object()) return Fail(error, "", "the request body must be a JSON object");

  if (!CheckFieldsKnown(body, chat, error)) return false;
  auto model = body.find("model");
  if (model != body.end() && !model->is_null()) {
    if (!model->is_string()) return Fail(error, "model", "'model' must be a string");
    request->model = model->get<std::string>();
  }

  if (chat ? !ParseMessages(body, request, error) : !ParsePrompt(body, request, error)) {
    return false;
  }
  // Chat clients send max_completion_tokens (the newer name); either works.
  std::optional<int64_t> max_tokens, max_completion_tokens;
  constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
  if (!GetInt(body, "max_tokens", 1, kMaxInt, &max_tokens, error)) return false;
  if (!GetInt(body, "max_completion_tokens", 1, kMaxInt, &max_completion_tokens, error)) {
    return false;
  }
  request->max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;

  if (!ParseSampling(body, request, error)) return false;
  if (!GetBool(body, "stream", &request->stream, error)) return false;
  if (!GetBool(body, "ignore_eos", &request->ignore_eos, error)) return false;
  if (!chat && !GetBool(body, "echo", &request->echo, error)) return false;

  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object())
      return Fail(error, "stream_options", "'stream_options' must be an object");
    if (!GetBool(*it, "include_usage", &request->include_usage, error)) return false;
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      request->stop.push_back(it->get<std::string>());
    } else if (it->is_array() && it->size() <= 4) {
      for (const json& s : *it) {
        if (!s.is_string()) return Fail(error, "stop", "'stop' entries must be strings");
        request->stop.push_back(s.get<std::string>());
      }
    } else {
      return Fail(error, "stop", "'stop' must be a string or an array of up to 4 strings");
    }
    for (const std::string& s : request->stop) {
      if (s.empty()) return Fail(error, "stop", "stop strings must not be empty");
    }
  }
  if (chat) {
    bool wanted = false;
    std::optional<int64_t> top;
    if (!GetBool(body, "logprobs", &wanted, error)) return false;
    if (!GetInt(body, "top_logprobs", 0, 20, &top, error)) return false;
    if (top && !wanted) {
      return Fail(error, "top_logprobs", "'top_logprobs' requires 'logprobs': true");
    }
    if (wanted) request->logprobs = top ? static_cast<int32_t>(*top) : 0;
  } else {
    std::optional<int64_t> n_logprobs;
    if (!GetInt(body, "logprobs", 0, 5, &n_logprobs, error)) return false;
    if (n_logprobs) request->logprobs = static_cast<int32_t>(*n_logprobs);
    if (n_logprobs && request->echo) {
      return Fail(error, "echo",
                  "'echo' with 'logprobs' (log probabilities of the prompt) is not supported");
    }
  }
  return true;
}

std::string CompletionJson(const CompletionRequest& request, const std::string& id, int64_t created,
                           const std::string& text, const std::string& finish_reason,
                           const CompletionUsage& usage, const ChoiceLogprobs* logprobs) {
  json choice = {{"index", 0},
                 {"logprobs", LogprobsJson(request, logprobs)},
                 {"finish_reason", FinishReason(finish_reason)}};
  if (request.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  json body = {{"id", id},
               {"object", request.chat ? "chat.completion" : "text_completion"},
               {"created", created},
               {"model", request.model},
               {"choices", json::array({choice})},
               {"usage", UsageJson(usage)}};
  return Dump(body);
}

std::string StreamChunk(const CompletionRequest& request, const std::string& id, int64_t created,
                        const std::string& text, const std::string& finish_reason, bool first,
                        const CompletionUsage* usage, const ChoiceLogprobs* logprobs) {
  json choice = {{"index", 0},
                 {"logprobs", LogprobsJson(request, logprobs)},
                 {"finish_reason", FinishReason(finish_reason)}};
  if (request.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  json body = {{"id", id},
               {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
               {"created", created},
               {"model", request.model},
               {"choices", json::array({choice})}};
  if (usage != nullptr) body["usage"] = UsageJson(*usage);
  return "data: " + Dump(body) + "\n\n";
}

std::string UsageChunk(const CompletionRequest& request, const std::string& id, int64_t created,
                       const CompletionUsage& usage) {
  json body = {{"id", id},
               {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
               {"created", created},
               {"model", request.model},
               {"choices", json::array()},
               {"usage", UsageJson(usage)}};
  return "data: " + Dump(body) + "\n\n";
}

}  // namespace kvq
