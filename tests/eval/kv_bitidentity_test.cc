// Bit-identity guard for refactors of the KV layer: every cache type kvq
// ships runs the shipped model (models/kvq-tiny-qwen2) over a fixed text
// (chunked prefill, then token-by-token decoding) and the FNV-1a hash of
// every logit it returns must equal tests/golden/kv_bitidentity_<level>.txt.
//
// SIMD kernels differ across Highway targets, so there is one golden per CPU
// feature level (CpuLevel()), and the test skips on a level without one. The
// avx3_dl golden was produced by this test from the tree before the codec
// registry / streaming refactor (issue 18), so a pass proves "before ==
// after" bit for bit; the avx2 one from main at 098eacc, the first session on
// an AVX2-only machine. Regenerate (or add a level): run this test, copy
// kv_bitidentity.actual from the build folder to the level's golden, and say
// why in the commit.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/loaded_model.h"
#include "eval/calibrate.h"
#include "eval/perplexity.h"
#include "kv/codec.h"
#include "kv/kv_factory.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

// The SIMD level the dispatch picks on this CPU, as far as the kernels'
// results can differ: AVX-512 with VNNI/VBMI (Highway's AVX3_DL), AVX-512,
// AVX2, or other.
std::string CpuLevel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi"))
    return "avx3_dl";
  if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) return "avx3";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
  return "other";
}

uint64_t Fnv1a(const std::vector<float>& values, uint64_t h) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size() * sizeof(float); ++i) {
    h ^= bytes[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Deterministic English-like text, about 400 tokens with this tokenizer.
std::string FixedText() {
  static const char* kWords[] = {"the",   "small", "model", "reads", "a",     "story", "about",
                                 "cats",  "and",   "dogs",  "who",   "lived", "near",  "river",
                                 "where", "old",   "trees", "grew",  "tall",  "in",    "spring"};
  std::string s;
  for (int i = 0; i < 330; ++i) {
    s += kWords[(i * 7 + i / 5) % 21];
    s += (i % 11 == 10) ? ". " : " ";
  }
  return s;
}

// One cache spec of the guard: --kv-cache-dtype (or K/V), rotate, policy.
struct Spec {
  std::string name;  // the key in the golden file
  KvCacheOptions options;
};

std::vector<Spec> AllSpecs(int64_t head_dim, const std::string& calibration) {
  std::vector<std::string> types = AllKvCodecNames(head_dim);
  for (const std::string& t : AllKvStreamingCodecNames(head_dim)) types.push_back(t);
  for (const char* t : {"fp8", "q8_0", "q4_0", "q4_1", "q4_0-norot", "kivi2", "kivi4", "gear2",
                        "gear4", "kvquant2", "kvquant3", "kvquant4", "nuq3-k-o2/nuq2-v-o0",
                        "f16/int4", "gear4-g64-t32-rank2-iter2-out1", "int8-c64-sym-r128"}) {
    types.push_back(t);
  }
  std::vector<Spec> specs;
  for (const std::string& t : types) {
    Spec spec{t, {}};
    spec.options.k_type = spec.options.v_type = t;
    if (t.find("prerope") != std::string::npos) spec.options.v_type = "f16";  // K only
    spec.options.calibration_path = calibration;
    specs.push_back(spec);
  }
  for (const char* t : {"f16", "int4", "int2-g64-sym", "fp8_e5m2", "kivi2"}) {
    Spec spec{std::string(t) + "+rot", {}};
    spec.options.k_type = spec.options.v_type = t;
    spec.options.rotate = true;
    specs.push_back(spec);
  }
  Spec policy{"policy:*:kivi2;0,-1:f16;1:int8/int4", {}};
  policy.options.policy = "*: kivi2; 0,-1: f16; 1: int8/int4";
  specs.push_back(policy);
  Spec block{"int4-block32", {}};
  block.options.k_type = block.options.v_type = "int4";
  block.options.block_tokens = 32;
  specs.push_back(block);
  return specs;
}

// Prefill in chunks of 61 tokens (every logit row), then one token at a time
// (each step's logits), hashing all of them in order.
StatusOr<uint64_t> RunSpec(LoadedModel& model, const std::vector<int32_t>& tokens,
                           KvCacheOptions options) {
  options.max_tokens = 512;
  options.num_threads = 2;
  KVQ_ASSIGN_OR_RETURN(auto cache, MakeKvCache(model.transformer->kv_shape(), options));
  KVQ_RETURN_IF_ERROR(cache->AddSequence(0));
  const size_t prefill = tokens.size() - 48;
  uint64_t h = 0xcbf29ce484222325ULL;
  std::vector<float> logits;
  for (size_t i = 0; i < tokens.size();) {
    const size_t n = i < prefill ? std::min<size_t>(61, prefill - i) : 1;
    std::vector<int32_t> chunk(tokens.begin() + i, tokens.begin() + i + n);
    KVQ_RETURN_IF_ERROR(model.transformer->Forward({{0, chunk, i < prefill}}, *cache, &logits));
    h = Fnv1a(logits, h);
    i += n;
  }
  return h;
}

std::string Hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

TEST(KvBitIdentity, EveryCacheTypeMatchesTheGoldenLogits) {
  const std::string model_dir = std::string(KVQ_SOURCE_DIR) + "/models/kvq-tiny-qwen2";
  auto loaded = LoadModel(model_dir, 2);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  LoadedModel model = std::move(loaded).value();
  const std::vector<int32_t> tokens = PerplexityTokens(model, FixedText());
  ASSERT_GE(tokens.size(), 300u);

  // KVQuant's codebooks from the same text (deterministic: the f32 model).
  CalibrateOptions calibrate;
  calibrate.tokens = 256;
  calibrate.context = 128;
  auto calibration = CalibrateKvTokens(model, tokens, calibrate);
  ASSERT_TRUE(calibration.ok()) << calibration.status().message();
  const std::string calibration_path =
      (fs::path(KVQ_BINARY_DIR) / "kv_bitidentity.calib.safetensors").string();
  ASSERT_TRUE(SaveKvCalibration(calibration->calibration, calibration_path).ok());

  std::ostringstream actual;
  actual << "cpu " << CpuLevel() << "\ntokens " << tokens.size() << "\n";
  std::map<std::string, std::string> got;
  for (const Spec& spec : AllSpecs(model.transformer->kv_shape().head_dim, calibration_path)) {
    auto h = RunSpec(model, tokens, spec.options);
    ASSERT_TRUE(h.ok()) << spec.name << ": " << h.status().message();
    got[spec.name] = Hex(*h);
    actual << spec.name << " " << Hex(*h) << "\n";
  }
  fs::remove(calibration_path);
  const std::string actual_path = (fs::path(KVQ_BINARY_DIR) / "kv_bitidentity.actual").string();
  std::ofstream(actual_path) << actual.str();

  const std::string golden_path =
      std::string(KVQ_SOURCE_DIR) + "/tests/golden/kv_bitidentity_" + CpuLevel() + ".txt";
  if (!fs::exists(golden_path)) {
    GTEST_SKIP() << "no golden for this CPU level (" << golden_path << "; this run: " << actual_path
                 << ")";
  }
  std::ifstream golden(golden_path);
  ASSERT_TRUE(golden) << golden_path << ": cannot read";
  std::string key, value;
  golden >> key >> value;
  ASSERT_EQ(key, "cpu");
  ASSERT_EQ(value, CpuLevel()) << golden_path << " was made on another CPU level";
  golden >> key >> value;
  ASSERT_EQ(key, "tokens");
  EXPECT_EQ(value, std::to_string(tokens.size()));
  size_t checked = 0;
  while (golden >> key >> value) {
    ASSERT_TRUE(got.count(key)) << key << " is in the golden but no longer run";
    EXPECT_EQ(got[key], value) << key << ": logits differ from the golden";
    ++checked;
  }
  EXPECT_GE(checked, 50u);
  // A codec added since the golden was made is reported, not failed: the
  // guard is about the ones that existed.
  if (checked < got.size()) {
    std::printf("kv_bitidentity: %zu specs are not in the golden yet (see %s)\n",
                got.size() - checked, actual_path.c_str());
  }
}

}  // namespace
}  // namespace kvq
