// The HTTP server in-process on a loopback port, driven over real sockets:
// clients that disconnect while their request runs are cancelled and their
// KV blocks freed, as /metrics shows.
#include "server/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "engine/loaded_model.h"
#include "server/live_server.h"
#include "server/raw_http.h"

namespace kvq {
namespace {

using Seconds = std::chrono::duration<double>;

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  timeval timeout{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// GET over a fresh connection; returns the body ("" on failure).
std::string HttpGet(int port, const std::string& path) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  std::string response;
  if (SendAll(fd, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")) {
    char buffer[4096];
    ssize_t n;
    while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

class HttpServerTest : public LiveServerTest {
 protected:
  void SetUp() override {
    LiveServerTest::SetUp();
    if (IsSkipped()) return;
    HttpServerOptions options;
    options.port = 0;
    options.model_name = "tiny";
    options.http_threads = 4;
    ASSERT_NO_FATAL_FAILURE(StartServer(options));
  }

  std::string Metrics() { return HttpGet(port_, "/metrics"); }

  // Sends a long completion on its own connection, waits until it holds KV
  // blocks and has produced tokens, closes the connection, and returns the
  // seconds until /metrics shows every block free again (-1: never).
  double SecondsToFreeAfterDisconnect(bool stream) {
    const nlohmann::json body = {{"model", "tiny"},          {"prompt", "Hello there"},
                                 {"max_tokens", kMaxTokens}, {"temperature", 0},
                                 {"ignore_eos", true},       {"stream", stream}};
    const int fd = Connect(port_);
    EXPECT_GE(fd, 0);
    EXPECT_TRUE(SendAll(fd,
                        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        "Content-Type: application/json\r\nContent-Length: " +
                            std::to_string(body.dump().size()) + "\r\n\r\n" + body.dump()));
    bool running = false;
    for (int i = 0; i < 3000 && !running; ++i) {  // 30 s at most
      const std::string m = Metrics();
      running = Metric(m, "kvq_kv_blocks_used") > 0 && Metric(m, "kvq_generation_tokens_total") > 0;
      if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(running) << "the request never started";
    const auto closed = std::chrono::steady_clock::now();
    close(fd);
    for (int i = 0; i < 2000; ++i) {  // 20 s at most
      if (Metric(Metrics(), "kvq_kv_blocks_used") == 0) {
        return Seconds(std::chrono::steady_clock::now() - closed).count();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return -1;
  }

  // Long enough that the request is still running when the test closes its
  // socket: a token of this model takes milliseconds (its 151K-token output
  // projection), so 230 tokens take well over a second.
  static constexpr int kMaxTokens = 230;

  // The request stops before its last token, is counted as cancelled, and its
  // blocks are free soon after the client closes.
  void ExpectCancelledAndFreed(bool stream) {
    const double seconds = SecondsToFreeAfterDisconnect(stream);
    ASSERT_GE(seconds, 0) << "blocks never freed:\n" << Metrics();
    const std::string m = Metrics();
    EXPECT_LT(Metric(m, "kvq_generation_tokens_total"), kMaxTokens) << m;
    EXPECT_NE(m.find("kvq_request_success_total{finished_reason=\"cancelled\"} 1\n"),
              std::string::npos)
        << m;
    // Detection polls every 50 ms and the engine drops the request at its next
    // step (milliseconds); 2 s leaves room for a shared, loaded core.
    EXPECT_LT(seconds, 2.0);
    std::printf("blocks free %.3f s after the client closed (%s)\n", seconds,
                stream ? "streaming" : "non-streaming");
  }
};

// Non-streaming: nothing is written until the end, so only the socket tells
// the server its client has gone; the request must not run to completion.
TEST_F(HttpServerTest, ClosedNonStreamingRequestIsCancelledAndFreed) {
  ExpectCancelledAndFreed(/*stream=*/false);
}

TEST_F(HttpServerTest, ClosedStreamIsCancelledAndFreed) {
  ExpectCancelledAndFreed(/*stream=*/true);
}

// The plain routes over the same raw-socket client.
TEST_F(HttpServerTest, HealthAndModelsAnswer) {
  EXPECT_EQ(HttpGet(port_, "/health"), "{\"status\":\"ok\"}");
  const auto models = nlohmann::json::parse(HttpGet(port_, "/v1/models"), nullptr, false);
  ASSERT_FALSE(models.is_discarded());
  EXPECT_EQ(models["data"][0]["id"], "tiny");
}

// Draining (SIGTERM in kvq serve): /health turns 503 at once and every
// answer closes its connection, so a proxy drops the connections it keeps
// alive to this replica and retries the refused completion elsewhere; a
// stream that was already running still ends normally.
TEST_F(HttpServerTest, ShuttingDownRefusesWithCloseAndFinishesStreams) {
  const int kept = RawConnect(port_);
  ASSERT_GE(kept, 0);
  std::string buffer;
  const std::string health = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  ASSERT_TRUE(RawSend(kept, health));
  RawResponse r = RawRead(kept, &buffer);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.count("connection"), 0u);  // kept alive

  const nlohmann::json body = {{"prompt", "Hello there"},
                               {"max_tokens", 40},
                               {"ignore_eos", true},
                               {"stream", true},
                               {"temperature", 0}};
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " +
                           std::to_string(body.dump().size()) + "\r\n\r\n" + body.dump();
  const int streaming = RawConnect(port_);
  ASSERT_GE(streaming, 0);
  ASSERT_TRUE(RawSend(streaming, post));
  // The stream holds KV blocks before the server starts draining.
  bool running = false;
  for (int i = 0; i < 3000 && !running; ++i) {  // 30 s at most
    running = Metric(Metrics(), "kvq_kv_blocks_used") > 0;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(running) << "the stream never started";

  http_->SetShuttingDown();
  engine_->StopAccepting();
  ASSERT_TRUE(RawSend(kept, health));
  r = RawRead(kept, &buffer);
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.headers["connection"], "close");
  EXPECT_TRUE(RawClosed(kept));
  close(kept);
  r = RawExchange(port_, post);
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.headers["connection"], "close");
  EXPECT_EQ(r.headers["retry-after"], "5");

  std::string stream_buffer;
  r = RawRead(streaming, &stream_buffer);
  close(streaming);
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\"finish_reason\":\"length\""), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("data: [DONE]"), std::string::npos) << r.body;
  EXPECT_TRUE(engine_->WaitIdle(std::chrono::seconds(30)));
  EXPECT_TRUE(http_->WaitRequestsAnswered(std::chrono::seconds(5)));
  EXPECT_EQ(http_->OpenRequests(), 0);
}

}  // namespace
}  // namespace kvq
