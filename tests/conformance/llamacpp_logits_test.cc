// Conformance with llama.cpp, an independent implementation: the same
// `kvq synth` GGUF run through both, logits compared position by position,
// through kvq's prefill path (all tokens in one Forward) and its decode path
// (one token per Forward, attention over the cache).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "conformance/harness_logits.h"
#include "engine/loaded_model.h"
#include "kv/dense_cache.h"
#include "model/synth.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

// Runs the harness; returns false (with a gtest failure) when it fails.
bool RunHarness(const std::string& model, const std::vector<int32_t>& tokens, bool decode,
                Logits* out) {
  const std::string out_path = model + (decode ? ".decode.bin" : ".prefill.bin");
  std::string cmd = std::string(KVQ_LLAMACPP_HARNESS) + " logits '" + model + "' '" + out_path +
                    "'" + (decode ? " --decode" : "") + " --threads 2";
  for (int32_t t : tokens) cmd += " " + std::to_string(t);
  return RunHarnessLogits(cmd, out_path, out);
}

struct Agreement {
  double nmse = 0;  // sum (a - b)^2 / sum b^2 over all positions
  double top1 = 0;  // fraction of positions with the same argmax
};

Agreement Compare(const Logits& kvq, const Logits& ref) {
  double err = 0, norm = 0;
  int64_t same = 0;
  for (int64_t p = 0; p < ref.positions; ++p) {
    const float* a = &kvq.values[p * ref.vocab];
    const float* b = &ref.values[p * ref.vocab];
    int64_t arg_a = 0, arg_b = 0;
    for (int64_t i = 0; i < ref.vocab; ++i) {
      err += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      norm += static_cast<double>(b[i]) * b[i];
      if (a[i] > a[arg_a]) arg_a = i;
      if (b[i] > b[arg_b]) arg_b = i;
    }
    same += arg_a == arg_b;
  }
  return {err / norm, static_cast<double>(same) / static_cast<double>(ref.positions)};
}

struct Case {
  const char* preset;
  const char* vocab;  // file under .deps/llama.cpp/models/
  DType dtype;
  double max_nmse;
};

// Thresholds by weight type. Both sides compute in f32 from the same stored
// weights; what differs is the arithmetic llama.cpp chooses:
// - F32 weights: only summation order differs (relative error ~ n * 2^-24 per
//   dot, n <= 5000) plus llama.cpp computing RoPE angles by repeated f32
//   multiplication (angle error ~ position * pair index * 2^-24): measured
//   NMSE 1e-8..4e-7. 1e-5 leaves margin and is still 1000x below
//   any real bug (a wrong bias, RoPE pair or mask gives NMSE > 1e-2).
// - F16/BF16 weights: ggml rounds the activations to the weight type before
//   its dot products (f16: 2^-11 relative per element, bf16: 2^-8); kvq keeps
//   them f32. Random-sign rounding errors average down to a logit NMSE of
//   about (2^-11)^2..(2^-8)^2 per layer -> 1e-4 is the budget and
//   holds for f16; bf16 gets 1e-3 for its 8x coarser rounding.
// - Q8_0 weights: ggml also quantizes activations to 8 bits (error up to
//   1/254 of each block's max), kvq does not: 1e-3.
const Case kCases[] = {
    {"tiny-qwen2", "ggml-vocab-qwen2.gguf", DType::kF32, 1e-5},
    {"tiny-qwen2", "ggml-vocab-qwen2.gguf", DType::kF16, 1e-4},
    {"tiny-qwen2", "ggml-vocab-qwen2.gguf", DType::kBF16, 1e-3},
    {"tiny-qwen2", "ggml-vocab-qwen2.gguf", DType::kQ8_0, 1e-3},
    {"tiny-llama-odd", "ggml-vocab-llama-bpe.gguf", DType::kF32, 1e-5},
    {"tiny-qwen2-gqa7", "ggml-vocab-qwen2.gguf", DType::kF32, 1e-5},
    {"tiny-llama3", "ggml-vocab-llama-bpe.gguf", DType::kF32, 1e-5},
    {"tiny-llama-mha", "ggml-vocab-llama-bpe.gguf", DType::kF16, 1e-4},
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.preset << " " << DTypeName(c.dtype); }

class LlamaCppLogits : public testing::TestWithParam<Case> {};

TEST_P(LlamaCppLogits, PrefillAndDecodeMatch) {
  const Case& c = GetParam();
  const std::string vocab_path = std::string(KVQ_DEPS_DIR) + "/llama.cpp/models/" + c.vocab;
  if (!fs::exists(vocab_path)) GTEST_SKIP() << vocab_path << " missing: run scripts/setup.sh";
  auto vocab = GgufFile::Open(vocab_path);
  ASSERT_TRUE(vocab.ok()) << vocab.status().message();
  auto preset = FindSynthPreset(c.preset);
  ASSERT_TRUE(preset.ok()) << preset.status().message();
  const fs::path dir = fs::path(KVQ_BINARY_DIR) / "conformance";
  fs::create_directories(dir);
  const std::string model_path =
      (dir / (std::string(c.preset) + "-" + DTypeName(c.dtype) + ".gguf")).string();
  SynthOptions options;
  options.seed = 11;
  options.dtype = c.dtype;
  ASSERT_TRUE(WriteSynthGguf(preset->config, vocab->get(), options, model_path).ok());
  auto model = LoadModel(model_path, 2);
  ASSERT_TRUE(model.ok()) << model.status().message();

  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> id(0, 30000);  // ordinary (non-special) ids
  for (int64_t length : {1, 7, 300}) {
    std::vector<int32_t> tokens(static_cast<size_t>(length));
    for (int32_t& t : tokens) t = id(rng);
    for (bool decode : {false, true}) {
      SCOPED_TRACE(testing::Message() << c.preset << " " << DTypeName(c.dtype) << " length "
                                      << length << (decode ? " decode" : " prefill"));
      Logits ref;
      ASSERT_TRUE(RunHarness(model_path, tokens, decode, &ref));
      const Logits ours = RunKvqLogits(*model, tokens, decode);
      ASSERT_EQ(ref.vocab, ours.vocab);
      const Agreement a = Compare(ours, ref);
      std::printf("%-16s %-5s len %3lld %-7s NMSE %.3e top-1 %.4f\n", c.preset, DTypeName(c.dtype),
                  static_cast<long long>(length), decode ? "decode" : "prefill", a.nmse, a.top1);
      EXPECT_LE(a.nmse, c.max_nmse);
      EXPECT_GE(a.top1, 0.99);
    }
  }
  fs::remove(model_path);
}

INSTANTIATE_TEST_SUITE_P(Synth, LlamaCppLogits, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<Case>& info) {
                           std::string name =
                               std::string(info.param.preset) + "_" + DTypeName(info.param.dtype);
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace kvq
