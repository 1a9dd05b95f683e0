#include "eval/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kv/codec.h"
#include "kv/kv_calibration.h"
#include "model/model_presets.h"

namespace kvq {
namespace {

double Gb2(double bytes) { return std::round(bytes / 1e9 * 100) / 100; }  // GB, 2 decimals

KvShape Llama3Shape() {
  auto m = LoadPlanModel("Llama-3-8B");
  EXPECT_TRUE(m.ok()) << m.status().message();
  return PlanKvShape(m->config);
}

// The nominal table of ../shared/design/SCHEMES.md: 2 * 32 * 8 * 128 * bits/8
// bytes per token, decimal GB.
TEST(Planner, ReproducesTheNominalLlama3Table) {
  const KvShape shape = Llama3Shape();
  KvCacheOptions options;
  options.k_type = options.v_type = "f16";
  options.max_tokens = 131072;
  auto f16 = PlanKvType(shape, options);
  ASSERT_TRUE(f16.ok()) << f16.status().message();
  EXPECT_EQ(f16->nominal_bytes_per_token, 131072.0);
  EXPECT_EQ(NominalKvBytes(*f16, 1, 4096), 536870912.0);
  EXPECT_EQ(Gb2(NominalKvBytes(*f16, 1, 4096)), 0.54);
  EXPECT_EQ(Gb2(NominalKvBytes(*f16, 1, 8192)), 1.07);
  EXPECT_EQ(Gb2(NominalKvBytes(*f16, 1, 32768)), 4.29);
  EXPECT_EQ(Gb2(NominalKvBytes(*f16, 1, 131072)), 17.18);
  EXPECT_EQ(std::round(NominalKvBytes(*f16, 64, 32768) / 1e9), 275.0);  // "≈ 275 GB"
  // 4-bit at 128K: nominal bits of the int4 codec, whatever its scales cost.
  auto bits = NominalBits("int4-g64");
  ASSERT_TRUE(bits.ok());
  EXPECT_EQ(*bits, 4);
  EXPECT_EQ(Gb2(NominalKvBytesPerToken(shape, *bits, *bits) * 131072), 4.29);
}

// f16 and f32 rows hold head_dim values and nothing else, so by hand:
// f16 row = 128 * 2 = 256 B; a 16-token block of Llama-3-8B holds
// 32 layers * 8 heads * 16 tokens * (256 + 256) = 2,097,152 B.
TEST(Planner, ExactBytesOfUnquantizedTypesByHand) {
  const KvShape shape = Llama3Shape();
  KvCacheOptions options;
  options.max_tokens = 8192;
  options.k_type = "f16";
  options.v_type = "f32";
  auto plan = PlanKvType(shape, options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->layout.k_row_bytes, 256u);
  EXPECT_EQ(plan->layout.v_row_bytes, 512u);
  EXPECT_EQ(plan->k_bytes_per_token_layer, 8.0 * 256);
  EXPECT_EQ(plan->v_bytes_per_token_layer, 8.0 * 512);
  EXPECT_EQ(plan->layout.block_bytes, 32u * 8u * 16u * (256u + 512u));
  EXPECT_EQ(plan->layout.side_bytes, 0u);
  EXPECT_EQ(plan->nominal_bytes_per_token, 32.0 * 8 * 128 * (16 + 32) / 8);
  // 17 tokens occupy 2 blocks per sequence; 3 sequences.
  EXPECT_EQ(ExactKvBytes(plan->layout, 3, 17), 3.0 * 2 * 32 * 8 * 16 * (256 + 512));
  EXPECT_EQ(ExactKvBytes(plan->layout, 1, 16), 1.0 * 32 * 8 * 16 * (256 + 512));
}

// Quantized formats by hand (codec.h layouts), Llama-3-8B (head_dim 128,
// 32 layers x 8 KV heads, 16-token blocks, tiles padded to 64 bytes):
//   intN-gG-asym row = 128 * N / 8 code bytes + (128 / G) * (f16 scale + f16 min)
//   intN-gG-sym  row = 128 * N / 8 + (128 / G) * f16 scale
//   fp8 row = 128 bytes, plus one f32 scale per (layer, K/V, KV head) as side data.
struct HandLayout {
  const char* type;
  size_t row_bytes;
  size_t tile_bytes;  // 16 rows rounded up to a multiple of 64
  size_t side_bytes;
};
TEST(Planner, ExactBytesOfQuantizedTypesByHand) {
  const KvShape shape = Llama3Shape();
  const HandLayout cases[] = {{"int8", 128 + 4 * 4, 16 * 144, 0},      // 2304 = 36 * 64
                              {"int4", 64 + 4 * 4, 16 * 80, 0},        // 1280 = 20 * 64
                              {"int4-g128-sym", 64 + 1 * 2, 1088, 0},  // 16 * 66 = 1056 -> 17 * 64
                              {"int2", 32 + 4 * 4, 16 * 48, 0},        // 768 = 12 * 64
                              {"int2-g128", 32 + 1 * 4, 576, 0},       // 16 * 36 = 576 = 9 * 64
                              {"fp8_e4m3", 128, 16 * 128, 32 * 8 * 2 * sizeof(float)}};
  for (const HandLayout& h : cases) {
    KvCacheOptions options;
    options.max_tokens = 4096;
    options.k_type = options.v_type = h.type;
    auto plan = PlanKvType(shape, options);
    ASSERT_TRUE(plan.ok()) << h.type << ": " << plan.status().message();
    EXPECT_EQ(plan->layout.k_row_bytes, h.row_bytes) << h.type;
    EXPECT_EQ(plan->layout.v_row_bytes, h.row_bytes) << h.type;
    EXPECT_EQ(plan->layout.block_bytes, 32u * 8u * 2u * h.tile_bytes) << h.type;
    EXPECT_EQ(plan->layout.side_bytes, h.side_bytes) << h.type;
    EXPECT_EQ(plan->k_bytes_per_token_layer, 8.0 * h.tile_bytes / 16) << h.type;
    // 100 tokens = 7 blocks; 2 sequences.
    EXPECT_EQ(ExactKvBytes(plan->layout, 2, 100),
              2.0 * 7 * 32 * 8 * 2 * h.tile_bytes + h.side_bytes)
        << h.type;
  }
  // The SCHEMES.md 4-bit figure is nominal; int4-g32-asym adds 25% (16 of 64 bytes).
  KvCacheOptions options;
  options.max_tokens = 131072;
  options.k_type = options.v_type = "int4";
  auto int4 = PlanKvType(shape, options);
  ASSERT_TRUE(int4.ok());
  EXPECT_EQ(Gb2(NominalKvBytes(*int4, 1, 131072)), 4.29);
  EXPECT_EQ(int4->layout.BytesPerToken(), 1.25 * int4->nominal_bytes_per_token);
}

TEST(Planner, FitAnswersByHand) {
  KvLayout layout;
  layout.block_tokens = 16;
  layout.block_bytes = 1000;
  layout.side_bytes = layout.codec_side_bytes = 50;
  // batch 2 x 40 tokens = 2 * 3 blocks = 6000 B + 50 side; weights 10000.
  FitAnswer a = PlanFit(layout, 10000, 16050, 2, 40);
  EXPECT_EQ(a.kv_bytes, 6050);
  EXPECT_EQ(a.total_bytes, 16050);
  EXPECT_TRUE(a.fits);
  EXPECT_EQ(a.max_context, 3 * 16);  // room 6000 / (2 * 1000) = 3 blocks
  EXPECT_EQ(a.max_batch, 2);         // 6000 / 3000
  FitAnswer b = PlanFit(layout, 10000, 16049, 2, 40);
  EXPECT_FALSE(b.fits);
  EXPECT_EQ(b.max_context, 2 * 16);
  EXPECT_EQ(b.max_batch, 1);
  FitAnswer none = PlanFit(layout, 20000, 16000, 1, 16);  // weights alone exceed memory
  EXPECT_FALSE(none.fits);
  EXPECT_EQ(none.max_context, 0);
  EXPECT_EQ(none.max_batch, 0);
}

// A cache that keeps K before RoPE also holds the cos/sin table attention
// rotates it with: a row of head_dim floats per block of the context plus
// block_tokens rows, counted as side data that grows with the context.
TEST(Planner, PreRopeSideDataGrowsWithTheContext) {
  KvShape shape{2, 4, 2, 64};
  shape.rope_inv_freq.assign(32, 1.0f);
  KvCacheOptions options;
  options.k_type = "f16-prerope";
  options.v_type = "f16";
  options.max_tokens = 100;
  auto plan = PlanKvType(shape, options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const KvLayout& layout = plan->layout;
  EXPECT_EQ(layout.codec_side_bytes, 0u);
  EXPECT_EQ(layout.side_bytes, (7u + 16u) * 64 * 4);  // ceil(100 / 16) + 16 rows
  EXPECT_EQ(layout.SideBytesFor(1000), (63u + 16u) * 64 * 4);
  EXPECT_EQ(ExactKvBytes(layout, 2, 1000),
            2.0 * static_cast<double>(layout.SequenceBytes(1000)) + (63 + 16) * 64 * 4);
  options.k_type = "f16";
  auto plain = PlanKvType(shape, options);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->layout.SideBytesFor(1000), 0u);
}

// Published parameter counts (the model cards / HF safetensors totals) check
// the preset shapes, since a wrong head count or FFN size changes them.
TEST(Planner, PresetParameterCountsMatchThePublishedOnes) {
  const std::vector<std::pair<const char*, int64_t>> expected = {
      {"Llama-3-8B", 8030261248},  {"Llama-2-7B", 6738415616}, {"Mistral-7B", 7241732096},
      {"Qwen2.5-0.5B", 494032768}, {"Qwen2.5-7B", 7615616512}, {"Qwen2.5-72B", 72706203648},
      {"Falcon-7B", 6921720704}};
  for (const auto& [name, params] : expected) {
    auto m = LoadPlanModel(name);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->parameters, params) << name;
  }
  auto falcon = LoadPlanModel("falcon-7b");  // names are case-insensitive
  ASSERT_TRUE(falcon.ok());
  EXPECT_EQ(falcon->config.num_kv_heads, 1);
  EXPECT_EQ(PlanWarnings(*falcon, 2, 2).size(), 1u);
  EXPECT_EQ(PlanWarnings(*falcon, 4, 4).size(), 0u);
  auto llama = LoadPlanModel("Llama-3-8B");
  EXPECT_EQ(PlanWarnings(*llama, 2, 2).size(), 0u);
  // f16 weights: 2 bytes per parameter.
  bool found = false;
  for (const auto& [dtype, bytes] : llama->weight_bytes) {
    if (dtype == std::string("f16")) {
      EXPECT_EQ(bytes, 2 * 8030261248);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

// The planner's bytes are what the cache really allocates: append T tokens to
// one and two sequences and compare BytesUsed() with ExactKvBytes. Requires
// the paged cache behind MakeKvCache.
TEST(Planner, BytesEqualWhatTheCacheAllocates) {
  const KvShape shape{2, 4, 2, 64};
  for (const char* type : {"f32", "f16", "int8", "int4-g64", "int4-g32-sym", "int2", "fp8_e5m2"}) {
    KvCacheOptions options;
    options.k_type = options.v_type = type;
    options.max_tokens = 256;
    options.memory_bytes = 0;
    auto plan = PlanKvType(shape, options);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    for (int64_t tokens : {1, 15, 16, 17, 100, 256}) {
      auto cache = MakeKvCache(shape, options);
      ASSERT_TRUE(cache.ok()) << cache.status().message();
      // [tokens, num_kv_heads, head_dim]
      std::vector<float> kv(static_cast<size_t>(tokens * shape.num_kv_heads * shape.head_dim),
                            0.25f);
      for (SeqId seq : {0, 1}) {
        if (seq == 1 && 2 * tokens > 256) break;  // the default budget holds one full sequence
        ASSERT_TRUE((*cache)->AddSequence(seq).ok());
        for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
          ASSERT_TRUE((*cache)->Append(seq, layer, tokens, kv.data(), kv.data(), kv.data()).ok());
        }
        EXPECT_EQ(static_cast<double>((*cache)->BytesUsed()),
                  ExactKvBytes(plan->layout, seq + 1, tokens))
            << type << ", " << tokens << " tokens, " << seq + 1 << " sequence(s), cache "
            << (*cache)->TypeName();
      }
    }
  }
}

// Issue 19's schemes (llama.cpp's, vLLM's and transformers' formats,
// TurboQuant, QJL, OSCAR/QuaRot INT2, detected sinks): the same check, on
// random rows (sink detection and the streaming windows depend on them), with
// prefill chunks that cross the windows' edges. The calibrated ones read a
// file with identity rotations and fp8 scales (bytes do not depend on them).
TEST(Planner, Issue19SchemesBytesEqualWhatTheCacheAllocates) {
  const KvShape shape{2, 4, 2, 64};
  KvCalibration c;
  c.source = "planner_test";
  c.num_layers = shape.num_layers;
  c.num_heads = shape.num_heads;
  c.num_kv_heads = shape.num_kv_heads;
  c.head_dim = shape.head_dim;
  const size_t channels = static_cast<size_t>(shape.num_layers * shape.num_kv_heads * 64);
  c.k_offset.assign(channels, 0.0f);
  c.k_scale.assign(channels, 1.0f);
  for (int bits : {2, 3, 4}) {
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      for (int i = 0; i < (1 << bits); ++i) {
        const float level =
            -1.0f + 2.0f * static_cast<float>(i) / static_cast<float>((1 << bits) - 1);
        c.codebooks[bits].k.push_back(level);
        c.codebooks[bits].v.push_back(level);
      }
    }
  }
  c.fp8_k_scale.assign(static_cast<size_t>(shape.num_layers), 0.01f);
  c.fp8_v_scale = c.fp8_k_scale;
  c.rotation_objective = "identity";
  c.k_rotation.assign(channels * 64, 0.0f);
  for (size_t m = 0; m < channels; ++m) c.k_rotation[m * 64 + m % 64] = 1.0f;
  c.v_rotation = c.k_rotation;
  const std::string path =
      (std::filesystem::temp_directory_path() / "kvq_planner_test_issue19.safetensors").string();
  ASSERT_TRUE(SaveKvCalibration(c, path).ok());
  std::mt19937 rng(19);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const char* type : {"q8_0",
                           "q4_0",
                           "q4_1",
                           "q5_0",
                           "q5_1",
                           "iq4_nl",
                           "q4_0-norot",
                           "fp8_e4m3-t1",
                           "fp8_e4m3-tcal",
                           "int8_per_token_head",
                           "fp8_per_token_head",
                           "int4_per_token_head",
                           "hf-quanto-int4",
                           "hf-quanto-int2",
                           "hf-quanto-int2-kc",
                           "turboquant_k8v4",
                           "turboquant_4bit_nc",
                           "turboquant_k3v4_nc",
                           "turboquant_3bit_nc",
                           "turboquant2.5",
                           "turboquant3.5",
                           "qjl_k1v4",
                           "oscar2",
                           "quarot2",
                           "oscar-int2",
                           "int2-g64-asym-a4"}) {
    SCOPED_TRACE(type);
    KvCacheOptions options;
    options.k_type = options.v_type = type;
    options.max_tokens = 512;
    options.memory_bytes = 0;
    options.calibration_path = path;
    auto plan = PlanKvType(shape, options);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    for (int64_t tokens : {1, 17, 100, 300, 512}) {
      auto cache = MakeKvCache(shape, options);
      ASSERT_TRUE(cache.ok()) << cache.status().message();
      ASSERT_TRUE((*cache)->AddSequence(0).ok());
      const int64_t chunk = 128;  // prefill chunks, as the engine appends them
      std::vector<float> kv(static_cast<size_t>(chunk * shape.num_kv_heads * shape.head_dim));
      for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
        for (int64_t done = 0; done < tokens; done += chunk) {
          for (float& x : kv) x = normal(rng);
          const int64_t n = std::min(chunk, tokens - done);
          ASSERT_TRUE((*cache)->Append(0, layer, n, kv.data(), kv.data(), kv.data()).ok());
        }
      }
      EXPECT_EQ(static_cast<double>((*cache)->BytesUsed()), ExactKvBytes(plan->layout, 1, tokens))
          << tokens << " tokens, cache " << (*cache)->TypeName();
    }
  }
  std::filesystem::remove(path);
}

TEST(Planner, BadInputsAreClearErrors) {
  auto missing = LoadPlanModel("/nonexistent/model.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model.gguf"), std::string::npos);
  EXPECT_NE(missing.status().message().find("Llama-3-8B"), std::string::npos);
  EXPECT_FALSE(NominalBits("int3").ok());
  const KvShape shape = Llama3Shape();
  KvCacheOptions options;
  options.max_tokens = 16;
  options.k_type = options.v_type = "nonsense";
  EXPECT_FALSE(PlanKvType(shape, options).ok());
  options.k_type = options.v_type = "f16";
  options.block_tokens = 0;
  EXPECT_FALSE(PlanKvType(shape, options).ok());
}

}  // namespace
}  // namespace kvq
