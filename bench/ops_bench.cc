// Kernel benchmarks for the ops layer.
//
// Decode matvec is memory-bound, so it reports GB/s of weight bytes read next
// to a read-bandwidth probe (a vectorized integer sum over the same number of
// bytes, same threads, timed alternately with each call) measured in the same process: the ratio,
// not the absolute figure, is what survives the noise of a shared 2-core machine. Weights are
// rotated over enough copies (>= 256 MiB) that every call reads from DRAM, as a real model's decode
// step does. Matmul reports GFLOP/s (2 n rows cols per call) for the routing Matmul uses and for
// the sgemm path beside it.
//
//   build-ops/bin/ops_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "ops/matmul.h"
#include "ops/matvec.h"
#include "ops/weights.h"

namespace kvq::ops {
namespace {

constexpr int64_t kRotateBytes = int64_t{256} << 20;

// `copies` identical encodings of a random [rows, cols] matrix, laid out
// back to back so consecutive calls touch different memory.
struct RotatingWeights {
  WeightType type;
  int64_t rows, cols, copies;
  std::vector<uint8_t> bytes;  // [copies * rows * RowBytes(type, cols)]

  RotatingWeights(WeightType t, int64_t r, int64_t c, int64_t min_total)
      : type(t), rows(r), cols(c) {
    const int64_t one = r * RowBytes(t, c);
    copies = std::max<int64_t>(1, (min_total + one - 1) / one);
    bytes.resize(static_cast<size_t>(copies * one));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
    std::vector<float> row(static_cast<size_t>(c));
    for (int64_t i = 0; i < r; ++i) {
      for (float& v : row) v = dist(rng);
      uint8_t* dst = bytes.data() + i * RowBytes(t, c);
      for (int64_t j = 0; j < c; ++j) {
        if (t == WeightType::kF32) std::memcpy(dst + 4 * j, &row[j], 4);
        const uint16_t h = t == WeightType::kF16 ? F32ToF16(row[j]) : F32ToBf16(row[j]);
        if (t == WeightType::kF16 || t == WeightType::kBF16) std::memcpy(dst + 2 * j, &h, 2);
      }
      if (t == WeightType::kQ8_0) QuantizeRowQ8_0(row.data(), c, reinterpret_cast<BlockQ8_0*>(dst));
    }
    for (int64_t k = 1; k < copies; ++k) std::memcpy(bytes.data() + k * one, bytes.data(), one);
  }
  WeightView view(int64_t k) const {
    return WeightView{type, rows, cols, bytes.data() + (k % copies) * rows * RowBytes(type, cols)};
  }
};

// Sum of `words` 64-bit words with `threads` threads. Integer adds are
// associative, so the compiler vectorizes the reduction and the loads, not
// an add-latency chain, set the speed: a pure read-bandwidth probe.
uint64_t SumWords(const uint64_t* p, int64_t words, int threads) {
  uint64_t total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static) if (threads > 1)
  for (int64_t i = 0; i < words; ++i) total += p[i];
  return total;
}

double ProbeReadGBs(int threads) {
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

void BM_ReadProbe(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t words = int64_t{64} << 20;
  std::vector<uint64_t> a(static_cast<size_t>(words), 1);
  for (auto _ : state) benchmark::DoNotOptimize(SumWords(a.data(), words, threads));
  state.SetBytesProcessed(state.iterations() * words * 8);
}

// Each iteration times one Matvec on the next weight copy (the reported
// time), then the probe reading the same number of bytes from a separate
// rotating buffer with the same thread count. Interleaving makes both see
// the same machine load, so vs_probe = GB/s(matvec) / GB/s(probe) is stable
// even when absolute figures swing with other users of the machine.
void BM_Matvec(benchmark::State& state, WeightType type, int64_t rows, int64_t cols) {
  const int threads = static_cast<int>(state.range(0));
  RotatingWeights w(type, rows, cols, kRotateBytes);
  const int64_t bytes = rows * RowBytes(type, cols);
  const int64_t probe_words = std::max(kRotateBytes, 2 * bytes) / 8;
  std::vector<uint64_t> probe(static_cast<size_t>(probe_words), 1);
  const int64_t window = (bytes + 7) / 8;
  std::vector<float> x(static_cast<size_t>(cols), 0.5f), y(static_cast<size_t>(rows));
  int64_t k = 0, offset = 0;
  double probe_seconds = 0.0, matvec_seconds = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    Matvec(w.view(k++), x.data(), y.data(), threads);
    benchmark::DoNotOptimize(y.data());
    const auto t1 = std::chrono::steady_clock::now();
    if (offset + window > probe_words) offset = 0;
    benchmark::DoNotOptimize(SumWords(probe.data() + offset, window, threads));
    offset += window;
    const auto t2 = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    matvec_seconds += std::chrono::duration<double>(t1 - t0).count();
    probe_seconds += std::chrono::duration<double>(t2 - t1).count();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  const double total = static_cast<double>(state.iterations()) * static_cast<double>(bytes);
  state.counters["GBps"] = total / 1e9 / matvec_seconds;
  state.counters["probe_GBps"] = total / 1e9 / probe_seconds;
  state.counters["vs_probe"] = probe_seconds / matvec_seconds;
}

// Matmul (the routing the model uses) or, for comparison, MatmulSgemm.
void BM_Matmul(benchmark::State& state, WeightType type, int64_t rows, int64_t cols, bool sgemm) {
  const int64_t n = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  RotatingWeights w(type, rows, cols, int64_t{64} << 20);
  std::vector<float> x(static_cast<size_t>(n * cols), 0.25f), y(static_cast<size_t>(n * rows));
  MatmulWorkspace ws;
  int64_t k = 0;
  for (auto _ : state) {
    const WeightView v = w.view(k++);
    if (sgemm) {
      MatmulSgemm(v, x.data(), n, y.data(), threads, &ws);
    } else {
      Matmul(v, x.data(), n, y.data(), threads, &ws);
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * static_cast<double>(n * rows * cols) / 1e9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void RegisterAll() {
  benchmark::RegisterBenchmark("ReadProbe", BM_ReadProbe)->Arg(1)->Arg(2)->UseRealTime();
  const WeightType types[] = {WeightType::kF32, WeightType::kF16, WeightType::kBF16,
                              WeightType::kQ8_0};
  struct Shape {
    int64_t rows, cols;
  };
  // Qwen2.5-0.5B: q/o proj, gate/up, down, tied LM head.
  const Shape shapes[] = {{896, 896}, {4864, 896}, {896, 4864}, {151936, 896}};
  for (const Shape& s : shapes) {
    for (WeightType t : types) {
      for (int threads : {1, 2}) {
        const std::string name = std::string("Matvec/") + WeightTypeName(t) + "/" +
                                 std::to_string(s.rows) + "x" + std::to_string(s.cols);
        benchmark::RegisterBenchmark(name.c_str(), BM_Matvec, t, s.rows, s.cols)
            ->Arg(threads)
            ->ArgName("threads")
            ->UseManualTime();
      }
    }
  }
  for (WeightType t : types) {
    for (const Shape& s : {Shape{896, 896}, Shape{4864, 896}}) {
      for (bool sgemm : {false, true}) {
        const std::string name = std::string(sgemm ? "MatmulSgemm/" : "Matmul/") +
                                 WeightTypeName(t) + "/" + std::to_string(s.rows) + "x" +
                                 std::to_string(s.cols);
        auto* b = benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, t, s.rows, s.cols, sgemm);
        b->ArgNames({"n", "threads"})->UseRealTime();
        for (int threads : {1, 2}) {
          for (int64_t n : {1, 8, 64, 512}) b->Args({n, threads});
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvq::ops

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const double probe1 = kvq::ops::ProbeReadGBs(1);
  const double probe2 = kvq::ops::ProbeReadGBs(2);
  std::printf(
      "read-bandwidth probe (best of 5, 512 MiB sum): 1 thread %.1f GB/s, 2 threads %.1f GB/s\n",
      probe1, probe2);
  kvq::ops::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
