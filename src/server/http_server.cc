#include "server/http_server.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <thread>

#include "engine/chat_template.h"
#include "engine/generate.h"
#include "server/api_key.h"
#include "server/connection.h"
#include "server/http_listener.h"
#include "server/openai_api.h"

namespace kvq {
namespace {

using json = nlohmann::json;

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SendError(HttpResponse& res, const ApiError& error) {
  res.status = error.http_status;
  res.SetContent(ApiErrorJson(error), "application/json");
}

ApiError MakeError(int status, const std::string& type, const std::string& message,
                   const std::string& code = "", const std::string& param = "") {
  ApiError e;
  e.http_status = status;
  e.type = type;
  e.message = message;
  e.code = code;
  e.param = param;
  return e;
}

// The chat conversation as token ids, the way BuildPrompt renders one turn.
StatusOr<std::vector<int32_t>> ChatPromptIds(const LoadedModel& model,
                                             const std::vector<ChatMessage>& messages) {
  const Tokenizer& tok = *model.tokenizer;
  KVQ_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::FromJinja(tok.chat_template()));
  EncodeOptions options;
  options.parse_special = true;  // the template's markers are special tokens
  options.add_special = tmpl.bos_text.empty();
  std::vector<int32_t> ids =
      tok.Encode(tmpl.Render(messages, /*add_generation_prompt=*/true), options);
  if (ids.empty()) return Status::Error("the prompt is empty");
  return ids;
}

// Streaming state shared by the content provider and its releaser.
struct StreamState {
  CompletionRequest request;
  std::string id;
  int64_t created = 0;
  std::shared_ptr<RequestChannel> channel;
  std::string echo_text;    // echo: the prompt, sent before the completion
  int socket = -1;          // the client's connection (-1: unknown), to notice it closing
  int64_t text_offset = 0;  // logprobs: characters of the tokens already sent
  bool first = true;
  bool done = false;
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
};

// The stream's last event: the finish chunk (with usage, or usage in its own
// chunk when the client asked for stream_options.include_usage, OpenAI's
// form) or an error event, then [DONE]. False when a write failed.
template <class Write>
bool WriteFinalEvent(const StreamState& state, const RequestEvent& event,
                     const std::optional<ChoiceLogprobs>& logprobs, Write& write) {
  if (event.finish_reason == "stop" || event.finish_reason == "length") {
    const CompletionUsage usage{event.prompt_tokens, event.completion_tokens};
    const bool own_chunk = state.request.include_usage;
    if (!write(StreamChunk(state.request, state.id, state.created, event.text, event.finish_reason,
                           state.first, own_chunk ? nullptr : &usage,
                           logprobs ? &*logprobs : nullptr))) {
      return false;
    }
    if (own_chunk && !write(UsageChunk(state.request, state.id, state.created, usage))) {
      return false;
    }
  } else {
    const ApiError e = MakeError(event.finish_reason == "error" ? 500 : 503, "server_error",
                                 event.finish_reason == "error"
                                     ? "generation failed: " + event.error
                                     : "the request was cancelled (server shutting down)");
    if (!write("data: " + ApiErrorJson(e) + "\n\n")) return false;
  }
  return write("data: [DONE]\n\n");
}

}  // namespace

struct HttpServer::Impl {
  const LoadedModel& model;
  EngineLoop& engine;
  HttpServerOptions options;
  std::unique_ptr<HttpListener> listener;
  std::atomic<uint64_t> next_id{1};
  std::atomic<bool> shutting_down{false};
  std::atomic<int64_t> open_requests{0};  // completions not yet fully answered
  std::mutex random_mutex;
  std::mt19937_64 random{std::random_device{}()};

  Impl(const LoadedModel& m, EngineLoop& e, const HttpServerOptions& o)
      : model(m), engine(e), options(o) {}

  std::string NewId(bool chat) {
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), "%llx", static_cast<unsigned long long>(next_id++));
    return std::string(chat ? "chatcmpl-" : "cmpl-") + suffix;
  }
  uint64_t RandomSeed() {
    std::lock_guard<std::mutex> lock(random_mutex);
    return random();
  }

  bool Authorized(const HttpRequest& req) const {
    if (options.api_key.empty()) return true;
    return ConstantTimeEquals(req.Header("authorization"), "Bearer " + options.api_key);
  }

  // The engine's log probabilities with each token's text; advances
  // `*text_offset` by the tokens' characters.
  ChoiceLogprobs WithText(const std::vector<TokenLogprob>& entries, int64_t* text_offset) const {
    ChoiceLogprobs out;
    out.text_offset = *text_offset;
    const Tokenizer& tok = *model.tokenizer;
    auto text = [&tok](int32_t id) { return tok.Decode(std::span<const int32_t>(&id, 1)); };
    for (const TokenLogprob& e : entries) {
      LogprobToken t;
      t.token = text(e.token);
      t.logprob = e.logprob;
      for (const auto& [id, logprob] : e.top) t.top.emplace_back(text(id), logprob);
      *text_offset += Utf8CharCount(t.token);
      out.tokens.push_back(std::move(t));
    }
    return out;
  }

  void Handle(const HttpExchange& exchange, HttpResponse& res);
  void Health(const HttpExchange& exchange, HttpResponse& res);
  void Metrics(const HttpExchange& exchange, HttpResponse& res);
  void Models(const HttpExchange& exchange, HttpResponse& res);
  void Completion(const HttpExchange& exchange, HttpResponse& res) {
    HandleCompletion(exchange, res, false);
  }
  void ChatCompletion(const HttpExchange& exchange, HttpResponse& res) {
    HandleCompletion(exchange, res, true);
  }
  bool CheckBody(const HttpRequest& req, HttpResponse& res);
  bool PromptIds(const CompletionRequest& request, bool chat, std::vector<int32_t>* out,
                 HttpResponse& res);
  bool Prepare(const HttpRequest& req, bool chat, CompletionRequest* request, ServeRequest* serve,
               HttpResponse& res);
  void AnswerWhole(HttpResponse& res, StreamState& state);
  void HandleCompletion(const HttpExchange& exchange, HttpResponse& res, bool chat);
  void Stream(HttpResponse& res, std::shared_ptr<StreamState> state);
};

void HttpServer::Impl::Handle(const HttpExchange& exchange, HttpResponse& res) {
  const HttpRequest& req = exchange.request;
  // Only the API needs the key; /health and /metrics stay open for probes.
  if (req.path.rfind("/v1/", 0) == 0 && !Authorized(req)) {
    res.SetHeader("WWW-Authenticate", "Bearer");  // required with 401 (RFC 9110 §11.6.1)
    return SendError(res, MakeError(401, "invalid_request_error",
                                    "Incorrect API key provided: pass it as 'Authorization: "
                                    "Bearer <key>'.",
                                    "invalid_api_key"));
  }
  struct Route {
    const char* path;
    const char* method;
    void (Impl::*handle)(const HttpExchange&, HttpResponse&);
  };
  static constexpr Route kRoutes[] = {
      {"/health", "GET", &Impl::Health},
      {"/metrics", "GET", &Impl::Metrics},
      {"/v1/models", "GET", &Impl::Models},
      {"/v1/completions", "POST", &Impl::Completion},
      {"/v1/chat/completions", "POST", &Impl::ChatCompletion},
  };
  // HEAD is GET without the body (RFC 9110 §9.3.2); the listener drops it.
  const std::string method = req.method == "HEAD" ? "GET" : req.method;
  for (const Route& route : kRoutes) {
    if (req.path != route.path) continue;
    if (method == route.method) return (this->*route.handle)(exchange, res);
    static const char* kKnown[] = {"GET",     "HEAD",    "POST",  "PUT",  "DELETE",
                                   "CONNECT", "OPTIONS", "TRACE", "PATCH"};
    if (std::find(std::begin(kKnown), std::end(kKnown), req.method) == std::end(kKnown)) {
      return SendError(res, MakeError(501, "invalid_request_error",
                                      "method " + req.method + " is not implemented"));
    }
    const std::string allow =
        std::string(route.method) == "GET" ? "GET, HEAD" : std::string(route.method);
    res.SetHeader("Allow", allow);  // required with 405 (RFC 9110 §15.5.6)
    return SendError(res, MakeError(405, "invalid_request_error",
                                    req.path + " accepts " + allow + ", not " + req.method));
  }
  SendError(res, MakeError(404, "invalid_request_error", "no such route: " + req.path));
}

void HttpServer::Impl::Health(const HttpExchange&, HttpResponse& res) {
  if (shutting_down.load()) return SendError(res, MakeError(503, "server_error", "shutting down"));
  res.SetContent("{\"status\":\"ok\"}", "application/json");
}

void HttpServer::Impl::Metrics(const HttpExchange&, HttpResponse& res) {
  res.SetContent(engine.metrics().Render(), "text/plain; version=0.0.4; charset=utf-8");
}

void HttpServer::Impl::Models(const HttpExchange&, HttpResponse& res) {
  json model_json = {{"id", options.model_name},
                     {"object", "model"},
                     {"created", UnixSeconds()},
                     {"owned_by", "kvq"},
                     {"max_model_len", engine.max_model_len()}};
  json body = {{"object", "list"}, {"data", json::array({model_json})}};
  res.SetContent(body.dump(), "application/json");
}

// The body must be JSON. Whatever Content-Type says (curl -d sends
// application/x-www-form-urlencoded), a body that parses as JSON is taken;
// one that does not gets 400 if it claimed to be JSON, else 415 saying what
// to send. Content codings are not decoded: 415 (RFC 9110 §15.5.16).
bool HttpServer::Impl::CheckBody(const HttpRequest& req, HttpResponse& res) {
  const std::string encoding = req.Header("content-encoding");
  if (!encoding.empty() && encoding != "identity") {
    res.SetHeader("Accept-Encoding", "identity");
    SendError(res, MakeError(415, "invalid_request_error",
                             "Content-Encoding '" + encoding +
                                 "' is not supported: send the JSON body uncompressed"));
    return false;
  }
  if (req.body.empty()) {
    SendError(res, MakeError(400, "invalid_request_error",
                             "the request has no body: send a JSON object with "
                             "Content-Type: application/json"));
    return false;
  }
  const std::string type = req.Header("content-type");
  const bool says_json = type.empty() || type.find("json") != std::string::npos;
  if (!says_json && !json::accept(req.body)) {
    SendError(res, MakeError(415, "invalid_request_error",
                             "the body is sent as '" + type +
                                 "' and is not JSON: send a JSON object with Content-Type: "
                                 "application/json"));
    return false;
  }
  return true;
}

// The prompt as token ids, exactly as `kvq generate` builds them for the
// same text; false after answering an error.
bool HttpServer::Impl::PromptIds(const CompletionRequest& request, bool chat,
                                 std::vector<int32_t>* out, HttpResponse& res) {
  const int64_t vocab = model.transformer->config().vocab_size;
  StatusOr<std::vector<int32_t>> ids = std::vector<int32_t>{};
  if (chat) {
    ids = ChatPromptIds(model, request.messages);
  } else if (!request.prompt_ids.empty()) {
    ids = request.prompt_ids;
    for (int32_t id : request.prompt_ids) {
      if (id >= vocab) {
        SendError(res, MakeError(400, "invalid_request_error",
                                 "token id " + std::to_string(id) + " is outside the " +
                                     "vocabulary of " + std::to_string(vocab),
                                 "", "prompt"));
        return false;
      }
    }
  } else {
    ids = BuildPrompt(model, request.prompt, /*chat=*/false);
  }
  if (!ids.ok()) {
    SendError(res, MakeError(400, "invalid_request_error", ids.status().message(), "",
                             chat ? "messages" : "prompt"));
    return false;
  }
  for (const auto& [id, bias] : request.logit_bias) {
    if (id >= vocab) {
      SendError(res, MakeError(400, "invalid_request_error",
                               "logit_bias names token " + std::to_string(id) +
                                   ", outside the vocabulary of " + std::to_string(vocab),
                               "", "logit_bias"));
      return false;
    }
  }
  *out = std::move(ids).value();
  return true;
}

// Body -> validated request -> what the engine runs; false after answering
// an error.
bool HttpServer::Impl::Prepare(const HttpRequest& req, bool chat, CompletionRequest* request,
                               ServeRequest* serve, HttpResponse& res) {
  ApiError error;
  if (!CheckBody(req, res)) return false;
  if (!ParseCompletionRequest(req.body, chat, request, &error)) {
    SendError(res, error);
    return false;
  }
  // One model: a request that names none gets it (as vLLM and llama-server
  // do); a request that names another is refused.
  if (request->model.empty()) request->model = options.model_name;
  if (request->model != options.model_name) {
    SendError(res, MakeError(404, "invalid_request_error",
                             "The model '" + request->model + "' does not exist; this " +
                                 "server serves '" + options.model_name + "'.",
                             "model_not_found", "model"));
    return false;
  }
  if (!PromptIds(*request, chat, &serve->prompt, res)) return false;
  const int64_t prompt_tokens = static_cast<int64_t>(serve->prompt.size());
  if (request->max_tokens) {
    serve->max_tokens = *request->max_tokens;
  } else {
    // vLLM's defaults: 16 for completions, the rest of the context for chat.
    const int64_t room = engine.MaxNewTokens(prompt_tokens);
    if (room < 1) {
      SendError(res, MakeError(400, "invalid_request_error",
                               "the prompt is " + std::to_string(prompt_tokens) +
                                   " tokens, which leaves no room to generate: this server's "
                                   "context (--max-model-len) and KV cache hold " +
                                   std::to_string(prompt_tokens + room) + " tokens per request",
                               "context_length_exceeded", chat ? "messages" : "prompt"));
      return false;
    }
    serve->max_tokens = chat ? room : std::min(options.default_max_tokens, room);
  }
  SamplingParams& sampling = serve->sampling;
  sampling.temperature = request->temperature;
  sampling.top_p = request->top_p;
  sampling.top_k = request->top_k;
  sampling.presence_penalty = request->presence_penalty;
  sampling.frequency_penalty = request->frequency_penalty;
  sampling.logit_bias = request->logit_bias;
  sampling.seed = request->seed ? *request->seed : RandomSeed();
  serve->stop = request->stop;
  serve->stop_at_eos = !request->ignore_eos;
  serve->logprobs = request->logprobs;
  return true;
}

void HttpServer::Impl::HandleCompletion(const HttpExchange& exchange, HttpResponse& res,
                                        bool chat) {
  // A stream stays open after the handler returns: its releaser decrements.
  ++open_requests;
  struct Done {
    std::atomic<int64_t>* count;
    ~Done() {
      if (count != nullptr) --*count;
    }
  } done{&open_requests};
  CompletionRequest request;
  ServeRequest serve;
  if (!Prepare(exchange.request, chat, &request, &serve, res)) return;
  if (shutting_down.load()) {
    res.SetHeader("Retry-After", "5");
    return SendError(res, MakeError(503, "server_error", "the server is shutting down"));
  }
  SubmitResult submitted = engine.Submit(std::move(serve));
  switch (submitted.outcome) {
    case SubmitOutcome::kAccepted:
      break;
    case SubmitOutcome::kInvalid:
      return SendError(res, MakeError(400, "invalid_request_error", submitted.message,
                                      "context_length_exceeded", "max_tokens"));
    case SubmitOutcome::kQueueFull:
      res.SetHeader("Retry-After", "1");
      return SendError(
          res, MakeError(429, "rate_limit_exceeded", submitted.message, "rate_limit_exceeded"));
    case SubmitOutcome::kShuttingDown:
      res.SetHeader("Retry-After", "5");
      return SendError(res, MakeError(503, "server_error", submitted.message));
  }
  auto state = std::make_shared<StreamState>();
  state->request = std::move(request);
  state->id = NewId(chat);
  state->created = UnixSeconds();
  state->channel = submitted.channel;
  state->socket = exchange.socket;
  if (state->request.echo) {
    state->echo_text = state->request.prompt_ids.empty()
                           ? state->request.prompt
                           : model.tokenizer->Decode(state->request.prompt_ids);
  }
  if (state->request.stream) {
    done.count = nullptr;
    return Stream(res, state);
  }
  AnswerWhole(res, *state);
}

// Not streaming: nothing is written until the end, so the only sign of a
// client that has gone is its socket. Look at least every 50 ms (a poll(2)
// without waiting) and cancel at once: the blocks go back to the others at
// the engine's next step.
void HttpServer::Impl::AnswerWhole(HttpResponse& res, StreamState& state) {
  std::string text = state.echo_text;
  std::vector<TokenLogprob> logprobs;
  while (true) {
    std::vector<RequestEvent> events;
    state.channel->Pop(&events, std::chrono::milliseconds(50));
    const bool ended = !events.empty() && events.back().final;
    if (!ended && PeerClosed(state.socket)) {
      engine.Cancel(state.channel);
      return SendError(res,
                       MakeError(400, "invalid_request_error", "the client closed the connection"));
    }
    for (RequestEvent& event : events) {
      text += event.text;
      for (TokenLogprob& e : event.logprobs) logprobs.push_back(std::move(e));
      if (!event.final) continue;
      if (event.finish_reason == "error") {
        return SendError(res, MakeError(500, "server_error", "generation failed: " + event.error));
      }
      if (event.finish_reason == "cancelled") {
        return SendError(res, MakeError(503, "server_error",
                                        "the request was cancelled (server shutting down)"));
      }
      const CompletionUsage usage{event.prompt_tokens, event.completion_tokens};
      const ChoiceLogprobs choice_logprobs = WithText(logprobs, &state.text_offset);
      res.SetContent(
          CompletionJson(state.request, state.id, state.created, text, event.finish_reason, usage,
                         state.request.logprobs >= 0 ? &choice_logprobs : nullptr),
          "application/json");
      return;
    }
  }
}

void HttpServer::Impl::Stream(HttpResponse& res, std::shared_ptr<StreamState> state) {
  res.SetHeader("Cache-Control", "no-cache");
  EngineLoop* engine_ptr = &engine;
  std::atomic<int64_t>* open = &open_requests;
  const Impl* impl = this;
  res.content_type = "text/event-stream";
  res.stream = [state, impl](StreamSink& sink) {
    // A closed socket ends the stream at once (the releaser cancels the
    // request); a write would only notice at the second attempt.
    if (PeerClosed(state->socket)) return false;
    auto write = [&](const std::string& data) {
      state->last_write = std::chrono::steady_clock::now();
      return sink.Write(data);
    };
    if (!state->echo_text.empty()) {
      const std::string prompt = std::move(state->echo_text);
      state->echo_text.clear();
      if (!write(
              StreamChunk(state->request, state->id, state->created, prompt, "", true, nullptr))) {
        return false;
      }
      state->first = false;
    }
    // With log probabilities each chunk carries its tokens' entries.
    auto chunk_logprobs = [&](const RequestEvent& event) {
      std::optional<ChoiceLogprobs> out;
      if (state->request.logprobs >= 0) {
        out = impl->WithText(event.logprobs, &state->text_offset);
      }
      return out;
    };
    std::vector<RequestEvent> events;
    if (!state->channel->Pop(&events, std::chrono::milliseconds(100))) {
      // Nothing to send (queued or a long prefill). Where the socket is
      // unknown, an SSE comment now and then finds a client that has
      // gone when the write fails.
      if (std::chrono::steady_clock::now() - state->last_write > std::chrono::seconds(2)) {
        return write(": keep-alive\n\n");
      }
      return true;
    }
    for (const RequestEvent& event : events) {
      if (!event.final) {
        if (event.text.empty() && event.logprobs.empty()) continue;
        const auto logprobs = chunk_logprobs(event);
        if (!write(StreamChunk(state->request, state->id, state->created, event.text, "",
                               state->first, nullptr, logprobs ? &*logprobs : nullptr))) {
          return false;
        }
        state->first = false;
        continue;
      }
      state->done = true;
      if (!WriteFinalEvent(*state, event, chunk_logprobs(event), write)) return false;
      sink.Done();
      return true;
    }
    return true;
  };
  res.stream_end = [state, engine_ptr, open](bool) {
    // The stream ended before the final event: the client went away.
    if (!state->done) engine_ptr->Cancel(state->channel);
    --*open;
  };
}

HttpServer::HttpServer(const LoadedModel& model, EngineLoop& engine,
                       const HttpServerOptions& options)
    : impl_(std::make_unique<Impl>(model, engine, options)) {
  HttpListenerOptions lo;
  lo.host = options.host;
  lo.port = options.port;
  lo.limits.max_body_bytes = options.max_body_bytes;
  lo.worker_threads = options.http_threads;
  lo.max_connections = options.max_connections;
  lo.head_timeout = options.head_timeout;
  lo.body_timeout = options.body_timeout;
  lo.idle_timeout = options.idle_timeout;
  Impl* impl = impl_.get();
  impl_->listener = std::make_unique<HttpListener>(
      lo,
      [impl](const HttpExchange& exchange, HttpResponse& res) {
        impl->Handle(exchange, res);
        if (impl->shutting_down.load()) res.close = true;
      },
      [](int status, const std::string& message) {
        return ApiErrorJson(
            MakeError(status, status >= 500 ? "server_error" : "invalid_request_error", message));
      });
}

HttpServer::~HttpServer() = default;

StatusOr<int> HttpServer::Bind() { return impl_->listener->Bind(); }
void HttpServer::Listen() { impl_->listener->Run(); }
void HttpServer::Stop() { impl_->listener->Stop(); }
void HttpServer::SetShuttingDown() { impl_->shutting_down.store(true); }
int64_t HttpServer::OpenRequests() const { return impl_->open_requests.load(); }

bool HttpServer::WaitRequestsAnswered(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (impl_->open_requests.load() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace kvq
