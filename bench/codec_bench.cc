// KV codec kernels: Scores (K side) and AccumulateV (V side) over 16384 rows
// of one KV head, i.e. one head's share of a decode step at 16K context, on
// one thread. Reports GB/s of cache bytes read next to a read-bandwidth
// probe timed alternately with each call (same idea as ops_bench): the
// ratio vs_probe is what survives the noise of the shared machine. Rows are
// rotated over >= 256 MiB of copies so every call reads from DRAM.
//
//   build/bin/codec_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kv/codec.h"
#include "read_probe.h"

namespace kvq {
namespace {

constexpr int64_t kRotateBytes = int64_t{256} << 20;
constexpr int64_t kRows = 16384;

void BM_Codec(benchmark::State& state, const std::string& name, int64_t dim, int64_t group,
              bool values) {
  auto parsed = ParseKvCodec(name, dim);
  if (!parsed.ok()) {
    state.SkipWithError(parsed.status().message().c_str());
    return;
  }
  KvCodec& codec = **parsed;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(kRows * dim));  // [kRows, dim]
  for (float& v : x) v = normal(rng);
  codec.Calibrate(x.data(), kRows);
  const int64_t bytes = kRows * static_cast<int64_t>(codec.RowBytes());
  const int64_t copies = std::max<int64_t>(1, kRotateBytes / bytes);
  std::vector<uint8_t> rows(static_cast<size_t>(copies * bytes));  // [copies, kRows, row bytes]
  codec.Encode(x.data(), kRows, rows.data());
  for (int64_t k = 1; k < copies; ++k) std::memcpy(rows.data() + k * bytes, rows.data(), bytes);

  std::vector<float> q(static_cast<size_t>(group * dim), 0.1f);                 // [group, dim]
  std::vector<float> scores(static_cast<size_t>(group * kRows), 1.0f / kRows);  // [group, kRows]
  std::vector<float> acc(static_cast<size_t>(group * dim), 0.0f);               // [group, dim]
  const int64_t probe_words = std::max(kRotateBytes, 2 * bytes) / 8;
  std::vector<uint64_t> probe(static_cast<size_t>(probe_words), 1);
  const int64_t window = (bytes + 7) / 8;
  int64_t k = 0, offset = 0;
  double kernel_seconds = 0.0, probe_seconds = 0.0;
  for (auto _ : state) {
    const uint8_t* tile = rows.data() + (k++ % copies) * bytes;
    const auto t0 = std::chrono::steady_clock::now();
    if (values) {
      codec.AccumulateV(tile, kRows, scores.data(), group, kRows, acc.data());
      benchmark::DoNotOptimize(acc.data());
    } else {
      codec.Scores(tile, kRows, q.data(), group, 0.125f, scores.data(), kRows);
      benchmark::DoNotOptimize(scores.data());
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (offset + window > probe_words) offset = 0;
    benchmark::DoNotOptimize(SumWords(probe.data() + offset, window));
    offset += window;
    const auto t2 = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    kernel_seconds += std::chrono::duration<double>(t1 - t0).count();
    probe_seconds += std::chrono::duration<double>(t2 - t1).count();
  }
  const double total = static_cast<double>(state.iterations()) * static_cast<double>(bytes);
  state.SetBytesProcessed(static_cast<int64_t>(total));
  state.counters["GBps"] = total / 1e9 / kernel_seconds;
  state.counters["probe_GBps"] = total / 1e9 / probe_seconds;
  state.counters["vs_probe"] = probe_seconds / kernel_seconds;
  state.counters["ns_per_row"] = kernel_seconds * 1e9 / state.iterations() / kRows;
}

// The same kernels on 1024 rows that stay in L2: the compute cost per row
// (thread CPU time, robust to other load on the machine), which must stay
// below the DRAM time per row for the kernel to be memory-bound.
void BM_CodecHot(benchmark::State& state, const std::string& name, int64_t dim, int64_t group,
                 bool values) {
  constexpr int64_t kHotRows = 1024;
  auto parsed = ParseKvCodec(name, dim);
  if (!parsed.ok()) {
    state.SkipWithError(parsed.status().message().c_str());
    return;
  }
  KvCodec& codec = **parsed;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(kHotRows * dim));  // [kHotRows, dim]
  for (float& v : x) v = normal(rng);
  codec.Calibrate(x.data(), kHotRows);
  std::vector<uint8_t> rows(static_cast<size_t>(kHotRows) * codec.RowBytes());
  codec.Encode(x.data(), kHotRows, rows.data());
  std::vector<float> q(static_cast<size_t>(group * dim), 0.1f);             // [group, dim]
  std::vector<float> scores(static_cast<size_t>(group * kHotRows), 1e-3f);  // [group, kHotRows]
  std::vector<float> acc(static_cast<size_t>(group * dim), 0.0f);           // [group, dim]
  for (auto _ : state) {
    if (values) {
      codec.AccumulateV(rows.data(), kHotRows, scores.data(), group, kHotRows, acc.data());
      benchmark::DoNotOptimize(acc.data());
    } else {
      codec.Scores(rows.data(), kHotRows, q.data(), group, 0.125f, scores.data(), kHotRows);
      benchmark::DoNotOptimize(scores.data());
    }
  }
  state.counters["rows"] =
      benchmark::Counter(static_cast<double>(kHotRows) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

void RegisterAll() {
  // nuq*: KVQuant's non-uniform codecs (uncalibrated here: uniform levels;
  // the kernels' cost does not depend on the level values).
  const char* names[] = {"f32",          "f16",           "bf16",         "fp8_e4m3",
                         "int8-g32-sym", "int4-g32-asym", "int4-g32-sym", "int2-g32-asym",
                         "nuq4-k-o1",    "nuq4-v-o1",     "nuq3-k-o1",    "nuq3-v-o1",
                         "nuq2-v-o1",    "q8_0",          "q4_0",         "q4_1",
                         "q5_0",         "q5_1",          "iq4_nl"};
  // (head_dim, GQA group): Llama-3-8B (128, 4) and Qwen2.5-0.5B (64, 7).
  const std::pair<int64_t, int64_t> shapes[] = {{128, 4}, {64, 7}};
  for (const auto& [dim, group] : shapes) {
    for (const char* name : names) {
      for (bool values : {false, true}) {
        const std::string label = std::string(values ? "AccumulateV/" : "Scores/") + name + "/d" +
                                  std::to_string(dim) + "/g" + std::to_string(group);
        benchmark::RegisterBenchmark(label.c_str(), BM_Codec, std::string(name), dim, group, values)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("Hot/" + label).c_str(), BM_CodecHot, std::string(name), dim,
                                     group, values)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace
}  // namespace kvq

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  kvq::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
