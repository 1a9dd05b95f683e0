// libFuzzer target: raw HTTP request bytes. Each input goes (1) through the
// request reader whole and in pieces (the split taken from the input), which
// must agree and stay within every limit, and (2) over a loopback socket to
// the real HttpListener (the server's event loop, deadlines and response
// writer), which must answer with well-formed HTTP/1.1 or close, never
// crash or hang. Small limits so the fuzzer reaches them.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "../tests/server/raw_http.h"
#include "server/http1.h"
#include "server/http_listener.h"

namespace {

kvq::HttpLimits Limits() {
  kvq::HttpLimits limits;
  limits.max_target_bytes = 256;
  limits.max_head_bytes = 2048;
  limits.max_fields = 16;
  limits.max_body_bytes = 4096;
  return limits;
}

struct Outcome {
  int status = 0;
  std::vector<std::string> bodies;
};

Outcome Read(const std::string& input, size_t step) {
  kvq::HttpRequestReader reader(Limits());
  Outcome out;
  using State = kvq::HttpRequestReader::State;
  size_t at = 0;
  State s = State::kNeedMore;
  while (true) {
    if (s == State::kComplete) {
      const kvq::HttpRequest r = reader.TakeRequest();
      if (r.body.size() > Limits().max_body_bytes) __builtin_trap();
      out.bodies.push_back(r.body);
      s = reader.Resume();
      continue;
    }
    if (s == State::kHeadComplete) {
      s = reader.Resume();
      continue;
    }
    if (s == State::kError) {
      out.status = reader.error_status();
      if (out.status < 400 || out.status > 505 || reader.error_message().empty()) __builtin_trap();
      break;
    }
    if (at >= input.size()) break;
    const size_t n = std::min(step, input.size() - at);
    s = reader.Feed(input.data() + at, n);
    at += n;
    // Held bytes never exceed the head limit plus one piece.
    if (reader.buffered() > Limits().max_head_bytes + step + 16 && s == State::kNeedMore &&
        reader.request().method.empty()) {
      __builtin_trap();
    }
  }
  return out;
}

struct Server {
  std::unique_ptr<kvq::HttpListener> listener;
  std::thread thread;
  int port = 0;
  Server() {
    kvq::HttpListenerOptions o;
    o.port = 0;
    o.limits = Limits();
    o.worker_threads = 2;
    o.head_timeout = o.body_timeout = o.idle_timeout = std::chrono::milliseconds(200);
    o.write_timeout = std::chrono::milliseconds(1000);
    listener = std::make_unique<kvq::HttpListener>(
        o,
        [](const kvq::HttpExchange& ex, kvq::HttpResponse& res) {
          if (ex.request.path == "/stream") {
            auto left = std::make_shared<int>(3);
            res.stream = [left](kvq::StreamSink& sink) {
              if ((*left)-- <= 0) {
                sink.Done();
                return true;
              }
              return sink.Write("data: x\n\n");
            };
            return;
          }
          res.SetContent(std::to_string(ex.request.body.size()), "text/plain");
        },
        [](int, const std::string& message) { return message; });
    auto bound = listener->Bind();
    if (!bound.ok()) __builtin_trap();
    port = *bound;
    thread = std::thread([this] { listener->Run(); });
  }
};

void OverSocket(const std::string& input) {
  static Server* server = new Server();  // lives for the whole fuzzing run
  const int fd = kvq::RawConnect(server->port, 5);
  if (fd < 0) __builtin_trap();
  kvq::RawSend(fd, input);
  shutdown(fd, SHUT_WR);
  // The server answers what it parsed, then closes (it sees the end of the
  // input); the bytes are responses, starting with a status line. A recv
  // timeout (5 s) means the server hung.
  std::string all;
  char data[4096];
  ssize_t n;
  while ((n = recv(fd, data, sizeof(data), 0)) > 0) all.append(data, static_cast<size_t>(n));
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) __builtin_trap();
  if (!all.empty()) {
    if (all.size() < 12 || all.rfind("HTTP/1.1 ", 0) != 0) __builtin_trap();
    const int status = std::atoi(all.substr(9, 3).c_str());
    if (status < 100 || status > 599) __builtin_trap();
  }
  close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t step = 1 + data[0] % 32;
  const std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Outcome whole = Read(input, input.size() + 1);
  const Outcome pieces = Read(input, step);
  if (whole.status != pieces.status || whole.bodies != pieces.bodies) __builtin_trap();
  OverSocket(input);
  return 0;
}
