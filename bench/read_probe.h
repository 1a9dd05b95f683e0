// A sequential memory read-bandwidth probe, so every benchmark can report its
// bytes/s next to what this machine's memory delivers in the same run.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace kvq {

// Sum of `words` 64-bit words with `threads` threads. Integer adds are
// associative, so the compiler vectorizes the reduction and the loads, not
// an add-latency chain, set the speed: a pure read-bandwidth probe.
inline uint64_t SumWords(const uint64_t* p, int64_t words, int threads = 1) {
  uint64_t total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static) if (threads > 1)
  for (int64_t i = 0; i < words; ++i) total += p[i];
  return total;
}

// Best of 5 passes over 512 MiB (far beyond any cache), in GB/s (1e9 bytes).
inline double ProbeReadGBs(int threads) {
  const int64_t words = int64_t{64} << 20;  // 512 MiB
  std::vector<uint64_t> a(static_cast<size_t>(words), 1);
  double best = 0.0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(SumWords(a.data(), words, threads));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(words) * 8 / s / 1e9);
  }
  return best;
}

}  // namespace kvq
