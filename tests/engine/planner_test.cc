#include "engine/planner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kv/codec.h"
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
  EXPECT_EQ(plan->k_bytes_per_token_layer, 8u * 256u);
  EXPECT_EQ(plan->v_bytes_per_token_layer, 8u * 512u);
  EXPECT_EQ(plan->layout.block_bytes, 32u * 8u * 16u * (256u + 512u));
  EXPECT_EQ(plan->layout.side_bytes, 0u);
  EXPECT_EQ(plan->nominal_bytes_per_token, 32.0 * 8 * 128 * (16 + 32) / 8);
  // 17 tokens occupy 2 blocks per sequence; 3 sequences.
  EXPECT_EQ(ExactKvBytes(plan->layout, 3, 17), 3.0 * 2 * 32 * 8 * 16 * (256 + 512));
  EXPECT_EQ(ExactKvBytes(plan->layout, 1, 16), 1.0 * 32 * 8 * 16 * (256 + 512));
}

// Integer codecs: row = head_dim * bits / 8 payload plus per-group scale (and
// zero-point), as each codec documents; computed from the codec's own
// RowBytes here only if the codec exists in this build.
TEST(Planner, ExactBytesOfIntegerTypesMatchTheCodecs) {
  const KvShape shape = Llama3Shape();
  for (const char* type : {"int8", "int4", "int4-g128", "int2"}) {
    auto codec = ParseKvCodec(type, shape.head_dim);
    if (!codec.ok()) GTEST_SKIP() << type << " not in this build: " << codec.status().message();
    KvCacheOptions options;
    options.max_tokens = 4096;
    options.k_type = options.v_type = type;
    auto plan = PlanKvType(shape, options);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    auto bits = NominalBits(type);
    ASSERT_TRUE(bits.ok());
    // Never below the nominal payload; scales make it strictly larger.
    EXPECT_GT(plan->layout.k_row_bytes, static_cast<size_t>(shape.head_dim * *bits / 8)) << type;
    EXPECT_EQ(plan->layout.block_bytes,
              static_cast<size_t>(32 * 8 * 16) * 2 * (*codec)->RowBytes());
  }
}

TEST(Planner, FitAnswersByHand) {
  KvLayout layout;
  layout.block_tokens = 16;
  layout.block_bytes = 1000;
  layout.side_bytes = 50;
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
// the paged cache behind MakeKvCache (the dense stand-in allocates per token,
// not per block, and fails this for T not a multiple of the block).
TEST(Planner, BytesEqualWhatTheCacheAllocates) {
  const KvShape shape{2, 4, 2, 64};
  for (const char* type : {"f32", "f16"}) {
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

TEST(Planner, ParsesMemoryAmounts) {
  EXPECT_EQ(*ParseMemoryAmount("16G", 0), 16e9);
  EXPECT_EQ(*ParseMemoryAmount("16gb", 0), 16e9);
  EXPECT_EQ(*ParseMemoryAmount("2GiB", 0), 2.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(*ParseMemoryAmount("512M", 0), 512e6);
  EXPECT_EQ(*ParseMemoryAmount("123456", 0), 123456.0);
  EXPECT_EQ(*ParseMemoryAmount("0.5", 8e9), 4e9);
  EXPECT_EQ(*ParseMemoryAmount("1", 8e9), 8e9);  // 1 = all of RAM
  for (const char* bad : {"", "abc", "-1", "0", "5X", "1.5.2G", "nan"}) {
    auto r = ParseMemoryAmount(bad, 8e9);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("memory amount"), std::string::npos);
  }
  EXPECT_FALSE(ParseMemoryAmount("0.5", 0).ok());  // RAM unknown
}

}  // namespace
}  // namespace kvq
