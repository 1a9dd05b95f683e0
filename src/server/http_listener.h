// The server's HTTP/1.1 connection handling: one event-loop thread owns
// every connection while its request arrives (non-blocking reads, the
// bounded HttpRequestReader, deadlines), and only whole requests reach the
// handler threads. A slow or idle client therefore costs a descriptor and a
// bounded buffer, never a handler thread, the way nginx's event loop keeps
// slowloris clients from starving a pool. GET/HEAD requests (probes,
// metrics) have their own small pool, so open streams cannot delay them.
//
// Deadlines (each closes the connection; a started request gets 408 first):
//   head_timeout  the first byte of a request to the end of its head
//   body_timeout  the end of the head to the end of the body
//   idle_timeout  a kept-alive connection waiting for its next request
//   write_timeout one write that makes no progress (a client not reading)
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "server/http1.h"

namespace kvq {

struct HttpListenerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0 = any free port
  HttpLimits limits;
  int worker_threads = 64;     // requests handled at once (an open stream holds one)
  int probe_threads = 2;       // GET/HEAD requests
  int max_connections = 1024;  // more are answered 503 and closed
  // Request bytes held by connections still sending their body, all
  // connections together; past it a body gets 503 (bounds memory at
  // max_connections x max_body_bytes otherwise).
  size_t max_buffered_bytes = size_t{256} << 20;
  std::chrono::milliseconds head_timeout{10000};
  std::chrono::milliseconds body_timeout{60000};
  std::chrono::milliseconds idle_timeout{10000};
  std::chrono::milliseconds write_timeout{30000};
};

// A streaming response body: the handler's producer writes through it.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  // False when the client is gone or stopped reading (write_timeout).
  virtual bool Write(std::string_view data) = 0;
  // The body is complete (sends the last chunk).
  virtual void Done() = 0;
};

struct HttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;  // besides the framing ones
  std::string content_type;
  std::string body;
  bool close = false;  // close the connection after this response
  // When set, the body is streamed (chunked; close-delimited for HTTP/1.0):
  // called again and again until it returns false or calls Done().
  std::function<bool(StreamSink&)> stream;
  // Called once after a stream ended: true when Done() was reached.
  std::function<void(bool completed)> stream_end;

  void SetContent(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
  void SetHeader(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
  }
};

struct HttpExchange {
  const HttpRequest& request;
  int socket;  // the connection (for PeerClosed); the handler must not read or close it
};
using HttpHandler = std::function<void(const HttpExchange&, HttpResponse&)>;
// The body of an error the listener answers itself (framing, limits, timeouts).
using HttpErrorBody = std::function<std::string(int status, const std::string& message)>;

class HttpListener {
 public:
  HttpListener(const HttpListenerOptions& options, HttpHandler handler, HttpErrorBody error_body);
  ~HttpListener();  // stops, then waits for running handlers

  // Binds and listens (no SO_REUSEPORT: a port in use is an error). Returns
  // the port (the chosen one for port 0).
  StatusOr<int> Bind();
  // Serves until Stop(); call after Bind.
  void Run();
  // Stops accepting and closes idle connections; running handlers finish.
  void Stop();
  // Connections open now (for tests and /metrics).
  int open_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvq
