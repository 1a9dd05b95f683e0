#include "base/thread_pool.h"

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVQ_CPU_RELAX() _mm_pause()
#else
#define KVQ_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace kvq {
namespace {

// Polls `value` until `done(value)` holds, for at most `poll_us`, then
// sleeps on it (a futex) until it does. While polling the thread yields its
// core every few checks, so on a busy machine the thread that has work to do
// can run instead of the poller.
template <class Done>
void PollThenSleep(const std::atomic<uint32_t>& value, int poll_us, Done done) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + std::chrono::microseconds(poll_us);
  for (int i = 1;; ++i) {
    if (done(value.load(std::memory_order_acquire))) return;
    if (i % 16 != 0) {
      KVQ_CPU_RELAX();
      continue;
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::yield();
  }
  for (uint32_t seen = value.load(std::memory_order_acquire); !done(seen);
       seen = value.load(std::memory_order_acquire)) {
    value.wait(seen, std::memory_order_acquire);
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads, int poll_us) : poll_us_(std::max(0, poll_us)) {
  const int workers = std::max(1, num_threads) - 1;
  workers_.reserve(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w) workers_.emplace_back([this, w] { WorkerLoop(w + 1); });
}

ThreadPool::~ThreadPool() {
  if (workers_.empty()) return;
  stop_ = true;
  epoch_.fetch_add(1, std::memory_order_release);
  epoch_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

std::pair<int64_t, int64_t> ThreadPool::StaticRange(int64_t num_tasks, int threads, int thread) {
  const int64_t base = num_tasks / threads, extra = num_tasks % threads;
  const int64_t begin = thread * base + std::min<int64_t>(thread, extra);
  return {begin, begin + base + (thread < extra ? 1 : 0)};
}

void ThreadPool::Dispatch(int threads, Call call, void* ctx) {
  call_ = call;
  ctx_ = ctx;
  threads_ = threads;
  // Every worker checks in, also those the loop does not use, so none of
  // them still reads call_/threads_ when the next loop writes them.
  pending_.store(static_cast<uint32_t>(workers_.size()), std::memory_order_relaxed);
  epoch_.fetch_add(1, std::memory_order_release);
  epoch_.notify_all();
  call(ctx, 0);
  PollThenSleep(pending_, poll_us(), [](uint32_t left) { return left == 0; });
}

void ThreadPool::WorkerLoop(int thread) {
  uint32_t seen = 0;
  while (true) {
    PollThenSleep(epoch_, poll_us(), [seen](uint32_t epoch) { return epoch != seen; });
    seen = epoch_.load(std::memory_order_acquire);
    if (stop_) return;
    if (thread < threads_) call_(ctx_, thread);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace kvq
