// kvq calibrate's engine: a calibration file from a (synthetic) model feeds
// a kvquant cache in the perplexity run; a file from another model shape is
// a clear error.
#include "eval/calibrate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "eval/perplexity.h"
#include "io/safetensors.h"
#include "kv/kv_factory.h"
#include "model/synth.h"
#include "test_util.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

StatusOr<LoadedModel> SynthModel(const std::string& path, int64_t layers) {
  KVQ_ASSIGN_OR_RETURN(auto preset, FindSynthPreset("tiny-qwen2"));
  ModelConfig config = preset.config;
  config.max_position_embeddings = 64;
  config.num_layers = layers;
  config.head_dim = 32;  // NUQ codecs need a multiple of 32 (the preset has 16)
  SynthOptions options;
  options.seed = 5;
  KVQ_RETURN_IF_ERROR(WriteSynthGguf(config, nullptr, options, path));
  return LoadModel(path, 2);
}

TEST(Calibrate, FileFeedsKvQuantPerplexityAndRejectsOtherModels) {
  const std::string model_path = test_util::TestPath("calibrate_test", "model.gguf"),
                    other_path = test_util::TestPath("calibrate_test", "other.gguf");
  const std::string calib_path = test_util::TestPath("calibrate_test", "calib.safetensors");
  auto model = SynthModel(model_path, 2);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const KvShape shape = model->transformer->kv_shape();
  ASSERT_EQ(shape.head_dim % 32, 0);

  CalibrateOptions options;
  options.bits = {2, 3};
  options.context = 64;
  options.tokens = 128;
  options.qnorm = true;
  EXPECT_FALSE(
      CalibrateKv(*model, test_util::WordText(20), options).ok());  // shorter than one window
  auto result = CalibrateKv(*model, test_util::WordText(400), options);
  ASSERT_TRUE(result.ok()) << result.status().message();
  const KvCalibration& c = result->calibration;
  EXPECT_EQ(result->windows, 2);
  EXPECT_EQ(c.tokens, 2 * 63);  // position 0 of each window is a sink, not calibrated
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.BitsList(), "2,3");
  EXPECT_EQ(c.codebooks.at(3).k.size(), 2u * 8);
  EXPECT_TRUE(c.qnorm);
  ASSERT_TRUE(SaveKvCalibration(c, calib_path).ok());

  KvCacheOptions cache_options;
  cache_options.k_type = cache_options.v_type = "kvquant3";
  cache_options.max_tokens = 64;
  cache_options.num_threads = 2;
  cache_options.calibration_path = calib_path;
  auto cache = MakeKvCache(shape, cache_options);
  ASSERT_TRUE(cache.ok()) << cache.status().message();
  PerplexityOptions ppl_options;
  ppl_options.context = 64;
  auto ppl = RunPerplexity(*model, **cache, test_util::WordText(400), ppl_options);
  ASSERT_TRUE(ppl.ok()) << ppl.status().message();
  EXPECT_TRUE(std::isfinite(ppl->ppl) && ppl->ppl > 1.0) << ppl->ppl;

  // kvquant4 needs 4-bit codebooks the file does not have.
  cache_options.k_type = cache_options.v_type = "kvquant4";
  auto no_bits = MakeKvCache(shape, cache_options);
  ASSERT_FALSE(no_bits.ok());
  EXPECT_NE(no_bits.status().message().find("not 4"), std::string::npos);

  auto other = SynthModel(other_path, 3);
  ASSERT_TRUE(other.ok());
  cache_options.k_type = cache_options.v_type = "kvquant3";
  auto mismatch = MakeKvCache(other->transformer->kv_shape(), cache_options);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("num_layers 2 (model 3)"), std::string::npos)
      << mismatch.status().message();
  for (const std::string& f : {model_path, other_path, calib_path}) fs::remove(f);
}

// OSCAR's rotations come with the file: one orthogonal matrix per (layer,
// KV head) for K and for V under each objective, none with "none"; an
// oscar-int2 cache built from the file runs the model.
TEST(Calibrate, FitsOscarRotationsThatFeedAnOscarCache) {
  const std::string model_path = test_util::TestPath("calibrate_test", "oscar_model.gguf");
  const std::string calib_path = test_util::TestPath("calibrate_test", "oscar_calib.safetensors");
  auto model = SynthModel(model_path, 2);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const KvShape shape = model->transformer->kv_shape();
  const int64_t dim = shape.head_dim;
  CalibrateOptions options;
  options.bits = {2};
  options.context = 64;
  options.tokens = 128;
  options.rotation = "bogus";
  EXPECT_FALSE(CalibrateKv(*model, test_util::WordText(400), options).ok());
  for (const char* objective : {"qqt_sst", "ktk_vtv", "none"}) {
    SCOPED_TRACE(objective);
    options.rotation = objective;
    auto result = CalibrateKv(*model, test_util::WordText(400), options);
    ASSERT_TRUE(result.ok()) << result.status().message();
    const KvCalibration& c = result->calibration;
    if (std::string(objective) == "none") {
      EXPECT_TRUE(c.rotation_objective.empty() && c.k_rotation.empty());
      continue;
    }
    EXPECT_EQ(c.rotation_objective, objective);
    const size_t per = static_cast<size_t>(dim * dim);
    ASSERT_EQ(c.k_rotation.size(),
              static_cast<size_t>(shape.num_layers * shape.num_kv_heads) * per);
    for (size_t at = 0; at < c.k_rotation.size(); at += per) {
      EXPECT_LE(OrthogonalityError(&c.k_rotation[at], dim), 1e-5);
      EXPECT_LE(OrthogonalityError(&c.v_rotation[at], dim), 1e-5);
    }
    ASSERT_TRUE(SaveKvCalibration(c, calib_path).ok());
    KvCacheOptions cache_options;
    cache_options.k_type = "oscar-int2-clip96";
    cache_options.v_type = "oscar-int2-clip92";
    cache_options.max_tokens = 64;
    cache_options.num_threads = 2;
    cache_options.calibration_path = calib_path;
    auto cache = MakeKvCache(shape, cache_options);
    ASSERT_TRUE(cache.ok()) << cache.status().message();
    PerplexityOptions ppl_options;
    ppl_options.context = 64;
    auto ppl = RunPerplexity(*model, **cache, test_util::WordText(400), ppl_options);
    ASSERT_TRUE(ppl.ok()) << ppl.status().message();
    EXPECT_TRUE(std::isfinite(ppl->ppl) && ppl->ppl > 1.0) << ppl->ppl;
  }
  for (const std::string& f : {model_path, calib_path}) fs::remove(f);
}

TEST(Calibrate, FisherFileMustMatchTheTokensAndShapes) {
  const std::string model_path = test_util::TestPath("calibrate_test", "fisher_model.gguf");
  const std::string fisher_path = test_util::TestPath("calibrate_test", "fisher.safetensors");
  auto model = SynthModel(model_path, 2);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const KvShape shape = model->transformer->kv_shape();
  const std::string text = test_util::WordText(200);
  const int64_t ctx = 64, rows = ctx - 1;
  std::vector<int32_t> tokens = PerplexityTokens(*model, text);
  tokens.resize(ctx);  // one window (the synthetic model adds no BOS)
  auto write = [&](float token_shift) {
    SafetensorsWriter writer;
    std::vector<float> ids(tokens.begin(), tokens.end());
    for (float& id : ids) id += token_shift;
    EXPECT_TRUE(writer.AddTensor("tokens", DType::kF32, {ctx}, ids.data(), ids.size() * 4).ok());
    // Unit weights: this test is about matching the file to the run.
    std::vector<float> w(static_cast<size_t>(rows * shape.num_kv_heads * shape.head_dim), 1.0f);
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      for (const char* side : {"k.", "v."}) {
        EXPECT_TRUE(writer
                        .AddTensor(side + std::to_string(l), DType::kF32,
                                   {rows, shape.num_kv_heads, shape.head_dim}, w.data(),
                                   w.size() * 4)
                        .ok());
      }
    }
    EXPECT_TRUE(writer.Write(fisher_path).ok());
  };
  CalibrateOptions options;
  options.bits = {2};
  options.context = ctx;
  options.tokens = ctx;
  options.fisher_path = fisher_path;
  write(0.0f);
  auto ok = CalibrateKv(*model, text, options);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->calibration.method, "fisher");
  write(1.0f);
  auto other_tokens = CalibrateKv(*model, text, options);
  ASSERT_FALSE(other_tokens.ok());
  EXPECT_NE(other_tokens.status().message().find("other tokens"), std::string::npos)
      << other_tokens.status().message();
  options.context = 32;  // 2 windows of 32: the file's shapes no longer fit
  options.tokens = 64;
  auto other_ctx = CalibrateKv(*model, text, options);
  ASSERT_FALSE(other_ctx.ok());
  for (const std::string& f : {model_path, fisher_path}) fs::remove(f);
}

}  // namespace
}  // namespace kvq
