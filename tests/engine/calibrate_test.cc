// kvq calibrate's engine: a calibration file from a (synthetic) model feeds
// a kvquant cache in the perplexity run; a file from another model shape is
// a clear error.
#include "engine/calibrate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "engine/perplexity.h"
#include "kv/kv_factory.h"
#include "model/synth.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

std::string TempPath(const std::string& name) {
  return (fs::path(KVQ_BINARY_DIR) / ("calibrate_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::string Text(size_t bytes) {
  static const char* kWords[] = {"the ", "cache ", "stores ", "keys ",      "and ",   "values ",
                                 "per ", "token ", "while ",  "attention ", "reads ", "them, "};
  std::string s;
  for (size_t i = 0; s.size() < bytes; ++i) s += kWords[(i * 7 + i / 3) % 12];
  s.resize(bytes);
  return s;
}

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
  const std::string model_path = TempPath("model.gguf"), other_path = TempPath("other.gguf");
  const std::string calib_path = TempPath("calib.safetensors");
  auto model = SynthModel(model_path, 2);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const KvShape shape = model->transformer->kv_shape();
  ASSERT_EQ(shape.head_dim % 32, 0);

  CalibrateOptions options;
  options.bits = {2, 3};
  options.context = 64;
  options.tokens = 128;
  options.qnorm = true;
  EXPECT_FALSE(CalibrateKv(*model, Text(20), options).ok());  // shorter than one window
  auto result = CalibrateKv(*model, Text(400), options);
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
  auto ppl = RunPerplexity(*model, **cache, Text(400), ppl_options);
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

}  // namespace
}  // namespace kvq
