#include "server/engine_loop.h"

#include <cstdio>

namespace kvq {

EngineLoop::EngineLoop(std::unique_ptr<Scheduler> scheduler, KvCache& cache,
                       const EngineLoopOptions& options)
    : scheduler_(std::move(scheduler)), cache_(cache), options_(options) {
  metrics_.RecordStep(StepReport{}, 0, 0, cache_.Usage());
}

EngineLoop::~EngineLoop() { Stop(); }

void EngineLoop::Start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!thread_.joinable() && !stop_) thread_ = std::thread([this] { Run(); });
}

SubmitResult EngineLoop::Submit(ServeRequest request) {
  SubmitResult result;
  const Status valid = scheduler_->Validate(request);
  if (!valid.ok()) {
    result.outcome = SubmitOutcome::kInvalid;
    result.message = valid.message();
    return result;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!accepting_ || stop_) {
      result.outcome = SubmitOutcome::kShuttingDown;
      result.message = "the server is shutting down";
    } else if (QueueFullLocked()) {
      result.outcome = SubmitOutcome::kQueueFull;
      result.message = options_.max_waiting == 0
                           ? "every batch slot is busy and --max-waiting 0 queues nothing; "
                             "retry later"
                           : "too many requests waiting (" + std::to_string(options_.max_waiting) +
                                 "); retry later";
    } else {
      result.channel = std::make_shared<RequestChannel>();
      inbox_.push_back({std::move(request), result.channel, Clock::now()});
    }
  }
  if (result.outcome == SubmitOutcome::kAccepted) {
    wake_.notify_one();
  } else {
    metrics_.RecordRejected();
  }
  return result;
}

bool EngineLoop::QueueFullLocked() const {
  const int64_t waiting = static_cast<int64_t>(inbox_.size()) + scheduler_waiting_;
  if (options_.max_waiting > 0) return waiting >= options_.max_waiting;
  // No queue: accepted only while it can start at the next step, i.e.
  // nothing waits and a batch slot is free.
  return waiting > 0 || scheduler_running_ + static_cast<int64_t>(inbox_.size()) >=
                            scheduler_->options().max_num_seqs;
}

void EngineLoop::Cancel(const std::shared_ptr<RequestChannel>& channel) {
  channel->Cancel();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    poke_ = true;
  }
  wake_.notify_one();
}

void EngineLoop::StopAccepting() {
  std::lock_guard<std::mutex> lock(mutex_);
  accepting_ = false;
}

bool EngineLoop::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return idle_.wait_for(lock, timeout, [this] { return IdleLocked() || stop_; });
}

void EngineLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    accepting_ = false;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
  // Requests that never reached the scheduler (or all, if never started).
  std::vector<Pending> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    left.swap(inbox_);
  }
  for (Pending& p : left) {
    RequestEvent event;
    event.final = true;
    event.finish_reason = "cancelled";
    event.prompt_tokens = static_cast<int64_t>(p.request.prompt.size());
    p.channel->Push(std::move(event));
  }
  if (!left.empty()) metrics_.RecordFinished("cancelled", static_cast<int64_t>(left.size()));
  const int64_t ended = scheduler_->FinishAll("cancelled");
  if (ended > 0) metrics_.RecordFinished("cancelled", ended);
  metrics_.RecordStep(StepReport{}, 0, 0, cache_.Usage());
}

void EngineLoop::Run() {
  while (true) {
    std::vector<Pending> arrived;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stop_ || poke_ || !inbox_.empty() || busy_; });
      if (stop_) break;
      poke_ = false;
      arrived.swap(inbox_);
      // Busy from the moment requests leave the inbox, so WaitIdle never
      // sees them in neither place.
      if (!arrived.empty()) busy_ = true;
    }
    for (Pending& p : arrived) {
      scheduler_->Add(std::move(p.request), std::move(p.channel), p.arrival);
    }
    StepReport report;
    const Status status = scheduler_->Step(&report);
    if (!status.ok())
      std::fprintf(stderr, "kvq serve: step failed: %s\n", status.message().c_str());
    metrics_.RecordStep(report, scheduler_->num_running(), scheduler_->num_waiting(),
                        cache_.Usage());
    bool idle;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      scheduler_waiting_ = scheduler_->num_waiting();
      scheduler_running_ = scheduler_->num_running();
      busy_ = scheduler_->HasWork();
      idle = IdleLocked();
    }
    if (idle) idle_.notify_all();
    if (busy_ && report.batch_sequences == 0) {
      // Nothing could run this step (waiting for blocks that only a
      // cancellation can free): do not spin.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

}  // namespace kvq
