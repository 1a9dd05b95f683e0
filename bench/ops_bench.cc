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

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "ops/matmul.h"
#include "ops/matvec.h"
#include "ops/matvec_int8.h"
#include "ops/weights.h"
#include "read_probe.h"

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
    if (BlockSize(t) > 1 && t != WeightType::kQ8_0) FillRandomBlocks(t, one);
    for (int64_t k = 1; k < copies; ++k) std::memcpy(bytes.data() + k * one, bytes.data(), one);
  }
  // Other block types: random quant bytes, then every f16 field of every
  // block (d, m/dmin) set to a small finite scale. Speed does not depend on
  // the values, only on them being finite.
  void FillRandomBlocks(WeightType t, int64_t one) {
    std::mt19937 rng(2);
    for (int64_t i = 0; i < one; ++i) bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(rng());
    std::vector<int64_t> halves;
    switch (t) {
      case WeightType::kQ4_1:
      case WeightType::kQ5_1:
      case WeightType::kQ4_K:
      case WeightType::kQ5_K:
        halves = {0, 2};
        break;
      case WeightType::kQ2_K:
        halves = {80, 82};
        break;
      case WeightType::kQ3_K:
        halves = {108};
        break;
      case WeightType::kQ6_K:
        halves = {208};
        break;
      default:
        halves = {0};
        break;
    }
    const uint16_t h = F32ToF16(0.01f);
    for (int64_t b = 0; b < one / BlockBytes(t); ++b) {
      for (int64_t off : halves) std::memcpy(bytes.data() + b * BlockBytes(t) + off, &h, 2);
    }
  }
  WeightView view(int64_t k) const {
    return WeightView{type, rows, cols, bytes.data() + (k % copies) * rows * RowBytes(type, cols)};
  }
};

void BM_ReadProbe(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t words = int64_t{64} << 20;
  std::vector<uint64_t> a(static_cast<size_t>(words), 1);
  ThreadPool pool(threads);
  for (auto _ : state) benchmark::DoNotOptimize(SumWords(a.data(), words, pool));
  state.SetBytesProcessed(state.iterations() * words * 8);
}

// Each iteration times one Matvec on the next weight copy (the reported
// time), then the probe reading the same number of bytes from a separate
// rotating buffer with the same thread count. Interleaving makes both see
// the same machine load, so vs_probe = GB/s(matvec) / GB/s(probe) is stable
// even when absolute figures swing with other users of the machine.
// One decode product: Matvec (exact f32), or with `int8` the integer path
// including its quantization of x (as Matmul runs it).
struct DecodeProduct {
  bool int8;
  std::vector<uint8_t> acts;
  void Run(const WeightView& w, const float* x, float* y, ThreadPool& pool) {
    if (!int8) return Matvec(w, x, y, pool);
    acts.resize(static_cast<size_t>(Int8ActRowBytes(w.type, w.cols)));
    QuantizeActs(w.type, x, 1, w.cols, acts.data());
    MatvecInt8(w, acts.data(), 1, y, pool);
  }
};

void BM_Matvec(benchmark::State& state, WeightType type, int64_t rows, int64_t cols, bool int8) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  RotatingWeights w(type, rows, cols, kRotateBytes);
  const int64_t bytes = rows * RowBytes(type, cols);
  const int64_t probe_words = std::max(kRotateBytes, 2 * bytes) / 8;
  std::vector<uint64_t> probe(static_cast<size_t>(probe_words), 1);
  const int64_t window = (bytes + 7) / 8;
  std::vector<float> x(static_cast<size_t>(cols), 0.5f), y(static_cast<size_t>(rows));
  int64_t k = 0, offset = 0;
  double probe_seconds = 0.0, matvec_seconds = 0.0;
  DecodeProduct product{int8, {}};
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    product.Run(w.view(k++), x.data(), y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    const auto t1 = std::chrono::steady_clock::now();
    if (offset + window > probe_words) offset = 0;
    benchmark::DoNotOptimize(SumWords(probe.data() + offset, window, pool));
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

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Compute speed of the decode kernel alone: one thread, one matrix small
// enough to stay in L2, thread CPU time (steady on a shared machine).
// Gweights_cpu is directly comparable with `kvq-llamacpp-harness vecdot`
// (ggml's vec_dot on the same shape; see ops/matvec.h).
void BM_MatvecL2(benchmark::State& state, WeightType type, int64_t rows, int64_t cols, bool int8) {
  RotatingWeights w(type, rows, cols, 0);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(cols)), y(static_cast<size_t>(rows));
  for (float& v : x) v = dist(rng);
  DecodeProduct product{int8, {}};
  ThreadPool one_thread(1);
  double cpu = 0.0;
  for (auto _ : state) {
    const double c0 = ThreadCpuSeconds();
    product.Run(w.view(0), x.data(), y.data(), one_thread);
    benchmark::DoNotOptimize(y.data());
    cpu += ThreadCpuSeconds() - c0;
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["Gweights_cpu"] = n * static_cast<double>(rows * cols) / 1e9 / cpu;
  state.counters["GBps_cpu"] = n * static_cast<double>(rows * RowBytes(type, cols)) / 1e9 / cpu;
}

// Batched decode: n activation rows through the integer-dot kernel (what a
// decode step of n sequences runs below kPackedMinTokens), one thread, thread
// CPU time, the matrix in L2 (Qwen2.5-1.5B's attention shape, 1536 x 1536).
// Gmacs_cpu = n * rows * cols / CPU seconds: the figure that grows when the
// kernel reuses each unpacked weight block for several tokens.
void BM_MatvecInt8Batch(benchmark::State& state, WeightType type, int64_t rows, int64_t cols) {
  const int64_t n = state.range(0);
  RotatingWeights w(type, rows, cols, 0);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols)), y(static_cast<size_t>(n * rows));
  for (float& v : x) v = dist(rng);
  std::vector<uint8_t> acts(static_cast<size_t>(n * Int8ActRowBytes(type, cols)));
  QuantizeActs(type, x.data(), n, cols, acts.data());
  ThreadPool one_thread(1);
  double cpu = 0.0;
  for (auto _ : state) {
    const double c0 = ThreadCpuSeconds();
    MatvecInt8(w.view(0), acts.data(), n, y.data(), one_thread);
    benchmark::DoNotOptimize(y.data());
    cpu += ThreadCpuSeconds() - c0;
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["Gmacs_cpu"] = iters * static_cast<double>(n * rows * cols) / 1e9 / cpu;
}

enum class MatmulImpl { kMatmul, kSgemm, kTiles, kPacked };

const char* MatmulImplName(MatmulImpl impl) {
  switch (impl) {
    case MatmulImpl::kMatmul:
      return "Matmul";
    case MatmulImpl::kSgemm:
      return "MatmulSgemm";
    case MatmulImpl::kTiles:
      return "MatvecBatch";
    case MatmulImpl::kPacked:
      return "MatmulPacked";
  }
  return "?";
}

void RunMatmul(MatmulImpl impl, const WeightView& v, const float* x, int64_t n, float* y,
               ThreadPool& pool, MatmulWorkspace* ws) {
  switch (impl) {
    case MatmulImpl::kMatmul:
      return Matmul(v, x, n, y, pool, ws, DecodeArith::kInt8Dot);
    case MatmulImpl::kSgemm:
      return MatmulSgemm(v, x, n, y, pool.size(), ws);
    case MatmulImpl::kTiles:
      return MatvecBatch(v, x, n, y, pool);
    case MatmulImpl::kPacked:
      return MatmulPacked(v, x, n, y, pool, ws);
  }
}

// Process CPU time (all threads). Per call, FLOPs / CPU seconds measures
// what a kernel gets out of the cycles it is given, which on a machine
// shared with other jobs is far steadier than wall time (a preempted thread
// stops its CPU clock but not the wall clock).
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// One implementation's GFLOP/s (2 n rows cols per call) by wall time and by
// CPU time (GFLOPs_cpu, see ProcessCpuSeconds). With `baseline`, each
// iteration also times OpenBLAS sgemm on an f32 copy of the same shape right
// after the measured call (same threads), and vs_sgemm_f32 (wall) /
// vs_sgemm_f32_cpu = the ratios from those interleaved timings: on a shared
// machine the ratios survive load swings that move both figures.
void BM_Matmul(benchmark::State& state, WeightType type, int64_t rows, int64_t cols,
               MatmulImpl impl, bool baseline) {
  const int64_t n = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  RotatingWeights w(type, rows, cols, int64_t{64} << 20);
  std::unique_ptr<RotatingWeights> wf;
  if (baseline) wf = std::make_unique<RotatingWeights>(WeightType::kF32, rows, cols, 0);
  std::vector<float> x(static_cast<size_t>(n * cols), 0.25f), y(static_cast<size_t>(n * rows));
  MatmulWorkspace ws, ws_baseline;
  ThreadPool pool(threads);
  int64_t k = 0;
  double seconds = 0.0, baseline_seconds = 0.0, cpu = 0.0, baseline_cpu = 0.0;
  for (auto _ : state) {
    const double c0 = ProcessCpuSeconds();
    const auto t0 = std::chrono::steady_clock::now();
    RunMatmul(impl, w.view(k++), x.data(), n, y.data(), pool, &ws);
    benchmark::DoNotOptimize(y.data());
    const auto t1 = std::chrono::steady_clock::now();
    const double c1 = ProcessCpuSeconds();
    if (baseline) {
      MatmulSgemm(wf->view(0), x.data(), n, y.data(), threads, &ws_baseline);
      benchmark::DoNotOptimize(y.data());
    }
    const auto t2 = std::chrono::steady_clock::now();
    const double c2 = ProcessCpuSeconds();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    seconds += std::chrono::duration<double>(t1 - t0).count();
    baseline_seconds += std::chrono::duration<double>(t2 - t1).count();
    cpu += c1 - c0;
    baseline_cpu += c2 - c1;
  }
  const double flops =
      2.0 * static_cast<double>(n * rows * cols) * static_cast<double>(state.iterations());
  state.counters["GFLOPs"] = flops / 1e9 / seconds;
  state.counters["GFLOPs_cpu"] = flops / 1e9 / cpu;
  if (baseline) {
    state.counters["sgemm_f32_GFLOPs"] = flops / 1e9 / baseline_seconds;
    state.counters["vs_sgemm_f32"] = baseline_seconds / seconds;
    state.counters["vs_sgemm_f32_cpu"] = baseline_cpu / cpu;
  }
}

const WeightType kDenseTypes[] = {WeightType::kF32, WeightType::kF16, WeightType::kBF16,
                                  WeightType::kQ8_0};
// The other block types; the real models' shapes below.
const WeightType kBlockTypes[] = {
    WeightType::kQ4_0, WeightType::kQ4_1, WeightType::kQ5_0, WeightType::kQ5_1, WeightType::kIQ4_NL,
    WeightType::kQ2_K, WeightType::kQ3_K, WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K};
struct Shape {
  int64_t rows, cols;
};

// Matvec or MatvecInt8 of one type and shape at `threads`.
void RegisterMatvecAt(const std::string& name, WeightType t, const Shape& s, bool int8,
                      int threads) {
  benchmark::RegisterBenchmark(name.c_str(), BM_Matvec, t, s.rows, s.cols, int8)
      ->Arg(threads)
      ->ArgName("threads")
      ->UseManualTime();
}

// The integer batch path by rows per step, beside the packed GEMM it hands
// over to.
void RegisterMatvecBatch() {
  for (WeightType t : {WeightType::kQ4_K, WeightType::kQ6_K, WeightType::kQ8_0}) {
    benchmark::RegisterBenchmark(
        (std::string("MatvecInt8Batch/") + WeightTypeName(t) + "/1536x1536").c_str(),
        BM_MatvecInt8Batch, t, 1536, 1536)
        ->ArgName("n")
        ->Arg(1)
        ->Arg(2)
        ->Arg(4)
        ->Arg(8)
        ->Arg(16)
        ->Arg(31)
        ->Arg(32)
        ->Arg(48)
        ->Arg(56)
        ->Arg(64);
    // What a step of PackedMinTokens or more rows runs instead: the packed
    // f32 GEMM on the same shape, one thread, for the crossover.
    benchmark::RegisterBenchmark(
        (std::string("MatmulPackedBatch/") + WeightTypeName(t) + "/1536x1536").c_str(), BM_Matmul,
        t, 1536, 1536, MatmulImpl::kPacked, false)
        ->ArgNames({"n", "threads"})
        ->Args({32, 1})
        ->Args({48, 1})
        ->Args({56, 1})
        ->Args({64, 1})
        ->UseManualTime();
  }
}

// Decode products: Matvec (f32 path) and MatvecInt8 (integer path), from
// DRAM and from L2.
void RegisterMatvec() {
  const auto& types = kDenseTypes;
  const auto& block_types = kBlockTypes;
  // Qwen2.5-0.5B: q/o proj, gate/up, down, tied LM head.
  const Shape shapes[] = {{896, 896}, {4864, 896}, {896, 4864}, {151936, 896}};
  for (const Shape& s : shapes) {
    for (WeightType t : types) {
      for (int threads : {1, 2}) {
        if (t == WeightType::kQ8_0) {
          RegisterMatvecAt(std::string("MatvecInt8/q8_0/") + std::to_string(s.rows) + "x" +
                               std::to_string(s.cols),
                           t, s, true, threads);
        }
        RegisterMatvecAt(std::string("Matvec/") + WeightTypeName(t) + "/" + std::to_string(s.rows) +
                             "x" + std::to_string(s.cols),
                         t, s, false, threads);
      }
    }
  }
  for (WeightType t : types) {
    benchmark::RegisterBenchmark((std::string("MatvecL2/") + WeightTypeName(t)).c_str(),
                                 BM_MatvecL2, t, 576, 1536, false);
  }
  // Each block type's exact f32 path, then its integer path (MatvecInt8L2).
  for (WeightType t : {WeightType::kQ8_0}) {
    benchmark::RegisterBenchmark((std::string("MatvecInt8L2/") + WeightTypeName(t)).c_str(),
                                 BM_MatvecL2, t, 576, 1536, true);
  }
  for (WeightType t : block_types) {
    for (bool int8 : {false, true}) {
      benchmark::RegisterBenchmark(
          (std::string(int8 ? "MatvecInt8L2/" : "MatvecL2/") + WeightTypeName(t)).c_str(),
          BM_MatvecL2, t, 576, 1536, int8);
    }
  }
  RegisterMatvecBatch();
  // The block types at the real models' shapes: SmolLM2-135M (hidden 576,
  // ffn 1536) and Qwen2.5-0.5B (896, 4864); K-quants only where cols is a
  // multiple of 256.
  const Shape real_shapes[] = {{576, 1536}, {1536, 576}, {896, 4864}, {4864, 896}};
  for (const Shape& s : real_shapes) {
    for (WeightType t : block_types) {
      if (s.cols % BlockSize(t) != 0) continue;
      for (bool int8 : {false, true}) {
        for (int threads : {1, 2}) {
          RegisterMatvecAt(std::string(int8 ? "MatvecInt8/" : "Matvec/") + WeightTypeName(t) + "/" +
                               std::to_string(s.rows) + "x" + std::to_string(s.cols),
                           t, s, int8, threads);
        }
      }
    }
  }
}

void RegisterAll() {
  benchmark::RegisterBenchmark("ReadProbe", BM_ReadProbe)->Arg(1)->Arg(2)->UseRealTime();
  RegisterMatvec();
  const auto& types = kDenseTypes;
  for (const Shape& s : {Shape{4864, 896}, Shape{896, 4864}}) {
    for (WeightType t : kBlockTypes) {
      if (s.cols % BlockSize(t) != 0) continue;
      const std::string name = std::string("Prefill/MatmulPacked/") + WeightTypeName(t) + "/" +
                               std::to_string(s.rows) + "x" + std::to_string(s.cols);
      auto* b = benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, t, s.rows, s.cols,
                                             MatmulImpl::kPacked, true);
      b->ArgNames({"n", "threads"})->UseManualTime();
      for (int threads : {1, 2}) b->Args({512, threads});
    }
  }
  for (WeightType t : types) {
    for (const Shape& s : {Shape{896, 896}, Shape{4864, 896}, Shape{896, 4864}}) {
      for (MatmulImpl impl :
           {MatmulImpl::kMatmul, MatmulImpl::kTiles, MatmulImpl::kPacked, MatmulImpl::kSgemm}) {
        const std::string name = std::string(MatmulImplName(impl)) + "/" + WeightTypeName(t) + "/" +
                                 std::to_string(s.rows) + "x" + std::to_string(s.cols);
        auto* b =
            benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, t, s.rows, s.cols, impl, false);
        b->ArgNames({"n", "threads"})->UseManualTime();
        for (int threads : {1, 2}) {
          for (int64_t n : {1, 8, 16, 32, 64, 512}) b->Args({n, threads});
        }
      }
    }
  }
  // Prefill of 512 tokens at every Qwen2.5-0.5B projection shape (q/o, k/v,
  // gate/up, down; the LM head sees only the last token in prefill), each
  // implementation beside interleaved f32 sgemm.
  for (const Shape& s : {Shape{896, 896}, Shape{128, 896}, Shape{4864, 896}, Shape{896, 4864}}) {
    for (WeightType t : types) {
      for (MatmulImpl impl :
           {MatmulImpl::kMatmul, MatmulImpl::kTiles, MatmulImpl::kPacked, MatmulImpl::kSgemm}) {
        const std::string name = std::string("Prefill/") + MatmulImplName(impl) + "/" +
                                 WeightTypeName(t) + "/" + std::to_string(s.rows) + "x" +
                                 std::to_string(s.cols);
        auto* b =
            benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, t, s.rows, s.cols, impl, true);
        b->ArgNames({"n", "threads"})->UseManualTime();
        for (int threads : {1, 2}) b->Args({512, threads});
      }
    }
  }
}

}  // namespace
}  // namespace kvq::ops

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const double probe1 = kvq::ProbeReadGBs(1);
  const double probe2 = kvq::ProbeReadGBs(2);
  std::printf(
      "read-bandwidth probe (best of 5, 512 MiB sum): 1 thread %.1f GB/s, 2 threads %.1f GB/s\n",
      probe1, probe2);
  kvq::ops::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
