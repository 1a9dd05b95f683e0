// kvq's own worker threads for the decode step's parallel loops.
//
// Why not OpenMP: a decode step is some 250 short parallel loops (one per
// weight product and per layer's attention), and between two of them
// libgomp's idle workers spin for up to 300k iterations before they sleep.
// On an idle machine that is what makes the loops cheap; with one of the
// cores busy elsewhere the spinning worker holds the core the caller needs
// and decode falls from 116 to 0.8 tokens/s (docs/benchmarks.md, "OpenMP's
// wait policy on a shared machine"). libgomp takes its spin count only from
// the environment, read once when it loads, and kvq takes no settings from
// the environment. This pool spins for a bounded time (`poll_us`), yielding
// the core while it spins, then sleeps on a futex.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvq {

enum class Schedule {
  kStatic,   // contiguous blocks of tasks, one per thread (OpenMP's static)
  kDynamic,  // one task at a time to whichever thread is free
};

class ThreadPool {
 public:
  // How long an idle thread polls for the next loop (or the caller for the
  // workers to finish) before it sleeps. Measured in docs/benchmarks.md
  // ("kvq's own thread pool").
  static constexpr int kDefaultPollMicros = 1000;

  // `num_threads` counts the caller, which runs a share of every loop:
  // num_threads - 1 workers are started (none for 1; values below 1 mean 1).
  explicit ThreadPool(int num_threads, int poll_us = kDefaultPollMicros);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Sets the polling time (0: sleep at once); takes effect from the next
  // wait of each thread.
  void SetPollMicros(int poll_us) { poll_us_.store(std::max(0, poll_us)); }
  int poll_us() const { return poll_us_.load(std::memory_order_relaxed); }

  // Calls fn(thread) once on each of min(size(), max_threads) threads,
  // thread in [0, that count); the caller is thread 0. Returns when every
  // call has returned. Not reentrant: fn must not use this pool, and one
  // caller thread at a time.
  template <class Fn>
  void RunOnThreads(int max_threads, Fn&& fn) {
    const int threads = std::max(1, std::min(size(), max_threads));
    if (threads == 1) {
      fn(0);
      return;
    }
    using F = std::remove_reference_t<Fn>;
    Dispatch(
        threads, [](void* ctx, int thread) { (*static_cast<F*>(ctx))(thread); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Calls fn(task, thread) for every task in [0, num_tasks) on up to
  // max_threads threads. Which thread runs a task never changes a result in
  // kvq: tasks write disjoint outputs and `thread` only picks scratch.
  template <class Fn>
  void ForEach(int64_t num_tasks, Schedule schedule, Fn&& fn,
               int max_threads = std::numeric_limits<int>::max()) {
    if (num_tasks <= 0) return;
    const int threads =
        static_cast<int>(std::min<int64_t>(std::min(size(), max_threads), num_tasks));
    if (schedule == Schedule::kStatic) {
      RunOnThreads(threads, [&](int thread) {
        const auto [begin, end] = StaticRange(num_tasks, threads, thread);
        for (int64_t task = begin; task < end; ++task) fn(task, thread);
      });
      return;
    }
    std::atomic<int64_t> next{0};
    RunOnThreads(threads, [&](int thread) {
      for (int64_t task = next.fetch_add(1, std::memory_order_relaxed); task < num_tasks;
           task = next.fetch_add(1, std::memory_order_relaxed)) {
        fn(task, thread);
      }
    });
  }

  // Thread `thread`'s share of `num_tasks` split into `threads` contiguous
  // blocks the way OpenMP's static schedule splits them.
  static std::pair<int64_t, int64_t> StaticRange(int64_t num_tasks, int threads, int thread);

 private:
  using Call = void (*)(void* ctx, int thread);
  void Dispatch(int threads, Call call, void* ctx);
  void WorkerLoop(int thread);

  std::atomic<int> poll_us_;
  // A loop is published by bumping epoch_ (workers wait for it to change);
  // pending_ counts the workers still inside it (the caller waits for 0).
  std::atomic<uint32_t> epoch_{0};
  std::atomic<uint32_t> pending_{0};
  Call call_ = nullptr;
  void* ctx_ = nullptr;
  int threads_ = 0;  // threads of the current loop
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvq
