// A sequential memory read-bandwidth probe, so every benchmark can report its
// bytes/s next to what this machine's memory delivers in the same run.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "base/thread_pool.h"

namespace kvq {

// Sum of `words` 64-bit words. Integer adds are associative, so the compiler
// vectorizes the reduction and the loads, not an add-latency chain, set the
// speed: a pure read-bandwidth probe.
inline uint64_t SumWords(const uint64_t* p, int64_t words) {
  uint64_t total = 0;
  for (int64_t i = 0; i < words; ++i) total += p[i];
  return total;
}

// The same on every thread of `pool` (contiguous shares), on the threads the
// benchmarked kernel runs on, so no second set of threads polls beside it.
inline uint64_t SumWords(const uint64_t* p, int64_t words, ThreadPool& pool) {
  std::vector<uint64_t> partial(static_cast<size_t>(pool.size()), 0);
  pool.RunOnThreads(pool.size(), [&](int thread) {
    const auto [begin, end] = ThreadPool::StaticRange(words, pool.size(), thread);
    partial[static_cast<size_t>(thread)] = SumWords(p + begin, end - begin);
  });
  uint64_t total = 0;
  for (uint64_t s : partial) total += s;
  return total;
}

// Best of 5 passes over 512 MiB (far beyond any cache), in GB/s (1e9 bytes).
inline double ProbeReadGBs(int threads) {
  const int64_t words = int64_t{64} << 20;  // 512 MiB
  std::vector<uint64_t> a(static_cast<size_t>(words), 1);
  ThreadPool pool(threads);
  double best = 0.0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(SumWords(a.data(), words, pool));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(words) * 8 / s / 1e9);
  }
  return best;
}

}  // namespace kvq
