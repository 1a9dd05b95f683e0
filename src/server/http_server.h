// The OpenAI-compatible HTTP front end (cpp-httplib): routes, API-key check,
// body limit, JSON errors, server-sent-event streaming. Generation happens
// on the EngineLoop's thread; handler threads only parse, tokenize, submit
// and relay the request's channel to the socket.
//
//   POST /v1/completions, POST /v1/chat/completions   (stream: true -> SSE)
//   GET  /v1/models, GET /health, GET /metrics (Prometheus text)
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "engine/loaded_model.h"
#include "server/engine_loop.h"

namespace kvq {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0 = any free port (see Bind)
  std::string api_key;              // empty = no authentication
  std::string model_name;           // the id /v1/models lists and requests must name
  size_t max_body_bytes = 8 << 20;  // larger bodies get 413
  int http_threads = 64;            // connections served at once (each stream holds one)
  int64_t default_max_tokens = 16;  // completions without max_tokens (OpenAI's default)
};

class HttpServer {
 public:
  HttpServer(const LoadedModel& model, EngineLoop& engine, const HttpServerOptions& options);
  ~HttpServer();

  // Binds the listening socket; returns the port (the chosen one for port 0).
  StatusOr<int> Bind();
  // Serves until Stop(); call after Bind.
  void Listen();
  // Stops accepting and ends Listen (open streams end too: drain the engine first).
  void Stop();
  // While set, /health answers 503 and new completions are refused.
  void SetShuttingDown();
  // Waits until every completion has had its final bytes handed to the
  // socket (after the engine stopped, each has a final event to send).
  bool WaitRequestsAnswered(std::chrono::milliseconds timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvq
