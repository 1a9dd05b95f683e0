#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

namespace kvq {
namespace {

// Every task of [0, n) runs exactly once, on a thread index below the
// number of threads the loop may use.
void ExpectEachTaskOnce(ThreadPool& pool, int64_t n, Schedule schedule, int max_threads) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
  std::atomic<int> bad_thread{0};
  const int allowed = std::min(pool.size(), max_threads);
  pool.ForEach(
      n, schedule,
      [&](int64_t task, int thread) {
        runs[static_cast<size_t>(task)].fetch_add(1);
        if (thread < 0 || thread >= allowed) bad_thread.fetch_add(1);
      },
      max_threads);
  for (int64_t t = 0; t < n; ++t) {
    ASSERT_EQ(runs[static_cast<size_t>(t)].load(), 1) << "task " << t << " of " << n;
  }
  EXPECT_EQ(bad_thread.load(), 0);
}

TEST(ThreadPool, EveryTaskRunsOnceForAnyCountScheduleAndThreadLimit) {
  for (int size : {1, 2, 3, 5}) {
    ThreadPool pool(size);
    ASSERT_EQ(pool.size(), size);
    for (int64_t n : {0, 1, 2, 3, 4, 7, 64, 1001}) {
      for (Schedule s : {Schedule::kStatic, Schedule::kDynamic}) {
        for (int max_threads : {1, 2, 4, 1 << 20}) {
          ExpectEachTaskOnce(pool, n, s, max_threads);
        }
      }
    }
  }
}

TEST(ThreadPool, ThreadCountsBelowOneMeanTheCallerAlone) {
  for (int size : {0, -3}) {
    ThreadPool pool(size);
    EXPECT_EQ(pool.size(), 1);
    const std::thread::id caller = std::this_thread::get_id();
    int calls = 0;
    pool.ForEach(5, Schedule::kDynamic, [&](int64_t, int thread) {
      EXPECT_EQ(std::this_thread::get_id(), caller);
      EXPECT_EQ(thread, 0);
      ++calls;
    });
    EXPECT_EQ(calls, 5);
  }
}

// RunOnThreads calls each thread index once, each on its own OS thread, the
// caller being index 0.
TEST(ThreadPool, RunOnThreadsGivesEachIndexItsOwnThread) {
  ThreadPool pool(4);
  for (int max_threads : {1, 2, 3, 4, 9}) {
    const int expected = std::min(4, max_threads);
    std::vector<std::thread::id> ids(static_cast<size_t>(expected));
    std::atomic<int> calls{0};
    pool.RunOnThreads(max_threads, [&](int thread) {
      ids[static_cast<size_t>(thread)] = std::this_thread::get_id();
      calls.fetch_add(1);
    });
    EXPECT_EQ(calls.load(), expected);
    EXPECT_EQ(ids[0], std::this_thread::get_id());
    EXPECT_EQ(std::set<std::thread::id>(ids.begin(), ids.end()).size(), ids.size());
  }
}

// OpenMP's static split: contiguous, in order, covering [0, n), sizes
// differing by at most one with the larger shares first.
TEST(ThreadPool, StaticRangesTileTheTasksLikeOpenMp) {
  for (int64_t n : {0, 1, 5, 8, 13, 100}) {
    for (int threads : {1, 2, 3, 7}) {
      int64_t next = 0, previous_size = n + 1;
      for (int t = 0; t < threads; ++t) {
        const auto [begin, end] = ThreadPool::StaticRange(n, threads, t);
        EXPECT_EQ(begin, next) << n << " over " << threads;
        EXPECT_LE(end - begin, previous_size);
        EXPECT_LE(end - begin, n / threads + 1);
        EXPECT_GE(end - begin, n / threads);
        previous_size = end - begin;
        next = end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

// Many short loops back to back, with every polling time: a lost wake-up
// would hang here (ctest's timeout), a lost task would miscount. Polling 0
// sends every wait through the futex.
TEST(ThreadPool, ManyShortLoopsWithEveryPollingTime) {
  for (int poll_us : {0, 1, 50, 1000}) {
    ThreadPool pool(3, poll_us);
    EXPECT_EQ(pool.poll_us(), poll_us);
    std::atomic<int64_t> sum{0};
    for (int loop = 0; loop < 3000; ++loop) {
      pool.ForEach(loop % 5, loop % 2 ? Schedule::kStatic : Schedule::kDynamic,
                   [&](int64_t task, int) { sum.fetch_add(task + 1); });
    }
    int64_t expected = 0;
    for (int loop = 0; loop < 3000; ++loop) expected += (loop % 5) * (loop % 5 + 1) / 2;
    EXPECT_EQ(sum.load(), expected) << "poll " << poll_us;
  }
}

// The pool's workers may be asleep (polling 0) or polling when it is
// destroyed; both must join. Changing the polling time between loops holds.
TEST(ThreadPool, DestroysWhileWorkersSleepOrPoll) {
  for (int poll_us : {0, 1000000}) {
    ThreadPool pool(4, poll_us);
    std::atomic<int> calls{0};
    pool.RunOnThreads(4, [&](int) { calls.fetch_add(1); });
    EXPECT_EQ(calls.load(), 4);
    pool.SetPollMicros(poll_us == 0 ? 10 : 0);
    pool.RunOnThreads(4, [&](int) { calls.fetch_add(1); });
    EXPECT_EQ(calls.load(), 8);
  }
  ThreadPool never_used(3);
  SUCCEED();
}

TEST(ThreadPool, NegativePollingMeansSleepAtOnce) {
  ThreadPool pool(2, -5);
  EXPECT_EQ(pool.poll_us(), 0);
  pool.SetPollMicros(-1);
  EXPECT_EQ(pool.poll_us(), 0);
}

}  // namespace
}  // namespace kvq
