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
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kv/codec.h"
#include "read_probe.h"

namespace kvq {
namespace {

constexpr int64_t kRotateBytes = int64_t{256} << 20;
constexpr int64_t kRows = 16384;

// `n` rows of N(0, 1) values, the codec calibrated on them, and their codes;
// no codec (and the benchmark skipped) when the name does not parse.
struct EncodedRows {
  std::unique_ptr<KvCodec> codec;
  std::vector<uint8_t> rows;  // [n, row bytes]
};

EncodedRows EncodeRandomRows(benchmark::State& state, const std::string& name, int64_t dim,
                             int64_t n) {
  auto parsed = ParseKvCodec(name, dim);
  if (!parsed.ok()) {
    state.SkipWithError(parsed.status().message().c_str());
    return {};
  }
  EncodedRows out{std::move(*parsed), {}};
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * dim));  // [n, dim]
  for (float& v : x) v = normal(rng);
  out.codec->Calibrate(x.data(), n);
  out.rows.resize(static_cast<size_t>(n) * out.codec->RowBytes());
  out.codec->Encode(x.data(), n, out.rows.data());
  return out;
}

// The kernel under test over `n` rows: AccumulateV into acc [group, dim], or
// Scores into scores [group, n].
void RunKernel(const KvCodec& codec, const uint8_t* rows, int64_t n, int64_t group, bool values,
               const float* q, float* scores, float* acc) {
  if (values) {
    codec.AccumulateV(rows, n, scores, group, n, acc);
    benchmark::DoNotOptimize(acc);
  } else {
    codec.Scores(rows, n, q, group, 0.125f, scores, n);
    benchmark::DoNotOptimize(scores);
  }
}

void BM_Codec(benchmark::State& state, const std::string& name, int64_t dim, int64_t group,
              bool values) {
  EncodedRows encoded = EncodeRandomRows(state, name, dim, kRows);
  if (!encoded.codec) return;
  const int64_t bytes = static_cast<int64_t>(encoded.rows.size());
  const int64_t copies = std::max<int64_t>(1, kRotateBytes / bytes);
  std::vector<uint8_t> rows(static_cast<size_t>(copies * bytes));  // [copies, kRows, row bytes]
  for (int64_t k = 0; k < copies; ++k)
    std::memcpy(rows.data() + k * bytes, encoded.rows.data(), bytes);

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
    RunKernel(*encoded.codec, tile, kRows, group, values, q.data(), scores.data(), acc.data());
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
  EncodedRows encoded = EncodeRandomRows(state, name, dim, kHotRows);
  if (!encoded.codec) return;
  std::vector<float> q(static_cast<size_t>(group * dim), 0.1f);             // [group, dim]
  std::vector<float> scores(static_cast<size_t>(group * kHotRows), 1e-3f);  // [group, kHotRows]
  std::vector<float> acc(static_cast<size_t>(group * dim), 0.0f);           // [group, dim]
  for (auto _ : state) {
    RunKernel(*encoded.codec, encoded.rows.data(), kHotRows, group, values, q.data(), scores.data(),
              acc.data());
  }
  state.counters["rows"] =
      benchmark::Counter(static_cast<double>(kHotRows) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

void RegisterAll() {
  // nuq*: KVQuant's non-uniform codecs (uncalibrated here: uniform levels;
  // the kernels' cost does not depend on the level values); int2-c32-asym:
  // KIVI's per-channel keys; tq3: TurboQuant; *_per_token_head: vLLM's rows.
  const char* names[] = {"f32",
                         "f16",
                         "bf16",
                         "fp8_e4m3",
                         "int8-g32-sym",
                         "int4-g32-asym",
                         "int4-g32-sym",
                         "int2-g32-asym",
                         "nuq4-k-o1",
                         "nuq4-v-o1",
                         "nuq3-k-o1",
                         "nuq3-v-o1",
                         "nuq2-v-o1",
                         "q8_0",
                         "q4_0",
                         "q4_1",
                         "q5_0",
                         "q5_1",
                         "iq4_nl",
                         "int2-c32-asym",
                         "tq3",
                         "fp8_per_token_head",
                         "int4_per_token_head"};
  // (head_dim, query rows per call): a decode step of Llama-3-8B (128, 4) and
  // Qwen2.5-0.5B (64, 7), and a prefill tile of Qwen2.5-1.5B (128, 30: five
  // queries of its six heads per KV head; PagedKvCache's kTargetRows), which
  // takes the kernels several passes of kMaxHeadsPerPass heads.
  const std::pair<int64_t, int64_t> shapes[] = {{128, 4}, {64, 7}, {128, 30}};
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
