// The engine thread: the only thread that runs the model and touches the KV
// cache. HTTP handler threads Submit() requests into a bounded inbox and read
// the output from the request's channel; the loop moves the inbox into the
// scheduler and runs one scheduler step after another while there is work.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/scheduler.h"

namespace kvq {

struct EngineLoopOptions {
  // Requests waiting for admission (inbox + scheduler queue) at most; more
  // are refused (HTTP 429) instead of queueing without bound. 0 = no queue:
  // a request is taken only when a batch slot is free and nothing waits
  // (an idle server always takes it).
  int64_t max_waiting = 64;
};

enum class SubmitOutcome { kAccepted, kInvalid, kQueueFull, kShuttingDown };

struct SubmitResult {
  SubmitOutcome outcome = SubmitOutcome::kAccepted;
  std::string message;                      // for every outcome but kAccepted
  std::shared_ptr<RequestChannel> channel;  // for kAccepted
};

class EngineLoop {
 public:
  EngineLoop(std::unique_ptr<Scheduler> scheduler, KvCache& cache,
             const EngineLoopOptions& options);
  ~EngineLoop();  // Stop()

  void Start();
  // Thread-safe. Validates against the scheduler's limits and queues.
  SubmitResult Submit(ServeRequest request);
  // Thread-safe (constant limits): see Scheduler::MaxNewTokens.
  int64_t MaxNewTokens(int64_t prompt_tokens) const {
    return scheduler_->MaxNewTokens(prompt_tokens);
  }
  int64_t max_model_len() const { return scheduler_->options().max_model_len; }
  // Thread-safe: the client of `channel` is gone; its blocks are freed at
  // the engine's next step.
  void Cancel(const std::shared_ptr<RequestChannel>& channel);

  // Shutdown, in order: refuse new requests (503), wait up to `timeout` for
  // the running and waiting ones to finish, then Stop().
  void StopAccepting();
  bool WaitIdle(std::chrono::milliseconds timeout);
  // Ends what is left as "cancelled" and joins the engine thread.
  void Stop();

  const ServerMetrics& metrics() const { return metrics_; }
  ServerMetrics& metrics() { return metrics_; }

 private:
  void Run();
  bool IdleLocked() const { return inbox_.empty() && !busy_; }

  std::unique_ptr<Scheduler> scheduler_;
  KvCache& cache_;
  EngineLoopOptions options_;
  ServerMetrics metrics_;

  std::mutex mutex_;  // guards everything below
  std::condition_variable wake_, idle_;
  struct Pending {
    ServeRequest request;
    std::shared_ptr<RequestChannel> channel;
    Clock::time_point arrival;
  };
  std::vector<Pending> inbox_;
  int64_t scheduler_waiting_ = 0;  // the scheduler's queue after the last step
  int64_t scheduler_running_ = 0;  // its running sequences after the last step
  bool QueueFullLocked() const;
  bool busy_ = false;  // the scheduler has running or waiting requests
  bool accepting_ = true;
  bool stop_ = false;
  bool poke_ = false;  // a cancellation arrived: step even if otherwise idle
  std::thread thread_;
};

}  // namespace kvq
