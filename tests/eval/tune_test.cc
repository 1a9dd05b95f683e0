#include "eval/tune.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/loaded_model.h"
#include "kv/kv_policy.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

// The shipped model (real K/V, so int2 really costs KL) on English prose
// from this repository; short windows keep the ~40 runs to seconds.
class TuneTest : public testing::Test {
 protected:
  void SetUp() override {
    auto loaded = LoadModel(std::string(KVQ_SOURCE_DIR) + "/models/kvq-tiny-qwen2", 2);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    model_ = std::move(loaded).value();
    std::ifstream in(std::string(KVQ_SOURCE_DIR) + "/docs/ARCHITECTURE.md");
    std::stringstream text;
    text << in.rdbuf();
    text_ = text.str();
    work_ = (fs::temp_directory_path() / ("kvq-tune-test-" + std::to_string(getpid()))).string();
    fs::create_directories(work_);
  }
  void TearDown() override { fs::remove_all(work_); }

  TuneOptions Options(double budget) const {
    TuneOptions o;
    o.k_candidates = {"f16", "int8", "int2"};
    o.v_candidates = {"f16", "int4", "int2"};
    o.kl_budget = budget;
    o.context = 64;
    o.windows = 2;
    o.cache.num_threads = 2;
    o.work_dir = work_;
    return o;
  }

  LoadedModel model_;
  std::string text_, work_;
};

TEST_F(TuneTest, CheapestPolicyWithinBudgetAndFrontierIsHonest) {
  auto result = RunTune(model_, text_, Options(0.02));
  ASSERT_TRUE(result.ok()) << result.status().message();
  const TuneResult& r = *result;
  EXPECT_LE(r.best.measured_kl, 0.02);
  EXPECT_LT(r.best.bytes_per_token, r.f16_bytes_per_token);  // something was worth quantizing
  // Every accepted point was measured within budget; each rejected one over it.
  for (const TunePoint& p : r.frontier) {
    if (p.measured_kl < 0) continue;
    EXPECT_EQ(p.accepted, p.measured_kl <= 0.02) << p.step;
  }
  // The best policy is one the cache accepts for this model.
  auto layers =
      ParseKvPolicy(r.best.policy, model_.transformer->kv_shape().num_layers, {"f16", "f16"});
  ASSERT_TRUE(layers.ok()) << layers.status().message();
}

TEST_F(TuneTest, TinyBudgetKeepsF16AndBadInputIsAnError) {
  // int8 alone costs more than 1e-12 nats: nothing can be accepted.
  auto result = RunTune(model_, text_, Options(1e-12));
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->best.bytes_per_token, result->f16_bytes_per_token);
  TuneOptions bad = Options(0.01);
  bad.k_candidates = {"f16", "int3"};
  EXPECT_FALSE(RunTune(model_, text_, bad).ok());
  bad = Options(-1);
  EXPECT_FALSE(RunTune(model_, text_, bad).ok());
}

}  // namespace
}  // namespace kvq
