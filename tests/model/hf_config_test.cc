#include "model/hf_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/tensor_names.h"

namespace kvq {
namespace {

using json = nlohmann::json;

// Qwen2.5-0.5B-Instruct's config.json, as published.
constexpr const char* kQwen25 = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

// Llama-3.2-1B's config.json, as published.
constexpr const char* kLlama32 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

TEST(HfConfigTest, Qwen25) {
  auto c = ParseHfConfig(kQwen25, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kQwen2);
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_EQ(c->hidden_size, 896);
  EXPECT_EQ(c->intermediate_size, 4864);
  EXPECT_EQ(c->num_layers, 24);
  EXPECT_EQ(c->num_heads, 14);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c->rope_layout, RopeLayout::kHalves);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->KvBytesPerTokenF16(), 2 * 24 * 2 * 64 * 2);
}

TEST(HfConfigTest, Llama32WithLlama3RopeScaling) {
  auto c = ParseHfConfig(kLlama32, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kLlama);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->rope_theta, 500000);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 32);
  EXPECT_EQ(c->rope_scaling.low_freq_factor, 1);
  EXPECT_EQ(c->rope_scaling.high_freq_factor, 4);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->max_position_embeddings, 131072);
}

json Parse(const char* text) { return json::parse(text); }

std::string ErrorOf(const json& j) {
  auto c = ParseHfConfig(j.dump(), "cfg/config.json");
  return c.ok() ? std::string("OK") : c.status().message();
}

TEST(HfConfigTest, DefaultsAndVariants) {
  json j = Parse(kLlama32);
  j.erase("num_key_value_heads");  // defaults to the head count
  j.erase("head_dim");             // defaults to hidden / heads
  j["rope_scaling"] = nullptr;
  auto c = ParseHfConfig(j.dump(), "x");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->num_kv_heads, 32);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);

  // head_dim different from hidden / heads.
  j["head_dim"] = 128;
  c = ParseHfConfig(j.dump(), "x");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->head_dim, 128);

  // transformers 5 puts rope settings in rope_parameters.
  json k = Parse(kLlama32);
  k.erase("rope_theta");
  k["rope_parameters"] = k["rope_scaling"];
  k["rope_parameters"]["rope_theta"] = 250000.0;
  k.erase("rope_scaling");
  c = ParseHfConfig(k.dump(), "x");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope_theta, 250000);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);

  // "default" rope type means no scaling.
  json d = Parse(kQwen25);
  d["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(ErrorOf(d), "OK");
}

TEST(HfConfigTest, Errors) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads"}) {
    json j = Parse(kQwen25);
    j.erase(key);
    EXPECT_EQ(ErrorOf(j), std::string("cfg/config.json: missing required key '") + key + "'");
  }
  json j = Parse(kQwen25);
  j["architectures"] = {"MistralForCausalLM"};
  EXPECT_EQ(ErrorOf(j),
            "cfg/config.json: unsupported architecture 'MistralForCausalLM' (supported: "
            "Qwen2ForCausalLM, LlamaForCausalLM)");
  j = Parse(kLlama32);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_EQ(ErrorOf(j),
            "cfg/config.json: unsupported rope_scaling type 'yarn' (supported: llama3)");
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  EXPECT_NE(ErrorOf(j).find("'linear'"), std::string::npos);
  j["rope_scaling"] = {{"rope_type", "llama3"}};
  EXPECT_NE(ErrorOf(j).find("missing required key 'factor'"), std::string::npos);
  j = Parse(kQwen25);
  j["hidden_size"] = "896";
  EXPECT_NE(ErrorOf(j).find("'hidden_size' must be an integer"), std::string::npos);
  j["hidden_size"] = 896.5;
  EXPECT_NE(ErrorOf(j).find("'hidden_size' must be an integer"), std::string::npos);
  j = Parse(kQwen25);
  j["num_key_value_heads"] = 3;
  EXPECT_NE(ErrorOf(j).find("not a multiple of num_kv_heads"), std::string::npos);
  j = Parse(kQwen25);
  j["num_attention_heads"] = 0;
  EXPECT_NE(ErrorOf(j).find("out of range"), std::string::npos);
  j = Parse(kQwen25);
  j["hidden_size"] = -5;
  EXPECT_NE(ErrorOf(j).find("out of range"), std::string::npos);
  j = Parse(kQwen25);
  j["vocab_size"] = 1ll << 40;
  EXPECT_NE(ErrorOf(j).find("vocab_size"), std::string::npos);
  j = Parse(kQwen25);
  j["hidden_size"] = 900;  // 900 / 14 is not whole
  EXPECT_NE(ErrorOf(j).find("not divisible"), std::string::npos);
  j = Parse(kQwen25);
  j["use_sliding_window"] = true;
  EXPECT_NE(ErrorOf(j).find("use_sliding_window"), std::string::npos);
  j = Parse(kLlama32);
  j["attention_bias"] = true;
  EXPECT_NE(ErrorOf(j).find("attention_bias"), std::string::npos);
  j = Parse(kLlama32);
  j["tie_word_embeddings"] = 1;
  EXPECT_NE(ErrorOf(j).find("must be a boolean"), std::string::npos);
  j = Parse(kLlama32);
  j["hidden_act"] = "gelu";
  EXPECT_NE(ErrorOf(j).find("hidden_act"), std::string::npos);

  for (const char* bad : {"", "{", "{\"a\": }", "[1,2]", "null", "{\"architectures\": 3}",
                          "\xff\xfe", "{\"architectures\": []}"}) {
    auto c = ParseHfConfig(bad, "m/config.json");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().message().rfind("m/config.json: ", 0), 0u) << c.status().message();
  }
  auto missing = LoadHfConfig("/nonexistent/config.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/config.json"), std::string::npos);
}

TEST(HfConfigTest, WriterRoundTrips) {
  for (const char* text : {kQwen25, kLlama32}) {
    auto c = ParseHfConfig(text, "x");
    ASSERT_TRUE(c.ok());
    auto again = ParseHfConfig(HfConfigJson(*c), "y");
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_EQ(HfConfigJson(*again), HfConfigJson(*c));
  }
}

TEST(TensorNamesTest, MapsBothWays) {
  EXPECT_EQ(*CanonicalFromHfName("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(*CanonicalFromHfName("model.norm.weight"), "output_norm.weight");
  EXPECT_EQ(*CanonicalFromHfName("lm_head.weight"), "output.weight");
  EXPECT_EQ(*CanonicalFromHfName("model.layers.12.self_attn.k_proj.bias"), "blk.12.attn_k.bias");
  EXPECT_EQ(*CanonicalFromHfName("model.layers.0.mlp.down_proj.weight"), "blk.0.ffn_down.weight");
  EXPECT_EQ(*CanonicalFromHfName("model.layers.3.post_attention_layernorm.weight"),
            "blk.3.ffn_norm.weight");
  EXPECT_EQ(*CanonicalFromHfName("model.layers.3.self_attn.rotary_emb.inv_freq"), "");
  EXPECT_FALSE(CanonicalFromHfName("model.layers.x.mlp.up_proj.weight"));
  EXPECT_FALSE(CanonicalFromHfName("model.layers.-1.mlp.up_proj.weight"));
  EXPECT_FALSE(CanonicalFromHfName("model.layers.1.self_attn.q_norm.weight"));
  EXPECT_EQ(*HfNameFromCanonical("blk.7.attn_output.weight"),
            "model.layers.7.self_attn.o_proj.weight");
  EXPECT_FALSE(HfNameFromCanonical("rope_freqs.weight"));
  // Every expected tensor maps to HF and back (rope_freqs is GGUF-only).
  auto c = ParseHfConfig(kQwen25, "x");
  for (const ExpectedTensor& t : ExpectedTensors(*c)) {
    auto hf = HfNameFromCanonical(t.name);
    ASSERT_TRUE(hf) << t.name;
    EXPECT_EQ(*CanonicalFromHfName(*hf), t.name);
  }
  EXPECT_EQ(ExpectedTensors(*c).size(), 1 + 24 * 12 + 1u);
}

}  // namespace
}  // namespace kvq
