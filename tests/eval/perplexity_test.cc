#include "eval/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "eval/logits_file.h"
#include "kv/dense_cache.h"
#include "kv/kv_factory.h"
#include "model/synth.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

// A tiny random-weight Qwen2 with a 257-token byte vocabulary (no BOS added,
// as Qwen2), written once per process.
class PerplexityTest : public test_util::TinyModelTest {
 protected:
  static void SetUpTestSuite() { WriteSuiteModel({.max_positions = 64, .seed = 11}); }
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(LoadTinyModel(2)); }
  void TearDown() override {
    for (const std::string& f : files_) fs::remove(f);
  }
  std::unique_ptr<KvCache> Cache(const std::string& type) {
    KvCacheOptions o;
    o.k_type = o.v_type = type;
    o.max_tokens = model_.transformer->config().max_position_embeddings;
    o.num_threads = 2;
    auto cache = MakeKvCache(model_.transformer->kv_shape(), o);
    EXPECT_TRUE(cache.ok()) << cache.status().message();
    return std::move(cache).value();
  }
  StatusOr<PerplexityResult> Run(const std::string& type, const std::string& text,
                                 PerplexityOptions options) {
    auto cache = Cache(type);
    return RunPerplexity(model_, *cache, text, options);
  }
  std::string File(const std::string& name) {
    files_.push_back(test_util::TestPath("perplexity_test", name));
    return files_.back();
  }

  std::vector<std::string> files_;
};

// The reference: each window prefilled whole with every logit row returned,
// log-softmax in double written out here, rows ctx/2 .. ctx-2 scored.
struct Reference {
  double ppl = 0, ppl_error = 0;
  int64_t scored = 0;
  double max_abs_log_prob = 0;  // over every scored row and token
};
Reference BruteForce(LoadedModel& model, const std::string& text, int64_t ctx) {
  Reference ref;
  const std::vector<int32_t> tokens = PerplexityTokens(model, text);
  const int64_t vocab = model.transformer->config().vocab_size;
  double sum = 0, sum_sq = 0;
  for (int64_t w = 0; w + ctx <= static_cast<int64_t>(tokens.size()); w += ctx) {
    auto cache = MakeDenseKvCache(model.transformer->kv_shape(), DenseKvType::kF32, ctx);
    std::vector<int32_t> window(tokens.begin() + w, tokens.begin() + w + ctx);
    std::vector<float> logits;
    EXPECT_TRUE(cache->AddSequence(0).ok());
    EXPECT_TRUE(model.transformer->Forward({{0, window, true}}, *cache, &logits).ok());
    EXPECT_EQ(logits.size(), static_cast<size_t>(ctx * vocab));
    for (int64_t r = ctx / 2; r <= ctx - 2; ++r) {
      const float* row = logits.data() + r * vocab;
      double max = row[0];
      for (int64_t i = 0; i < vocab; ++i) max = std::max(max, static_cast<double>(row[i]));
      double z = 0;
      for (int64_t i = 0; i < vocab; ++i) z += std::exp(row[i] - max);
      const double lse = max + std::log(z);
      for (int64_t i = 0; i < vocab; ++i) {
        ref.max_abs_log_prob = std::max(ref.max_abs_log_prob, std::abs(row[i] - lse));
      }
      const double nll = lse - row[window[r + 1]];
      sum += nll;
      sum_sq += nll * nll;
      ++ref.scored;
    }
  }
  const double mean = sum / ref.scored;
  ref.ppl = std::exp(mean);
  ref.ppl_error = ref.ppl * std::sqrt((sum_sq / ref.scored - mean * mean) / (ref.scored - 1));
  return ref;
}

// Streaming (chunks of 5 tokens through the f32 cache) equals the whole-window
// reference. Only the batching differs, which reorders f32 sums inside the
// matmuls: logits move by ~hidden * 2^-24 relative (~1e-6 at hidden 64), so
// PPL agrees to well within 1e-5 relative.
TEST_F(PerplexityTest, StreamingEqualsBruteForceReference) {
  const std::string text = test_util::WordText(32 * 9 + 7);  // 9 windows and a dropped tail
  const Reference ref = BruteForce(model_, text, 32);
  PerplexityOptions options;
  options.context = 32;
  options.batch = 5;
  auto result = Run("f32", text, options);
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->windows, 9);
  EXPECT_EQ(result->tokens_scored, 9 * 15);
  EXPECT_EQ(result->tokens_scored, ref.scored);
  EXPECT_FALSE(result->bos_per_window);
  EXPECT_NEAR(result->ppl, ref.ppl, 1e-5 * ref.ppl);
  EXPECT_NEAR(result->ppl_error, ref.ppl_error, 1e-3 * ref.ppl_error);
  EXPECT_EQ(result->running_ppl.size(), 9u);
  EXPECT_NEAR(result->running_ppl.back(), result->ppl, 1e-12 * result->ppl);
  // --chunks limits the windows.
  options.max_windows = 2;
  auto limited = Run("f32", text, options);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->windows, 2);
  EXPECT_EQ(limited->tokens_scored, 30);
}

// Progress comes after every forward chunk (a 32K window is an hour on one
// thread) and once at the end of each window with its PPL: 3 windows of 32
// tokens fed 5 at a time are 7 chunks each (6 of 5, one of 2).
TEST_F(PerplexityTest, ProgressFollowsEveryChunkAndEveryWindow) {
  const std::string text = test_util::WordText(32 * 3);
  PerplexityOptions options;
  options.context = 32;
  options.batch = 5;
  std::vector<PerplexityProgress> events;
  auto cache = Cache("f32");
  auto result = RunPerplexity(model_, *cache, text, options,
                              [&](const PerplexityProgress& p) { events.push_back(p); });
  ASSERT_TRUE(result.ok()) << result.status().message();
  ASSERT_EQ(events.size(), 3u * (7 + 1));
  int64_t fed = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const PerplexityProgress& p = events[i];
    const int64_t window = static_cast<int64_t>(i / 8) + 1;
    const int64_t chunk = static_cast<int64_t>(i % 8);  // 7: the window's end
    EXPECT_EQ(p.window, window) << i;
    EXPECT_EQ(p.windows, 3) << i;
    EXPECT_EQ(p.tokens_total, 96) << i;
    EXPECT_EQ(p.window_done, chunk == 7) << i;
    if (chunk < 7) fed += chunk < 6 ? 5 : 2;
    EXPECT_EQ(p.tokens_fed, fed) << i;
    if (p.window_done) {
      EXPECT_DOUBLE_EQ(p.running_ppl, result->running_ppl[window - 1]) << i;
      EXPECT_EQ(p.tokens_scored, window * 15) << i;
    }
  }
  EXPECT_EQ(fed, 96);
}

// A run against its own saved f16 log-probs. Each stored value is the f32
// log-prob l rounded to f16: |delta| <= 2^-11 |l| (round to nearest, normal
// range; below 2^-14 the absolute error is <= 2^-25), plus the double -> f32
// step (2^-24 relative). With the stored values renormalized, KL(p^ || p) <=
// max(delta) - min(delta) <= 2 max|delta| <= 2^-10 (1 + 2^-12) M + 2^-24, M
// the largest |log-prob| of any scored row (from the reference).
TEST_F(PerplexityTest, KlAgainstItsOwnSavedLogitsIsBoundedByF16Storage) {
  const std::string text = test_util::WordText(32 * 4);
  const Reference ref = BruteForce(model_, text, 32);
  PerplexityOptions options;
  options.context = 32;
  options.batch = 16;
  options.save_logits_path = File("self.logits");
  auto base = Run("f32", text, options);
  ASSERT_TRUE(base.ok()) << base.status().message();
  options.save_logits_path.clear();
  options.kl_base_path = files_.back();
  auto again = Run("f32", text, options);
  ASSERT_TRUE(again.ok()) << again.status().message();
  ASSERT_TRUE(again->kl.has_value());
  const KlStats& kl = *again->kl;
  const double bound = std::ldexp(1.0, -10) * (1 + std::ldexp(1.0, -12)) * ref.max_abs_log_prob +
                       std::ldexp(1.0, -24);
  EXPECT_EQ(kl.positions, 4 * 15);
  EXPECT_LE(kl.max, bound);
  EXPECT_LE(kl.mean, bound);
  EXPECT_GE(kl.min, -1e-12);  // both are proper distributions: KL >= 0 up to double rounding
  EXPECT_EQ(kl.top1_percent, 100.0);
  // The base NLLs are stored as f32 (2^-24 relative each); exp(mean) then
  // moves by at most mean_nll * 2^-24 relative (~6 nats here -> 4e-7).
  EXPECT_NEAR(kl.base_ppl, again->ppl, 1e-6 * again->ppl);
}

// f16 cache against an f32 baseline: f16 rounds K and V (2^-11 relative), so
// the distributions differ, by more than the same comparison of the f32
// cache with itself (which differs only by the f32 storage of log-probs).
// "Small": a ~2^-11 relative change of logits that are O(1) gives a KL of
// order (2^-11)^2; 1e-4 leaves ample headroom.
TEST_F(PerplexityTest, KlAgainstAnotherCacheTypeIsSmallButPositive) {
  const std::string text = test_util::WordText(32 * 4);
  PerplexityOptions options;
  options.context = 32;
  options.save_logits_path = File("f32.logits");
  options.save_logits_f32 = true;
  ASSERT_TRUE(Run("f32", text, options).ok());
  options.save_logits_path.clear();
  options.kl_base_path = files_.back();
  auto self = Run("f32", text, options);
  auto f16 = Run("f16", text, options);
  ASSERT_TRUE(self.ok() && f16.ok());
  EXPECT_GT(f16->kl->mean, 0.0);
  EXPECT_GT(f16->kl->mean, self->kl->mean);
  EXPECT_LT(f16->kl->mean, 1e-4);
  EXPECT_NE(f16->ppl, self->ppl);
}

TEST_F(PerplexityTest, MismatchedLogitsFilesAreClearErrors) {
  const std::string text = test_util::WordText(32 * 3);
  PerplexityOptions options;
  options.context = 32;
  options.max_windows = 2;
  options.save_logits_path = File("base.logits");
  ASSERT_TRUE(Run("f32", text, options).ok());
  const std::string base = files_.back();
  options.save_logits_path.clear();
  options.kl_base_path = base;
  auto error_of = [&](const std::string& t, PerplexityOptions o) {
    auto r = Run("f32", t, o);
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  PerplexityOptions other_ctx = options;
  other_ctx.context = 16;
  EXPECT_NE(error_of(text, other_ctx).find("--ctx 32"), std::string::npos);
  PerplexityOptions more = options;
  more.max_windows = 3;
  EXPECT_NE(error_of(text, more).find("holds 2 windows"), std::string::npos);
  std::string other_text = text;
  other_text[40] = '#';
  EXPECT_NE(error_of(other_text, options).find("token 40 differs"), std::string::npos);

  // A well-formed file from a model with another vocabulary.
  {
    const std::string other_vocab = File("vocab300.logits");
    LogitsFileHeader h;
    h.n_vocab = 300;
    h.n_ctx = 32;
    h.first = 16;
    h.n_windows = 1;
    h.tokens.assign(32, 1);
    auto w = LogitsFileWriter::Create(other_vocab, h);
    ASSERT_TRUE(w.ok()) << w.status().message();
    std::vector<double> row(300, -std::log(300.0));
    for (int64_t r = 0; r < h.RowsPerWindow(); ++r)
      ASSERT_TRUE((*w)->WriteRow(0, 5.7f, row.data()).ok());
    ASSERT_TRUE((*w)->Close().ok());
    PerplexityOptions v = options;
    v.kl_base_path = other_vocab;
    v.max_windows = 1;
    EXPECT_NE(error_of(text, v).find("vocabulary of 300 tokens, this model has 257"),
              std::string::npos);
  }

  const std::string garbage = File("garbage.logits");
  std::ofstream(garbage) << "not a logits file at all, just text";
  PerplexityOptions g = options;
  g.kl_base_path = garbage;
  EXPECT_NE(error_of(text, g).find("bad magic"), std::string::npos);
  const std::string truncated = File("truncated.logits");
  fs::copy_file(base, truncated);
  fs::resize_file(truncated, fs::file_size(base) - 3);
  g.kl_base_path = truncated;
  EXPECT_NE(error_of(text, g).find("truncated"), std::string::npos);
  g.kl_base_path = test_util::TestPath("perplexity_test", "missing.logits");
  EXPECT_NE(error_of(text, g).find("missing.logits"), std::string::npos);
}

TEST_F(PerplexityTest, BadInputsAreClearErrors) {
  PerplexityOptions options;
  auto error_of = [&](const std::string& text, int64_t ctx) {
    PerplexityOptions o = options;
    o.context = ctx;
    auto r = Run("f32", text, o);
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(error_of("", 32).find("empty"), std::string::npos);
  EXPECT_NE(error_of(test_util::WordText(31), 32).find("fewer than one window"), std::string::npos);
  EXPECT_NE(error_of(test_util::WordText(100), 31).find("even"), std::string::npos);
  EXPECT_NE(error_of(test_util::WordText(200), 128).find("exceeds the model's context of 64"),
            std::string::npos);
  EXPECT_NE(error_of(test_util::WordText(100), 2).find("at least 4"), std::string::npos);
}

// A model whose tokenizer adds BOS (Llama-3's vocabulary): the text starts
// with BOS and BOS replaces each window's first token, as llama.cpp does.
TEST(PerplexityBos, EachWindowStartsWithBos) {
  const std::string vocab_path =
      std::string(KVQ_DEPS_DIR) + "/llama.cpp/models/ggml-vocab-llama-bpe.gguf";
  if (!fs::exists(vocab_path)) GTEST_SKIP() << "vocab GGUF missing: run scripts/setup.sh";
  auto vocab = GgufFile::Open(vocab_path);
  ASSERT_TRUE(vocab.ok());
  auto preset = FindSynthPreset("tiny-llama-odd");
  ASSERT_TRUE(preset.ok());
  ModelConfig config = preset->config;
  config.max_position_embeddings = 32;
  const std::string path = test_util::TestPath("perplexity_test", "bos.gguf");
  ASSERT_TRUE(WriteSynthGguf(config, vocab->get(), SynthOptions{}, path).ok());
  auto model = LoadModel(path, 2);
  ASSERT_TRUE(model.ok()) << model.status().message();
  ASSERT_TRUE(model->tokenizer->add_bos());
  const int32_t bos = model->tokenizer->bos_id();
  KvCacheOptions o;
  o.k_type = o.v_type = "f32";
  o.max_tokens = 32;
  auto cache = MakeKvCache(model->transformer->kv_shape(), o);
  ASSERT_TRUE(cache.ok());
  PerplexityOptions options;
  options.context = 8;
  options.max_windows = 3;
  options.save_logits_path = test_util::TestPath("perplexity_test", "bos.logits");
  const std::string text = test_util::WordText(400);
  auto result = RunPerplexity(*model, **cache, text, options);
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_TRUE(result->bos_per_window);
  auto reader = LogitsFileReader::Open(options.save_logits_path);
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  const std::vector<int32_t> tokens = PerplexityTokens(*model, text);
  ASSERT_EQ(tokens[0], bos);
  const LogitsFileHeader& h = (*reader)->header();
  ASSERT_EQ(h.tokens.size(), 24u);
  for (size_t i = 0; i < h.tokens.size(); ++i) {
    EXPECT_EQ(h.tokens[i], i % 8 == 0 ? bos : tokens[i]) << i;
  }
  fs::remove(options.save_logits_path);
  fs::remove(path);
}

}  // namespace
}  // namespace kvq
