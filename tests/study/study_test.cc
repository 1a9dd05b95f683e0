// kvq study on a tiny synthetic model: capture (and its safetensors dump),
// outliers, scheme specs, the passkey prompt, and one whole small study.
#include "study/study.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "study/study_capture.h"
#include "study/study_e2e.h"
#include "study/study_outliers.h"
#include "study/study_resume.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

std::vector<float> ReadF32(const TensorRef& t) {
  std::vector<float> out(t.nbytes / sizeof(float));
  std::memcpy(out.data(), t.data, t.nbytes);
  return out;
}

// A tiny random-weight Qwen2 (head_dim 64, 1 KV head, byte vocabulary: one
// byte = one token), written once per process.
class StudyTest : public test_util::TinyModelTest {
 protected:
  static void SetUpTestSuite() {
    WriteSuiteModel({.max_positions = 160, .seed = 5, .head_dim_64 = true});
  }
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(LoadTinyModel(1)); }
  std::vector<int32_t> Tokens(size_t n) { return model_.tokenizer->Encode(test_util::WordText(n)); }
  // A small study of the synthetic model: 2 windows of 32 tokens, one recall
  // cell of 128 tokens (the needle and question alone take 74 bytes).
  static StudyOptions SmallStudy(const std::string& name) {
    StudyOptions o;
    o.context = 32;
    o.chunks = 2;
    o.capture_tokens = 32;
    o.batch = 16;
    o.recall.contexts = {128};
    o.recall.depths = {0.5};
    o.recall.trials = 1;
    o.baseline_logits_path = test_util::TestPath("study_test", name + "_base.logprobs");
    o.memory_contexts = {64};
    return o;
  }

  // SmallStudy recording its end-to-end results in a fresh directory `name`.
  static StudyOptions ResumableStudy(const std::string& name) {
    StudyOptions o = SmallStudy(name);
    o.capture_tokens = 16;
    o.end_to_end_dir = test_util::TestPath("study_test", "e2e_" + name);
    fs::remove_all(o.end_to_end_dir);
    return o;
  }
};

// The dump holds every documented tensor with its documented shape, and
// k_post_rope is RoPE(k_pre_rope) at positions 0..T-1: the model applies the
// same ops::Rope to the same f32 values, so they agree to the last bit up to
// a few f32 ulps of the largest element (1e-6 relative is ~8 ulps).
TEST_F(StudyTest, CaptureDumpHasDocumentedShapesAndRope) {
  const std::vector<int32_t> tokens = Tokens(40);
  ASSERT_EQ(tokens.size(), 40u);
  auto capture = CaptureKv(model_, tokens, 16);  // 3 forward calls: 16 + 16 + 8
  ASSERT_TRUE(capture.ok()) << capture.status().message();
  const ModelConfig& c = model_.transformer->config();
  const std::string path = test_util::TestPath("study_test", "dump.safetensors");
  ASSERT_TRUE(WriteCaptureSafetensors(*capture, c, "tiny", path).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto rope = MakeRopeApplier(c);
  ASSERT_TRUE(rope.ok());
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const TensorRef* q = (*file)->Find(p + "q");
    const TensorRef* pre = (*file)->Find(p + "k_pre_rope");
    const TensorRef* post = (*file)->Find(p + "k_post_rope");
    const TensorRef* v = (*file)->Find(p + "v");
    ASSERT_TRUE(q && pre && post && v) << p;
    EXPECT_EQ(q->shape, (std::vector<int64_t>{40, c.num_heads, c.head_dim}));
    for (const TensorRef* t : {pre, post, v}) {
      EXPECT_EQ(t->shape, (std::vector<int64_t>{40, c.num_kv_heads, c.head_dim}));
      EXPECT_EQ(t->dtype, DType::kF32);
    }
    std::vector<float> rotated = ReadF32(*pre);
    (*rope)(rotated.data(), 40, c.num_kv_heads);
    const std::vector<float> k = ReadF32(*post);
    float max_abs = 0, max_diff = 0;
    for (size_t i = 0; i < k.size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(k[i]));
      max_diff = std::max(max_diff, std::fabs(k[i] - rotated[i]));
    }
    EXPECT_GT(max_abs, 0);
    EXPECT_LE(max_diff, 1e-6f * max_abs) << "layer " << l;
    // Position 0 is not rotated: row 0 of K post equals K pre.
    const std::vector<float> k_pre = ReadF32(*pre);
    for (int64_t i = 0; i < c.num_kv_heads * c.head_dim; ++i) EXPECT_EQ(k[i], k_pre[i]);
  }
  const TensorRef* ids = (*file)->Find("token_ids");
  ASSERT_NE(ids, nullptr);
  EXPECT_EQ(ids->shape, (std::vector<int64_t>{40}));
  EXPECT_EQ(ReadF32(*ids)[3], static_cast<float>(tokens[3]));
  fs::remove(path);
}

// Chunked capture equals one forward call: only the matmuls' row count
// differs, which may change f32 summation order (~hidden * 2^-24 relative per
// matmul, compounded over a few layers): 1e-4 of the largest value is ample.
TEST_F(StudyTest, ChunkedCaptureEqualsOneCall) {
  const std::vector<int32_t> tokens = Tokens(37);
  auto a = CaptureKv(model_, tokens, 5);
  auto b = CaptureKv(model_, tokens, 512);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t l = 0; l < a->layers.size(); ++l) {
    for (auto member : {&LayerCapture::q, &LayerCapture::k_pre_rope, &LayerCapture::v}) {
      const std::vector<float>& x = a->layers[l].*member;
      const std::vector<float>& y = b->layers[l].*member;
      ASSERT_EQ(x.size(), y.size());
      float max_abs = 0, max_diff = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        max_abs = std::max(max_abs, std::fabs(y[i]));
        max_diff = std::max(max_diff, std::fabs(x[i] - y[i]));
      }
      EXPECT_LE(max_diff, 1e-4f * max_abs) << "layer " << l;
    }
  }
}

TEST_F(StudyTest, CaptureRejectsTooManyTokens) {
  EXPECT_FALSE(CaptureKv(model_, Tokens(161), 16).ok());
  EXPECT_FALSE(CaptureKv(model_, {}, 16).ok());
}

TEST(StudyOutliersTest, FindsPlantedChannel) {
  std::vector<double> mean(64, 1.0);
  mean[5] = 9.0;
  mean[40] = 4.5;
  mean[41] = 3.9;  // below 4x the median
  EXPECT_EQ(OutlierChannels(mean, kOutlierRatio), (std::vector<int>{5, 40}));
  // [tokens 3, heads 1, head_dim 4]: channel 2 is largest in tokens 0 and 2.
  const std::vector<float> x = {0, 1, 9, 0, 0, 5, 1, 0, 1, 0, -8, 0};
  EXPECT_NEAR(OutlierConsistency(x.data(), 3, 1, 4, 0, {2}), 2.0 / 3.0, 1e-12);
  EXPECT_TRUE(std::isnan(OutlierConsistency(x.data(), 3, 1, 4, 0, {})));
}

// The sink rule (study_outliers.h) on a hand-made attention matrix: every
// row puts 0.5 on token 0, 0.3 on token 5 (once 16 rows past it), the rest
// on itself. Token 0 and 5 are sinks; the diagonal mass every token gets
// from itself is outside the rule's window.
TEST(StudyOutliersTest, FindsPlantedSinks) {
  const int64_t T = 256;  // uniform attention over 256 tokens is far below 0.5 / 10
  std::vector<float> p(T * T, 0.0f);
  for (int64_t i = 0; i < T; ++i) {
    float rest = 1.0f;
    if (i > 0) {
      p[i * T] = 0.5f;
      rest -= 0.5f;
    }
    if (i >= 5 + kSinkWindow) {
      p[i * T + 5] = 0.3f;
      rest -= 0.3f;
    }
    p[i * T + i] += rest;
  }
  std::vector<AttentionSink> sinks;
  const double m0 = FindAttentionSinks(p.data(), T, 3, &sinks);
  EXPECT_NEAR(m0, 0.5, 1e-6);
  ASSERT_EQ(sinks.size(), 2u);
  EXPECT_EQ(sinks[0].position, 0);
  EXPECT_EQ(sinks[0].head, 3);
  EXPECT_EQ(sinks[1].position, 5);
  EXPECT_NEAR(sinks[1].mass, 0.3, 1e-6);
  EXPECT_GT(sinks[1].uniform, 0.0);
  // A short capture: 0.3 is less than 10x what uniform attention gives there.
  sinks.clear();
  std::vector<float> small(20 * 20, 0.0f);
  for (int64_t i = 0; i < 20; ++i) small[i * 20 + i] = 1.0f;
  for (int64_t i = 1; i < 20; ++i) {
    small[i * 20] = 0.3f;
    small[i * 20 + i] = 0.7f;
  }
  FindAttentionSinks(small.data(), 20, 0, &sinks);
  EXPECT_TRUE(sinks.empty());
}

TEST(StudyOutliersTest, FlagsBoundaryBiasSpikes) {
  // Qwen2-like: first and last layers 30x and 40x the others.
  const KBiasSummary s = SummarizeKBias({{30.0, 0.0}, {1.0}, {1.2}, {0.9}, {1.1}, {40.0}});
  ASSERT_EQ(s.layer_norms.size(), 6u);
  EXPECT_DOUBLE_EQ(s.layer_norms[0], 30.0);
  EXPECT_DOUBLE_EQ(s.median, 1.15);
  EXPECT_EQ(s.spikes, (std::vector<int64_t>{0, 5}));
  EXPECT_TRUE(s.boundary_spike);
  const KBiasSummary flat = SummarizeKBias({{1.0}, {2.0}, {1.5}});
  EXPECT_TRUE(flat.spikes.empty());
  EXPECT_FALSE(flat.boundary_spike);
  const KBiasSummary middle = SummarizeKBias({{1.0}, {9.0}, {1.0}});
  EXPECT_EQ(middle.spikes, (std::vector<int64_t>{1}));
  EXPECT_FALSE(middle.boundary_spike);
  EXPECT_TRUE(SummarizeKBias({}).layer_norms.empty());  // no k_proj bias (Llama)
}

TEST(StudyOutliersTest, TensorStatsOfKnownValues) {
  // One head, 2 tokens x 2 channels: rows (3, 4) and (0, 0).
  const std::vector<float> x = {3, 4, 0, 0};
  const TensorStats s = ComputeTensorStats(x.data(), 2, 1, 2, 0);
  EXPECT_DOUBLE_EQ(s.mean_abs, 7.0 / 4);
  EXPECT_DOUBLE_EQ(s.rms, std::sqrt(25.0 / 4));
  EXPECT_DOUBLE_EQ(s.absmax, 4.0);
  EXPECT_NEAR(s.token_norm_cv, 1.0, 1e-12);  // norms 5 and 0: std 2.5 / mean 2.5
  // mean 1.75; central moments of {3, 4, 0, 0} - 1.75.
  double m2 = 0, m4 = 0;
  for (float v : x) {
    m2 += (v - 1.75) * (v - 1.75) / 4;
    m4 += std::pow(v - 1.75, 4) / 4;
  }
  EXPECT_NEAR(s.kurtosis, m4 / (m2 * m2), 1e-12);
  const std::vector<float> flat = {2, 2, 2, 2};
  EXPECT_TRUE(std::isnan(ComputeTensorStats(flat.data(), 2, 1, 2, 0).kurtosis));
}

TEST(StudySchemeSpecTest, ParsesTheThreeForms) {
  auto a = ParseSchemeSpec("int4");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->k_type, "int4");
  EXPECT_EQ(a->v_type, "int4");
  EXPECT_FALSE(a->rotate);
  auto b = ParseSchemeSpec("f16/int4");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->k_type, "f16");
  EXPECT_EQ(b->v_type, "int4");
  auto c = ParseSchemeSpec(" int2-g64+rot ");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->name, "int2-g64+rot");
  EXPECT_EQ(c->k_type, "int2-g64");
  EXPECT_TRUE(c->rotate);
  for (const char* bad : {"", "+rot", "a/b/c", "/int4", "int4/", "int4+rot+rot"}) {
    EXPECT_FALSE(ParseSchemeSpec(bad).ok()) << bad;
  }
  KvShape shape{2, 4, 2, 64};
  shape.rope_inv_freq.assign(32, 1.0f);  // kvquant stores K before RoPE
  auto defaults = ParseSchemeList(DefaultStudySchemes(), shape);
  EXPECT_TRUE(defaults.ok()) << defaults.status().message();
  auto unknown = ParseSchemeList("f16,int3x", shape);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("int3x"), std::string::npos);
  EXPECT_FALSE(ParseSchemeList("f16,f16", shape).ok());
}

TEST_F(StudyTest, PasskeyPromptHasTheRequestedLengthAndNeedle) {
  const std::vector<int32_t> filler = Tokens(200);
  const std::string needle = " The pass key is 48213. Remember it.";
  const std::string question = " What is the pass key? The pass key is";
  // Byte vocabulary, no BOS: tokens are bytes, so the filler holds
  // 150 - |needle| - |question| tokens and the needle starts at depth * that.
  const int64_t n_filler = 150 - static_cast<int64_t>(needle.size() + question.size());
  for (double depth : {0.0, 0.5, 1.0}) {
    auto p = BuildPasskeyPrompt(model_, filler, 150, depth, "48213");
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_EQ(p->tokens.size(), 150u);
    const std::string text = model_.tokenizer->Decode(p->tokens);
    ASSERT_EQ(text.size(), 150u);
    EXPECT_EQ(text.find(needle), static_cast<size_t>(std::llround(depth * n_filler))) << depth;
    EXPECT_EQ(text.substr(text.size() - question.size()), question);
  }
  EXPECT_FALSE(BuildPasskeyPrompt(model_, filler, 20, 0.5, "48213").ok());       // no room
  EXPECT_FALSE(BuildPasskeyPrompt(model_, Tokens(50), 150, 0.5, "48213").ok());  // text short
}

// The default inputs are found from the source checkout when they are there
// (this test runs with the build folder as its working directory), and a
// name that is nowhere gives "" rather than a path that does not exist.
TEST(StudyDefaultPathsTest, FindsTheCheckoutsFilesAndNothingElse) {
  namespace fs = std::filesystem;
  EXPECT_EQ(DefaultCorpusPath("no-such-split.txt"), "");
  const fs::path corpus = fs::path(KVQ_SOURCE_DIR) / ".deps" / "corpus" / "test.txt";
  const fs::path gsm8k =
      fs::path(KVQ_SOURCE_DIR) / ".." / "shared" / "data" / "gsm8k" / "test.jsonl";
  int checked = 0;
  for (const auto& [found, expected] :
       {std::pair{DefaultCorpusPath("test.txt"), corpus}, std::pair{DefaultGsm8kPath(), gsm8k}}) {
    if (!fs::is_regular_file(expected)) continue;
    ASSERT_FALSE(found.empty()) << expected;
    EXPECT_TRUE(fs::equivalent(found, expected)) << found << " vs " << expected;
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "neither .deps/corpus nor ../shared/data is set up";
}

TEST(StudyPasskeyTest, AnswerMustMatchTheFirstDigits) {
  EXPECT_TRUE(PasskeyAnswerCorrect(" 48213. Remember", "48213"));
  EXPECT_TRUE(PasskeyAnswerCorrect("48213", "48213"));
  EXPECT_FALSE(PasskeyAnswerCorrect(" 482130", "48213"));
  EXPECT_FALSE(PasskeyAnswerCorrect(" 4821", "48213"));
  EXPECT_FALSE(PasskeyAnswerCorrect(" the key", "48213"));
  EXPECT_FALSE(PasskeyAnswerCorrect(" 12345 48213", "48213"));
}

// One whole small study: every section of the JSON contract is present and
// self-consistent.
TEST_F(StudyTest, SmallStudyProducesTheJsonContract) {
  StudyOptions o;
  o.context = 32;
  o.chunks = 2;
  o.capture_tokens = 48;
  o.batch = 16;
  auto schemes = ParseSchemeList("int4,f16,f16/int2+rot", model_.transformer->kv_shape());
  ASSERT_TRUE(schemes.ok()) << schemes.status().message();
  o.schemes = *schemes;
  o.recall.contexts = {128, 160};  // the needle and question alone take 74 bytes
  o.recall.depths = {0.0, 1.0};
  o.recall.trials = 1;
  o.baseline_logits_path = test_util::TestPath("study_test", "base.logprobs");
  o.dump_path = test_util::TestPath("study_test", "small.safetensors");
  o.memory_contexts = {64, 128};
  auto json = RunStudy(model_, test_util::WordText(400), o);
  ASSERT_TRUE(json.ok()) << json.status().message();
  const nlohmann::json& j = *json;
  EXPECT_EQ(j["kvq_study_version"], kStudyVersion);
  EXPECT_EQ(j["model"]["layers"], model_.transformer->config().num_layers);
  EXPECT_EQ(j["model"]["k_bias_norms"].size(), model_.transformer->config().num_layers);
  EXPECT_EQ(j["outliers"]["capture_tokens"], 48);
  ASSERT_EQ(j["outliers"]["layers"].size(), model_.transformer->config().num_layers);
  const auto& l0 = j["outliers"]["layers"][0];
  EXPECT_EQ(l0["k_pre_rope_channel_mean_abs"].size(), 1u);  // [kv_heads][head_dim]
  EXPECT_EQ(l0["k_pre_rope_channel_mean_abs"][0].size(), 64u);
  EXPECT_FALSE(l0.contains("k_pre_rope_channel_absmax"));  // renamed: it holds a mean
  EXPECT_EQ(l0["k_pre_rope_outlier_consistency"].size(), 1u);
  EXPECT_GT(l0["sink_mass"].get<double>(), 0.0);
  EXPECT_LE(l0["sink_mass"].get<double>(), 1.0);
  ASSERT_EQ(l0["sink_mass_per_head"].size(), 2u);  // per query head
  double mean = 0;
  for (const auto& m : l0["sink_mass_per_head"]) mean += m.get<double>() / 2;
  EXPECT_NEAR(mean, l0["sink_mass"].get<double>(), 1e-6);  // the layer's is their mean
  EXPECT_TRUE(l0["sinks"].is_array());
  EXPECT_EQ(l0["v_stats"].size(), 1u);
  EXPECT_GT(l0["v_stats"][0]["rms"].get<double>(), 0.0);
  const auto& bias = j["outliers"]["k_bias"];
  EXPECT_EQ(bias["layer_norms"].size(), model_.transformer->config().num_layers);
  EXPECT_TRUE(bias["boundary_spike"].is_boolean());
  EXPECT_EQ(j["fake_quant"]["rows"].size(), 18u);  // 9 rows x 2 bit widths
  EXPECT_EQ(j["fake_quant"]["rows"][1]["per_channel_whole_sequence"], true);
  EXPECT_EQ(j["fake_quant"]["rows"][1]["per_channel_group_tokens"], 48);
  EXPECT_EQ(j["fake_quant"]["rows"][0]["reported_score_rel_error"], 0.786);
  EXPECT_GE(j["fake_quant"]["claims"].size(), 12u);
  // f16 runs first (the baseline), then the others in the order given.
  ASSERT_EQ(j["schemes"].size(), 3u);
  EXPECT_EQ(j["schemes"][0]["name"], "f16");
  EXPECT_TRUE(j["schemes"][0]["baseline"].get<bool>());
  EXPECT_EQ(j["schemes"][1]["name"], "int4");
  const auto& rot = j["schemes"][2];
  EXPECT_EQ(rot["k_type"], "f16");
  EXPECT_EQ(rot["v_type"], "int2");
  EXPECT_TRUE(rot["rotate"].get<bool>());
  EXPECT_GT(rot["kl_mean"].get<double>(), 0.0);
  EXPECT_GT(rot["compression_vs_f16"].get<double>(), 1.0);
  EXPECT_EQ(j["schemes"][0]["compression_vs_f16"].get<double>(), 1.0);
  EXPECT_EQ(j["schemes"][0]["bits_per_value"].get<double>(), 16.0);
  EXPECT_EQ(rot["recall"].size(), 4u);  // 2 contexts x 2 depths
  EXPECT_TRUE(rot["recall"][0]["example_answer"].is_string());
  EXPECT_EQ(rot["recall"][3]["context"], 160);
  EXPECT_EQ(rot["recall"][3]["depth"], 1.0);
  EXPECT_EQ(j["memory"]["series"].size(), 3u);
  EXPECT_EQ(j["memory"]["series"][0]["bytes"].size(), 2u);
  EXPECT_TRUE(fs::exists(o.dump_path));
  EXPECT_FALSE(fs::exists(o.baseline_logits_path));  // scratch removed
  fs::remove(o.dump_path);
}

// A KVQuant scheme makes the study calibrate first, on the text after the
// perplexity windows (held out from them), use that calibration for the
// cache, record it, and remove its scratch file. Without a scratch path or a
// file the study refuses rather than run an uncalibrated codec.
TEST_F(StudyTest, KvQuantSchemeIsCalibratedOnHeldOutText) {
  StudyOptions o = SmallStudy("kvquant");
  o.schemes = *ParseSchemeList("kvquant4,int4", model_.transformer->kv_shape());
  o.calibration_scratch_path = test_util::TestPath("study_test", "kvq_calib.safetensors");
  o.calibration.context = 64;
  o.calibration.tokens = 128;
  auto json = RunStudy(model_, test_util::WordText(400), o);
  ASSERT_TRUE(json.ok()) << json.status().message();
  const nlohmann::json& c = (*json)["calibration"];
  ASSERT_TRUE(c.is_object());
  EXPECT_EQ(c["source"], "computed");
  EXPECT_FALSE(c["overlaps_perplexity_windows"].get<bool>());
  EXPECT_EQ(c["windows"], 2);  // 400 - 64 evaluated tokens hold 5 windows of 64; 128 asked
  EXPECT_EQ(c["method"], "q2");
  ASSERT_EQ((*json)["schemes"].size(), 3u);
  const nlohmann::json& kvquant = (*json)["schemes"][1];
  EXPECT_EQ(kvquant["name"], "kvquant4");
  EXPECT_GT(kvquant["kl_mean"].get<double>(), 0.0);
  EXPECT_LT(kvquant["bytes_per_token"].get<double>(),
            (*json)["schemes"][0]["bytes_per_token"].get<double>());
  EXPECT_FALSE(fs::exists(o.calibration_scratch_path));
  // The scheme that used the calibration records which one; the others do not.
  EXPECT_EQ(kvquant["calibration_sha256"].get<std::string>().size(), 64u);
  EXPECT_FALSE((*json)["schemes"][2].contains("calibration_sha256"));

  // Schemes without calibration record none.
  o.schemes = *ParseSchemeList("int4", model_.transformer->kv_shape());
  auto plain = RunStudy(model_, test_util::WordText(400), o);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_TRUE((*plain)["calibration"].is_null());

  o.schemes = *ParseSchemeList("kvquant2", model_.transformer->kv_shape());
  o.calibration_scratch_path.clear();
  auto refused = RunStudy(model_, test_util::WordText(400), o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("calibration"), std::string::npos);
}

// With an end-to-end directory each scheme's result is recorded as it
// completes. A rerun with more schemes runs only the new ones (and f16 again,
// unrecorded, for the log-probs their KL needs), returns the recorded ones as
// they were, and gives the new scheme the KL a fresh run gives it; a rerun
// with a different configuration is refused rather than mixed.
TEST_F(StudyTest, EndToEndResumesWithOnlyTheMissingSchemes) {
  StudyOptions o = ResumableStudy("resume");
  const std::string dir = o.end_to_end_dir;
  const KvShape shape = model_.transformer->kv_shape();
  o.schemes = *ParseSchemeList("int4", shape);
  auto first = RunStudy(model_, test_util::WordText(400), o);
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_EQ((*first)["schemes"].size(), 2u);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "config.json"));
  EXPECT_EQ((*first)["schemes"][1]["simd_target"], SimdTargetName());

  o.schemes = *ParseSchemeList("int4,int2", shape);
  std::vector<std::string> ran;
  auto second = RunStudy(model_, test_util::WordText(400), o, [&](const StudyEvent& e) {
    if (e.stage.rfind("scheme ", 0) == 0 && (ran.empty() || ran.back() != e.stage)) {
      ran.push_back(e.stage);
    }
  });
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(ran, (std::vector<std::string>{"scheme 1/3 f16", "scheme 3/3 int2"}));
  const nlohmann::json& list = (*second)["schemes"];
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0], (*first)["schemes"][0]);  // recorded once, not again
  EXPECT_EQ(list[1], (*first)["schemes"][1]);
  EXPECT_EQ((*second)["memory"]["series"].size(), 3u);

  StudyOptions fresh = o;
  fresh.end_to_end_dir.clear();
  auto whole = RunStudy(model_, test_util::WordText(400), fresh);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  EXPECT_EQ((*whole)["schemes"][2]["kl_mean"], list[2]["kl_mean"]);
  EXPECT_EQ((*whole)["schemes"][1]["kl_mean"], list[1]["kl_mean"]);

  o.chunks = 1;
  auto refused = RunStudy(model_, test_util::WordText(400), o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("different configuration"), std::string::npos);
  fs::remove_all(dir);
}

// The calibration belongs to the schemes that use it, not to the results
// directory: a rerun whose calibration differs (remade on another SIMD
// target, or from other tokens) may still add schemes, and the KVQuant
// result recorded earlier keeps the digest of the calibration it used.
TEST_F(StudyTest, EndToEndResumeAcceptsAnotherCalibration) {
  StudyOptions o = ResumableStudy("calibration");
  const KvShape shape = model_.transformer->kv_shape();
  o.calibration_scratch_path = test_util::TestPath("study_test", "resume_calib.safetensors");
  o.calibration.context = 64;
  o.calibration.tokens = 128;
  o.schemes = *ParseSchemeList("kvquant4", shape);
  auto first = RunStudy(model_, test_util::WordText(400), o);
  ASSERT_TRUE(first.ok()) << first.status().message();
  const nlohmann::json kvquant = (*first)["schemes"][1];

  o.calibration.tokens = 64;  // another calibration
  o.schemes = *ParseSchemeList("kvquant4,int2", shape);
  auto second = RunStudy(model_, test_util::WordText(400), o);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_NE((*second)["calibration"]["windows"], (*first)["calibration"]["windows"]);
  EXPECT_EQ((*second)["schemes"][1], kvquant);  // as recorded, with its own digest
  EXPECT_EQ((*second)["schemes"][2]["name"], "int2");
  EXPECT_FALSE((*second)["schemes"][2].contains("calibration_sha256"));
  fs::remove_all(o.end_to_end_dir);
}

// A tuned policy (kvq tune's file) runs as a scheme: policy:FILE, its own
// bytes between the types it mixes, never mistaken for the f16 baseline.
TEST_F(StudyTest, PolicyFileRunsAsAScheme) {
  const std::string policy_path = test_util::TestPath("study_test", "policy.txt");
  {
    std::ofstream f(policy_path);
    f << "# layer 0 in f16, the rest int4\n*: int4\n0: f16\n";
  }
  EXPECT_FALSE(ParseSchemeSpec("policy:").ok());
  EXPECT_FALSE(ParseSchemeSpec("policy:" + test_util::TestPath("study_test", "missing.txt")).ok());
  StudyOptions o = SmallStudy("policy");
  auto schemes = ParseSchemeList("policy:" + policy_path + ",int4", model_.transformer->kv_shape());
  ASSERT_TRUE(schemes.ok()) << schemes.status().message();
  o.schemes = *schemes;
  auto json = RunStudy(model_, test_util::WordText(400), o);
  fs::remove(policy_path);
  ASSERT_TRUE(json.ok()) << json.status().message();
  const nlohmann::json& list = (*json)["schemes"];
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0]["name"], "f16");  // the baseline was added, not taken from the policy
  EXPECT_TRUE(list[0]["policy"].is_null());
  const nlohmann::json& policy = list[1];
  EXPECT_TRUE(policy["policy"].is_string());
  const double f16_bytes = list[0]["bytes_per_token"], int4_bytes = list[2]["bytes_per_token"];
  EXPECT_LT(policy["bytes_per_token"].get<double>(), f16_bytes);
  EXPECT_GT(policy["bytes_per_token"].get<double>(), int4_bytes);
  EXPECT_GT(policy["kl_mean"].get<double>(), 0.0);
}

TEST_F(StudyTest, RejectsShortTextAndOversizedContext) {
  StudyOptions o;
  o.context = 32;
  o.chunks = 2;
  o.capture_tokens = 32;
  o.schemes = *ParseSchemeList("f16", model_.transformer->kv_shape());
  o.recall.contexts = {128};
  o.baseline_logits_path = test_util::TestPath("study_test", "unused.logprobs");
  auto short_text = RunStudy(model_, test_util::WordText(50), o);
  ASSERT_FALSE(short_text.ok());
  EXPECT_NE(short_text.status().message().find("tokens"), std::string::npos);
  o.recall.contexts = {40};  // too short for the needle and the question
  auto short_recall = RunStudy(model_, test_util::WordText(400), o);
  ASSERT_FALSE(short_recall.ok());
  EXPECT_NE(short_recall.status().message().find("too short"), std::string::npos);
  o.recall.contexts = {128};
  o.context = 200;  // above the model's 160
  EXPECT_FALSE(RunStudy(model_, test_util::WordText(400), o).ok());
}

}  // namespace
}  // namespace kvq
