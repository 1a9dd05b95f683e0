// Tokenizer encode throughput on English text (The Adventures of Sherlock
// Holmes, pg1661.txt from the Debian lz4 test data) with the Qwen2 vocabulary.
// Baselines in the same run: memcpy of the text (memory speed) and the
// pre-tokenizer split alone (PCRE2 JIT), so the BPE cost can be read off as a
// ratio. "Cold" clears the word cache before every pass; "Warm" keeps it.
#include <benchmark/benchmark.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "io/gguf.h"
#include "model/tokenizer.h"

namespace {

const std::string kDeps = KVQ_DEPS_DIR;

struct Fixture {
  std::string text;
  std::unique_ptr<kvq::Tokenizer> tok;
  std::string error;
};

const Fixture& Load(const std::string& vocab) {
  static std::unique_ptr<Fixture> cache[2];
  auto& f = cache[vocab == "qwen2" ? 0 : 1];
  if (f) return *f;
  f = std::make_unique<Fixture>();
  std::ifstream in(kDeps +
                       "/deb/golang-github-pierrec-lz4-dev/usr/share/gocode/src/github.com/"
                       "pierrec/lz4/testdata/pg1661.txt",
                   std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  f->text = ss.str();
  if (f->text.empty()) {
    f->error = "pg1661.txt not found under " + kDeps + " (run scripts/setup.sh)";
    return *f;
  }
  auto file = kvq::GgufFile::Open(kDeps + "/llama.cpp/models/ggml-vocab-" + vocab + ".gguf");
  if (!file.ok()) {
    f->error = file.status().message();
    return *f;
  }
  auto spec = kvq::TokenizerSpecFromGguf(**file);
  if (!spec.ok()) {
    f->error = spec.status().message();
    return *f;
  }
  auto tok = kvq::Tokenizer::Create(*spec);
  if (!tok.ok()) {
    f->error = tok.status().message();
    return *f;
  }
  f->tok = std::move(tok).value();
  return *f;
}

void BM_Memcpy(benchmark::State& state) {
  const Fixture& f = Load("qwen2");
  std::string dst(f.text.size(), '\0');
  for (auto _ : state) {
    std::memcpy(dst.data(), f.text.data(), f.text.size());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.text.size()));
}

void BM_PreTokenizeOnly(benchmark::State& state, const char* vocab) {
  const Fixture& f = Load(vocab);
  if (!f.tok) return state.SkipWithError(f.error.c_str());
  size_t pieces = 0;
  for (auto _ : state) {
    auto out = f.tok->PreTokenize(f.text);
    pieces = out.size();
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.text.size()));
  state.counters["pieces"] = static_cast<double>(pieces);
}

void BM_Encode(benchmark::State& state, const char* vocab, bool warm) {
  const Fixture& f = Load(vocab);
  if (!f.tok) return state.SkipWithError(f.error.c_str());
  f.tok->ClearCache();
  if (warm) f.tok->Encode(f.text);
  size_t tokens = 0;
  for (auto _ : state) {
    if (!warm) f.tok->ClearCache();
    auto ids = f.tok->Encode(f.text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PreTokenizeOnly, qwen2, "qwen2")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, qwen2_cold, "qwen2", false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, qwen2_warm, "qwen2", true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PreTokenizeOnly, llama_bpe, "llama-bpe")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, llama_bpe_cold, "llama-bpe", false)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
