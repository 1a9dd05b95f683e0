// The HTTP server in-process on a loopback port over the tiny model: a dense
// 256-token cache, the scheduler, the engine loop and a listener thread,
// stopped (engine first, then the answered requests, then the listener) when
// the test ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

#include "server/engine_loop.h"
#include "server/http_server.h"
#include "server/scheduler.h"
#include "server/test_model.h"

namespace kvq {

class LiveServerTest : public TinyServerModelTest {
 protected:
  // Loads the model on one thread and starts serving on options.port (0: any
  // free port, then in port_). Wrap in ASSERT_NO_FATAL_FAILURE.
  void StartServer(const HttpServerOptions& options, const EngineLoopOptions& loop = {}) {
    ASSERT_NO_FATAL_FAILURE(LoadTinyModel(1));
    ASSERT_NO_FATAL_FAILURE(NewDenseCache());
    SchedulerOptions scheduling;
    scheduling.max_model_len = 256;
    auto scheduler = Scheduler::Create(*model_.transformer, *model_.tokenizer, *cache_, scheduling);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status().message();
    engine_ = std::make_unique<EngineLoop>(std::move(scheduler).value(), *cache_, loop);
    http_ = std::make_unique<HttpServer>(model_, *engine_, options);
    auto port = http_->Bind();
    ASSERT_TRUE(port.ok()) << port.status().message();
    port_ = *port;
    engine_->Start();
    listener_ = std::thread([this] { http_->Listen(); });
  }
  void TearDown() override {
    if (!listener_.joinable()) return;
    engine_->Stop();
    http_->WaitRequestsAnswered(std::chrono::seconds(5));
    http_->Stop();
    listener_.join();
  }

  std::unique_ptr<EngineLoop> engine_;
  std::unique_ptr<HttpServer> http_;
  std::thread listener_;
  int port_ = 0;
};

}  // namespace kvq
