// The OpenAI-compatible HTTP front end over HttpListener (server/
// http_listener.h): routes, API-key check, JSON errors, server-sent-event
// streaming. Generation happens on the EngineLoop's thread; handler threads
// only parse, tokenize, submit and relay the request's channel to the socket.
//
//   POST /v1/completions, POST /v1/chat/completions   (stream: true -> SSE)
//   GET  /v1/models, GET /health, GET /metrics (Prometheus text)
//
// A known route asked with another method gets 405 with Allow (RFC 9110
// §15.5.6), an unknown route 404, an unknown method 501.
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
  std::string api_key;              // empty = no authentication; compared in constant time
  std::string model_name;           // the id /v1/models lists; requests may omit it
  size_t max_body_bytes = 8 << 20;  // larger bodies get 413, whatever their framing
  int http_threads = 64;            // requests handled at once (each stream holds one)
  int max_connections = 1024;       // open connections (idle or slow ones cost no thread)
  std::chrono::milliseconds head_timeout{10000};  // see HttpListenerOptions
  std::chrono::milliseconds body_timeout{60000};
  std::chrono::milliseconds idle_timeout{10000};
  int64_t default_max_tokens = 16;  // completions without max_tokens (OpenAI's default)
};

class HttpServer {
 public:
  HttpServer(const LoadedModel& model, EngineLoop& engine, const HttpServerOptions& options);
  ~HttpServer();

  // Binds the listening socket; returns the port (the chosen one for port 0).
  // A port already in use is an error (no SO_REUSEPORT).
  StatusOr<int> Bind();
  // Serves until Stop(); call after Bind.
  void Listen();
  // Stops accepting and ends Listen (open streams end too: drain the engine first).
  void Stop();
  // While set, /health answers 503, new completions are refused (503,
  // Retry-After) and every response closes its connection, so a proxy's
  // pool of kept-alive connections lets go of this server.
  void SetShuttingDown();
  // Completions received and not yet fully answered (streams included).
  int64_t OpenRequests() const;
  // Waits until every completion has had its final bytes handed to the
  // socket (after the engine stopped, each has a final event to send).
  bool WaitRequestsAnswered(std::chrono::milliseconds timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvq
