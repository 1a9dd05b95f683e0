// The transformers and vLLM exports of a cache type or per-layer policy.
#include "eval/kv_export.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace kvq {
namespace {

nlohmann::json Hf(const std::string& k, const std::string& v, const std::string& policy = "") {
  KvExportInput in;
  in.k_type = k;
  in.v_type = v;
  in.policy = policy;
  in.num_layers = 4;
  auto text = HfCacheExportJson(in);
  EXPECT_TRUE(text.ok()) << text.status().message();
  return text.ok() ? nlohmann::json::parse(*text) : nlohmann::json();
}

nlohmann::json Vllm(const std::string& k, const std::string& v, const std::string& policy = "",
                    const std::string& scales = "") {
  KvExportInput in;
  in.k_type = k;
  in.v_type = v;
  in.policy = policy;
  in.num_layers = 4;
  auto text = VllmCacheExportJson(in, scales);
  EXPECT_TRUE(text.ok()) << text.status().message();
  return text.ok() ? nlohmann::json::parse(*text) : nlohmann::json();
}

TEST(KvExport, HfQuantoSchemeIsExactWithHfDefaults) {
  const auto j = Hf("hf-quanto-int4", "hf-quanto-int4");
  const auto& c = j["cache_config"];
  EXPECT_EQ(c["backend"], "quanto");
  EXPECT_EQ(c["nbits"], 4);
  EXPECT_EQ(c["axis_key"], 0);
  EXPECT_EQ(c["axis_value"], 0);
  EXPECT_EQ(c["q_group_size"], 64);
  EXPECT_EQ(c["residual_length"], 128);
  EXPECT_EQ(j["exact"], true);
  EXPECT_EQ(j["layers"].size(), 4u);
  const auto kc = Hf("hf-quanto-int2-kc", "hf-quanto-int2-kc");
  EXPECT_EQ(kc["cache_config"]["axis_key"], -1);
  EXPECT_EQ(kc["cache_config"]["axis_value"], 0);
  EXPECT_EQ(kc["cache_config"]["nbits"], 2);
}

TEST(KvExport, HfCloseOrImpossibleIsSaid) {
  // KIVI: quanto's quantizer with kvq's residual rule, groups of 32: close.
  const auto kivi = Hf("kivi4", "kivi4");
  EXPECT_EQ(kivi["exact"], false);
  EXPECT_EQ(kivi["cache_config"]["axis_key"], -1);
  EXPECT_EQ(kivi["cache_config"]["q_group_size"], 32);
  EXPECT_EQ(kivi["cache_config"]["residual_length"], 128);
  // int8 has no quanto equivalent: no config, and the note says why.
  const auto int8 = Hf("int8", "int8");
  EXPECT_TRUE(int8["cache_config"].is_null());
  EXPECT_EQ(int8["exact"], false);
  EXPECT_NE(int8["note"].get<std::string>().find("no quanto equivalent"), std::string::npos);
  // A per-layer policy: the most frequent layer types, not exact.
  const auto mixed = Hf("f16", "f16", "*: hf-quanto-int4; 0: f16");
  EXPECT_EQ(mixed["exact"], false);
  EXPECT_EQ(mixed["cache_config"]["nbits"], 4);
  EXPECT_EQ(mixed["layers"][0]["k"], "f16");
  EXPECT_TRUE(mixed["layers"][0]["hf_k"].is_null());
  EXPECT_EQ(mixed["kv_policy"], "*: hf-quanto-int4; 0: f16");
}

TEST(KvExport, VllmDtypes) {
  EXPECT_EQ(Vllm("int8_per_token_head", "int8_per_token_head")["kv_cache_dtype"],
            "int8_per_token_head");
  EXPECT_EQ(Vllm("int8_per_token_head", "int8_per_token_head")["exact"], true);
  EXPECT_EQ(Vllm("f16", "f16")["kv_cache_dtype"], "auto");
  const auto t1 = Vllm("fp8_e4m3-t1", "fp8_e4m3-t1");
  EXPECT_EQ(t1["kv_cache_dtype"], "fp8_e4m3");
  EXPECT_EQ(t1["exact"], true);
  // Calibrated fp8 is exact only with the scales file.
  EXPECT_EQ(Vllm("fp8_e4m3-tcal", "fp8_e4m3-tcal")["exact"], false);
  EXPECT_EQ(Vllm("fp8_e4m3-tcal", "fp8_e4m3-tcal", "", "scales.safetensors")["exact"], true);
  // kvq's per-head fp8 maps to vLLM's dtype but not its scales.
  EXPECT_EQ(Vllm("fp8_e4m3", "fp8_e4m3")["exact"], false);
  // K and V differ: vLLM stores them alike.
  EXPECT_TRUE(Vllm("int8_per_token_head", "fp8_e4m3-t1")["kv_cache_dtype"].is_null());
  KvExportInput none;
  EXPECT_FALSE(HfCacheExportJson(none).ok()) << "no layer count";
  KvExportInput bad;
  bad.num_layers = 2;
  bad.k_type = "int3";
  EXPECT_FALSE(VllmCacheExportJson(bad, "").ok());
}

}  // namespace
}  // namespace kvq
