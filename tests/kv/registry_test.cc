// The codec registry (kv/codec_registry.h): every registered spelling
// parses, round-trips through its canonical name and runs every kernel
// family (encode, decode, fused scores, fused values) against the scalar
// truth; unimplemented widths are errors, not another width; the generated
// docs and fuzz dictionary equal what the registry prints.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kv/codec_formats.h"
#include "kv/codec_registry.h"
#include "kv/kv_calibration.h"
#include "kv/kv_factory.h"
#include "kv/kv_policy.h"

namespace kvq {
namespace {

// The K and V codec names a registered spelling stands for.
std::vector<std::pair<std::string, bool>> CodecNamesOf(const std::string& type) {
  auto types = ExpandKvScheme(type);
  EXPECT_TRUE(types.ok()) << type;
  if (!types.ok()) return {};
  return {{types->k_type, false}, {types->v_type, true}};
}

// NUQ codecs need codebooks: evenly spaced levels and unit channel ranges
// are enough to exercise their kernels (and OSCAR's a rotation).
KvCalibration UnitCalibration(int64_t dim) {
  KvCalibration c;
  c.source = "test";
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = dim;
  c.k_offset.assign(static_cast<size_t>(dim), 0.0f);
  c.k_scale.assign(static_cast<size_t>(dim), 1.0f);
  // OSCAR codecs need a rotation: the identity is one.
  c.rotation_objective = "identity";
  c.k_rotation.assign(static_cast<size_t>(dim * dim), 0.0f);
  for (int64_t i = 0; i < dim; ++i) c.k_rotation[static_cast<size_t>(i * dim + i)] = 1.0f;
  c.v_rotation = c.k_rotation;
  for (int bits : {2, 3, 4}) {
    const int levels = 1 << bits;
    for (int i = 0; i < levels; ++i) {
      const float level = -1.0f + 2.0f * static_cast<float>(i) / static_cast<float>(levels - 1);
      c.codebooks[bits].k.push_back(level);
      c.codebooks[bits].v.push_back(level);
    }
  }
  c.fp8_k_scale = {0.01f};  // vLLM's per-tensor fp8 (fp8_e4m3-tcal): |x| up to 4.48
  c.fp8_v_scale = {0.02f};
  return c;
}

TEST(KvRegistry, EveryRegisteredSpellingParsesAndRoundTrips) {
  for (int64_t dim : {64, 128}) {
    const std::vector<std::string> types = RegisteredKvCacheTypes(dim);
    ASSERT_GE(types.size(), 40u);
    for (const std::string& type : types) {
      for (const auto& [name, is_v] : CodecNamesOf(type)) {
        auto spec = ParseKvCodecSpec(name);
        ASSERT_TRUE(spec.ok()) << type << ": " << spec.status().message();
        auto again = ParseKvCodecSpec(spec->Name());
        ASSERT_TRUE(again.ok()) << spec->Name();
        EXPECT_EQ(again->Name(), spec->Name());
        EXPECT_GT(spec->NominalBits(), 0.0) << name;
        auto exact = spec->ExactBits(dim);
        ASSERT_TRUE(exact.ok()) << name << " at " << dim << ": " << exact.status().message();
        EXPECT_GE(*exact, spec->NominalBits()) << name << ": exact bits below nominal";
      }
    }
  }
}

// One spec through every kernel family on random rows, the SIMD instance
// against its scalar reference twin (a kernel of another width or option
// would decode other values). Decode must agree bit for bit (codec.h) and
// ScoresPrepared must equal Scores bit for bit on both paths. Fused scores:
// SIMD paths may quantize the query to int8 (per channel group, or after
// folding per-channel scales; GEAR's base does while its reference scores
// the decoded rows in f32), which moves a score by up to half a q8 step per
// element; the precise per-family bounds are in each codec's own tests. This
// walk only has to tell a right kernel from a wrong one, which moves scores
// by the order of scale * sum|q| * M (M = the tile's largest |value|), so it
// allows 5% of that. Values are not quantized: 1e-5 of sum |p x| (f32
// accumulation of <= 2 tiles of terms against double).
void WalkKernels(const KvCodec& simd, const KvCodec& ref, std::mt19937& rng) {
  const int64_t dim = simd.head_dim(), tile = simd.streaming().tile_tokens;
  const int64_t n = 2 * tile + (tile == 1 ? 37 : 0), group = 3;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * dim)), q(static_cast<size_t>(group * dim));
  for (float& v : x) v = normal(rng);
  for (float& v : q) v = normal(rng);
  ASSERT_EQ(simd.RowBytes(), ref.RowBytes());
  std::vector<uint8_t> rows(static_cast<size_t>(n) * simd.RowBytes());
  std::vector<uint8_t> simd_rows(rows.size());
  ref.Encode(x.data(), n, rows.data());
  simd.Encode(x.data(), n, simd_rows.data());  // runs; its bytes are checked by codec tests
  std::vector<float> decoded(x.size()), decoded_simd(x.size());
  ref.Decode(rows.data(), n, decoded.data());
  simd.Decode(rows.data(), n, decoded_simd.data());
  double max_abs = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(std::isfinite(decoded[i]));
    ASSERT_EQ(decoded_simd[i], decoded[i]) << "decode differs at " << i;
    max_abs = std::max(max_abs, std::fabs(double{decoded[i]}));
  }
  for (const KvCodec* codec : {&simd, &ref}) {
    std::vector<float> scores(static_cast<size_t>(group * n)), prepared_scores(scores.size());
    codec->Scores(rows.data(), n, q.data(), group, 0.125f, scores.data(), n);
    std::vector<uint8_t> prepared(codec->PreparedQueryBytes(group));
    codec->PrepareQuery(q.data(), group, prepared.data());
    codec->ScoresPrepared(rows.data(), n, q.data(), prepared.data(), group, 0.125f,
                          prepared_scores.data(), n);
    ASSERT_EQ(prepared_scores, scores) << "ScoresPrepared differs from Scores";
  }
  std::vector<float> s_simd(static_cast<size_t>(group * n)), s_ref(s_simd.size());
  simd.Scores(rows.data(), n, q.data(), group, 0.125f, s_simd.data(), n);
  ref.Scores(rows.data(), n, q.data(), group, 0.125f, s_ref.data(), n);
  for (int64_t h = 0; h < group; ++h) {
    double sum_q = 0;
    for (int64_t i = 0; i < dim; ++i) sum_q += std::fabs(double{q[h * dim + i]});
    const double bound = 0.05 * 0.125 * sum_q * max_abs + 1e-7;
    for (int64_t t = 0; t < n; ++t) {
      const size_t k = static_cast<size_t>(h * n + t);
      ASSERT_NEAR(s_simd[k], s_ref[k], bound) << "scores h=" << h << " t=" << t;
    }
  }
  std::vector<float> p(static_cast<size_t>(group * n));
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (float& v : p) v = uniform(rng);
  std::vector<float> acc(static_cast<size_t>(group * dim), 0.0f), acc_ref(acc.size(), 0.0f);
  simd.AccumulateV(rows.data(), n, p.data(), group, n, acc.data());
  codec::AccumulateVByDecoding(ref, rows.data(), n, p.data(), group, n, acc_ref.data());
  for (int64_t h = 0; h < group; ++h) {
    for (int64_t i = 0; i < dim; ++i) {
      double abs_px = 0;
      for (int64_t t = 0; t < n; ++t) {
        abs_px += std::fabs(double{p[h * n + t]} * decoded[t * dim + i]);
      }
      ASSERT_NEAR(acc[h * dim + i], acc_ref[h * dim + i], 1e-5 * abs_px + 1e-7)
          << "values h=" << h << " i=" << i;
    }
  }
}

TEST(KvRegistry, EverySpecRunsEncodeDecodeScoresAndValues) {
  std::mt19937 rng(18);
  int walked = 0;
  for (int64_t dim : {64, 128}) {
    const KvCalibration calibration = UnitCalibration(dim);
    for (const std::string& type : RegisteredKvCacheTypes(dim)) {
      for (const auto& [name, is_v] : CodecNamesOf(type)) {
        (void)is_v;
        auto spec = ParseKvCodecSpec(name);
        ASSERT_TRUE(spec.ok()) << name;
        auto simd = spec->Make(dim, CodecPath::kSimd);
        auto ref = spec->Make(dim, CodecPath::kReference);
        ASSERT_TRUE(simd.ok() && ref.ok()) << name << ": " << simd.status().message();
        for (KvCodec* codec : {simd->get(), ref->get()}) {
          if (codec->NeedsCalibrationFile()) {
            // A NUQ codec is calibrated for the side its name says, whichever
            // side the registered spelling puts it on.
            const bool v_side = name.find("-v") != std::string::npos;
            const Status set = codec->SetCalibration(calibration, 0, 0, v_side);
            ASSERT_TRUE(set.ok()) << name << ": " << set.message();
          }
        }
        SCOPED_TRACE(name + " at head_dim " + std::to_string(dim));
        WalkKernels(**simd, **ref, rng);
        if (HasFatalFailure()) return;
        ++walked;
      }
    }
  }
  EXPECT_GT(walked, 100);
}

// The one dispatcher of each kernel family refuses a width it has no
// kernel for instead of running another one (int3 used to run as int2).
TEST(KvRegistry, UnimplementedWidthsAreErrors) {
  for (bool symmetric : {false, true}) {
    const codec::IntFormat int3{3, 32, symmetric};
    EXPECT_FALSE(codec::IntKernelStatus(int3).ok());
    auto made = codec::MakeIntCodec(int3, 64, CodecPath::kSimd);
    ASSERT_FALSE(made.ok());
    EXPECT_NE(made.status().message().find("3-bit"), std::string::npos) << made.status().message();
    EXPECT_FALSE(
        codec::MakeChannelCodec(codec::IntFormat{5, 32, symmetric, true}, 64, CodecPath::kSimd)
            .ok());
  }
  for (int bits : {1, 5, 8}) {
    codec::NuqFormat nuq;
    nuq.bits = bits;
    EXPECT_FALSE(codec::MakeNuqCodec(nuq, 64, CodecPath::kSimd).ok()) << bits;
  }
  for (int bits : {8, 4, 2}) EXPECT_TRUE(codec::IntKernelStatus({bits, 32, false}).ok()) << bits;
  EXPECT_FALSE(ParseKvCodecSpec("int3").ok());
  EXPECT_FALSE(ParseKvCodecSpec("nuq5-k").ok());
}

TEST(KvRegistry, OtherProjectsSpellingsMapToTheirClosestCodec) {
  const std::pair<const char*, const char*> expected[] = {
      {"fp8", "fp8_e4m3"},      {"fp8_e4m3", "fp8_e4m3"},
      {"fp8_e5m2", "fp8_e5m2"}, {"auto", "f16"},
      {"f16", "f16"},           {"q8_0", "q8_0"},
      {"q4_0", "q4_0"},         {"q4_1", "q4_1"},
      {"q5_0", "q5_0"},         {"q5_1", "q5_1"},
      {"iq4_nl", "iq4_nl"},     {"iq4_nl-norot", "iq4_nl-norot"},
      {"q4_0-r64", "q4_0-r64"}, {"q4_0-r64-norot", "q4_0-norot-r64"}};
  for (const auto& [alias, canonical] : expected) {
    auto spec = ParseKvCodecSpec(alias);
    ASSERT_TRUE(spec.ok()) << alias << ": " << spec.status().message();
    EXPECT_EQ(spec->Name(), canonical) << alias;
  }
  // Every alias says how close it is, in --help and the docs.
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (const KvAlias& a : family->aliases) EXPECT_GT(std::string(a.note).size(), 10u) << a.alias;
  }
  EXPECT_NE(KvCacheTypesHelp(false).find("iq4_nl"), std::string::npos);
  // llama.cpp's names are its formats now, and only -norot is an option.
  for (const char* bad : {"q4_0-norot-norot", "q4_0-sym", "q4_0-g64", "q6_0", "q4_0-rot"}) {
    auto spec = ParseKvCodecSpec(bad);
    ASSERT_FALSE(spec.ok()) << bad;
    EXPECT_NE(spec.status().message().find(bad), std::string::npos) << spec.status().message();
  }
}

// The typed spec in KvCacheOptions is used only while it matches the
// strings it was parsed from; a caller that edits k_type gets a fresh parse.
TEST(KvRegistry, OptionsHoldOneParseAndNoticeEditedStrings) {
  KvCacheOptions options;
  options.k_type = options.v_type = "kivi2";
  auto types = ParseKvCacheTypes(options.k_type, options.v_type, options.policy);
  ASSERT_TRUE(types.ok());
  options.types = *types;
  auto held = KvCacheTypesOf(options);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->get(), types->get());
  EXPECT_EQ((*held)->defaults.k.Name(), "int2-c32-asym-r128");
  options.k_type = "int4";
  auto fresh = ResolveKvLayerSpecs(options, 3);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)[2].k.Name(), "int4-g32-asym");
  EXPECT_EQ((*fresh)[2].v.Name(), "int2-g32-asym-r128");
  options.policy = "0: f16; -1: q8_0";
  auto layers = ResolveKvLayerSpecs(options, 3);
  ASSERT_TRUE(layers.ok()) << layers.status().message();
  EXPECT_EQ((*layers)[0].v.Name(), "f16");
  EXPECT_EQ((*layers)[1].k.Name(), "int4-g32-asym");
  EXPECT_EQ((*layers)[2].k.Name(), "q8_0");
  options.policy = "5: f16";
  EXPECT_FALSE(ResolveKvLayerSpecs(options, 3).ok());
  EXPECT_FALSE(ParseKvCacheTypes("f16", "nuq3-k-prerope", "").ok());  // -prerope is for K
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// docs/cache-types.md and fuzz/kv_spec.dict are generated from the registry
// (`kvq help cache-types --markdown` / `--fuzz-dict`); regenerate them when
// this fails.
TEST(KvRegistry, GeneratedDocsAndFuzzDictionaryAreCurrent) {
  const std::string root = KVQ_SOURCE_DIR;
  EXPECT_EQ(ReadFile(root + "/docs/cache-types.md"), KvCacheTypesHelp(true))
      << "run: build/bin/kvq help cache-types --markdown > docs/cache-types.md";
  EXPECT_EQ(ReadFile(root + "/fuzz/kv_spec.dict"), KvCacheTypesFuzzDictionary())
      << "run: build/bin/kvq help cache-types --fuzz-dict > fuzz/kv_spec.dict";
}

}  // namespace
}  // namespace kvq
