// KV codecs: name parsing, SIMD == scalar reference on every compiled Highway
// target (bytes of Encode, bits of Decode, Scores/AccumulateV within derived
// bounds), fused kernels == Decode-then-math, and round-trip error bounds
// derived from each format.
//
// codec_int.cc opts in to Highway's AVX3_DL target; so does this file, so
// the target loop covers it (the other codec files, not compiled for it, run
// their baseline target in that iteration). Before any Highway include.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#include "kv/codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
#include "int_scores_bounds.h"
#include "kv/codec_formats.h"
#include "kv/kv_test_util.h"

namespace kvq {
namespace {

// Smallest positive f32 subnormal (absolute error of one underflowing op <= half of it).
constexpr double kTinyAbs = 1.401298464324817e-45;

bool IsFp8(const std::string& name) { return name.rfind("fp8", 0) == 0; }

// ---------------------------------------------------------------- test data

enum class RowKind {
  kNormal,     // N(0, 1)
  kZeros,      // all 0
  kConstant,   // one value repeated
  kOutlier,    // N(0, 1) plus one value of 1000
  kNegative,   // -|N(0, 1)| - 0.5
  kLarge,      // N(0, 3e4): f16-range edge for asym mins
  kHuge,       // N(0, 3e6): f16 overflows, asym mins saturate, fp8 scales > 2^8
  kTiny,       // N(0, 1e-6): f16 subnormal scales
  kWideRange,  // log-uniform magnitudes 2^-20 .. 2^12, random signs
};
constexpr RowKind kAllKinds[] = {RowKind::kNormal,  RowKind::kZeros,    RowKind::kConstant,
                                 RowKind::kOutlier, RowKind::kNegative, RowKind::kLarge,
                                 RowKind::kHuge,    RowKind::kTiny,     RowKind::kWideRange};

// x: [n, dim], every row of the given kind.
std::vector<float> MakeRows(RowKind kind, int64_t n, int64_t dim, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-20.0f, 12.0f);
  std::vector<float> x(static_cast<size_t>(n * dim));
  for (int64_t t = 0; t < n; ++t) {
    const float constant = normal(rng) * 10.0f;
    for (int64_t i = 0; i < dim; ++i) {
      float& v = x[t * dim + i];
      switch (kind) {
        case RowKind::kNormal:
          v = normal(rng);
          break;
        case RowKind::kZeros:
          v = 0.0f;
          break;
        case RowKind::kConstant:
          v = constant;
          break;
        case RowKind::kOutlier:
          v = i == (t * 7) % dim ? 1000.0f : normal(rng);
          break;
        case RowKind::kNegative:
          v = -std::fabs(normal(rng)) - 0.5f;
          break;
        case RowKind::kLarge:
          v = normal(rng) * 3e4f;
          break;
        case RowKind::kHuge:
          v = normal(rng) * 3e6f;
          break;
        case RowKind::kTiny:
          v = normal(rng) * 1e-6f;
          break;
        case RowKind::kWideRange:
          v = std::exp2(uniform(rng)) * (normal(rng) < 0 ? -1.0f : 1.0f);
          break;
      }
    }
  }
  return x;
}

bool SameBits(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0;
}

// ---------------------------------------------------------------- parser

TEST(CodecParseTest, EveryNameRoundTripsWithItsLayout) {
  // Toy head_dims (8, 40) allow only the float codecs (scalar kernels).
  EXPECT_EQ(AllKvCodecNames(8).size(), 5u);
  EXPECT_FALSE(ParseKvCodec("int8", 40).ok());
  for (int64_t dim : {8, 40, 32, 64, 96, 128, 256}) {
    for (const std::string& name : AllKvCodecNames(dim)) {
      auto codec = MustParse(name, dim);
      ASSERT_NE(codec, nullptr);
      EXPECT_EQ(codec->Name(), name);
      EXPECT_EQ(codec->head_dim(), dim);
      EXPECT_EQ(MustParse(codec->Name(), dim)->RowBytes(), codec->RowBytes());
      // Expected bytes from the layout in codec.h, written out independently.
      size_t expected = 0;
      if (name == "f32") expected = 4 * dim;
      if (name == "f16" || name == "bf16") expected = 2 * dim;
      if (IsFp8(name)) expected = dim;
      if (name.rfind("int", 0) == 0) {
        const int bits = name[3] - '0';
        const int64_t group = std::stoll(name.substr(name.find("-g") + 2));
        const bool sym = name.find("-sym") != std::string::npos;
        expected = dim * bits / 8 + (dim / group) * (sym ? 2 : 4);
      }
      // llama.cpp's blocks: f16 d (+ f16 m), (+ 4 bytes of fifth bits), codes.
      const std::pair<const char*, size_t> ggml_blocks[] = {
          {"q8_0", 2 + 32},     {"q4_0", 2 + 16},     {"q4_1", 4 + 16},
          {"q5_0", 2 + 4 + 16}, {"q5_1", 4 + 4 + 16}, {"iq4_nl", 2 + 16}};
      for (const auto& [type, block_bytes] : ggml_blocks) {
        if (name == type) expected = static_cast<size_t>(dim / 32) * block_bytes;
      }
      EXPECT_EQ(codec->RowBytes(), expected) << name;
      EXPECT_EQ(codec->SideBytes(), IsFp8(name) ? 4u : 0u) << name;
      EXPECT_EQ(codec->NeedsCalibration(), IsFp8(name)) << name;
    }
  }
}

TEST(CodecParseTest, DefaultsOptionsInAnyOrderAndAliases) {
  const std::pair<const char*, const char*> cases[] = {
      {"int4", "int4-g32-asym"},
      {"int8", "int8-g32-asym"},
      {"int2", "int2-g32-asym"},
      {"int4-g64", "int4-g64-asym"},
      {"int4-sym", "int4-g32-sym"},
      {"int2-asym-g128", "int2-g128-asym"},
      {"int8-g128-sym", "int8-g128-sym"},
      {"fp8", "fp8_e4m3"},
      {"q8_0", "q8_0"},
      {"q4_0", "q4_0"},
      {"q4_1", "q4_1"},
      {"q5_0-norot", "q5_0-norot"},
  };
  for (const auto& [spelled, canonical] : cases) {
    auto codec = MustParse(spelled, 128);
    ASSERT_NE(codec, nullptr);
    EXPECT_EQ(codec->Name(), canonical) << spelled;
  }
  // llama.cpp's q4_0 / q4_1 / q8_0 byte counts per 32 values.
  EXPECT_EQ(MustParse("q4_0", 32)->RowBytes(), 18u);
  EXPECT_EQ(MustParse("q4_1", 32)->RowBytes(), 20u);
  EXPECT_EQ(MustParse("q8_0", 32)->RowBytes(), 34u);
}

TEST(CodecParseTest, BadNamesAreClearErrors) {
  const char* bad[] = {"",        "f8",           "int3",         "int4-g48",     "int4-g",
                       "int4-g0", "int4-g99999",  "int4-sym-sym", "int4-g32-g64", "int4-",
                       "f16-g32", "fp8_e4m3-sym", "INT4",         "int4-fast",    "int4--sym",
                       "int16"};
  for (const char* name : bad) {
    auto codec = ParseKvCodec(name, 128);
    ASSERT_FALSE(codec.ok()) << "'" << name << "' parsed";
    EXPECT_NE(codec.status().message().find("'" + std::string(name) + "'"), std::string::npos)
        << codec.status().message();
  }
}

TEST(CodecParseTest, GroupMustDivideHeadDimAndHeadDimMustBeValid) {
  auto g128 = ParseKvCodec("int4-g128", 64);
  ASSERT_FALSE(g128.ok());
  EXPECT_NE(g128.status().message().find("does not divide head_dim 64"), std::string::npos)
      << g128.status().message();
  EXPECT_FALSE(ParseKvCodec("int8-g64-sym", 96).ok());
  EXPECT_TRUE(ParseKvCodec("int8-g32-sym", 96).ok());
  for (int64_t dim : {0, -16, 2048}) {
    auto codec = ParseKvCodec("f16", dim);
    ASSERT_FALSE(codec.ok()) << dim;
    EXPECT_NE(codec.status().message().find("head_dim"), std::string::npos);
  }
  // AllKvCodecNames lists only valid group sizes.
  for (const std::string& name : AllKvCodecNames(96)) {
    EXPECT_EQ(name.find("-g64"), std::string::npos) << name;
    EXPECT_EQ(name.find("-g128"), std::string::npos) << name;
  }
}

// docs/ARCHITECTURE.md's codec table is what `kvq plan` reproduces: every
// row must match the codecs, and every codec must have a row.
TEST(CodecParseTest, ArchitectureTableMatchesCodecs) {
  std::ifstream doc(std::string(KVQ_SOURCE_DIR) + "/docs/ARCHITECTURE.md");
  ASSERT_TRUE(doc.good());
  std::string line;
  std::set<std::string> seen;
  while (std::getline(doc, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream in(line.substr(1));
    std::string cell;
    while (std::getline(in, cell, '|')) {
      cell.erase(0, cell.find_first_not_of(" `"));
      cell.erase(cell.find_last_not_of(" `") + 1);
      cells.push_back(cell);
    }
    if (cells.size() < 4) continue;
    const std::string& name = cells[0];
    auto d128 = ParseKvCodec(name, 128);
    if (!d128.ok()) continue;  // some other table
    seen.insert(name);
    EXPECT_EQ(std::to_string((*d128)->RowBytes()), cells[2]) << name;
    auto d64 = ParseKvCodec(name, 64);
    EXPECT_EQ(d64.ok() ? std::to_string((*d64)->RowBytes()) : "—", cells[1]) << name;
    std::ostringstream bits;
    bits << (*d128)->RowBytes() * 8.0 / 128;
    EXPECT_EQ(bits.str(), cells[3]) << name;
  }
  for (const std::string& name : AllKvCodecNames(128)) EXPECT_EQ(seen.count(name), 1u) << name;
}

// ---------------------------------------------------------------- SIMD == reference

class CodecSimdTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(CodecSimdTest);

// A pair of codecs (SIMD, reference) calibrated on the same first rows.
struct CodecPair {
  std::unique_ptr<KvCodec> fast, ref;
};
CodecPair MakePair(const std::string& name, int64_t dim, const std::vector<float>& calib,
                   int64_t calib_rows) {
  CodecPair pair{MustParse(name, dim, CodecPath::kSimd),
                 MustParse(name, dim, CodecPath::kReference)};
  pair.fast->Calibrate(calib.data(), calib_rows);
  pair.ref->Calibrate(calib.data(), calib_rows);
  return pair;
}

// Scores bound: both sides use the same decoded x (Decode is exact and equal
// on both paths). The fast path rounds dim products and dim - 1 sums in f32
// in some order, then multiplies by `scale`: by the recursive summation
// bound, |fast - exact| <= gamma_(dim+1) * |scale| * sum |q_i x_i|,
// gamma_k = k eps / (1 - k eps). The reference accumulates in double and
// rounds once (eps relative). dim + 2 covers both; underflow adds at most a
// subnormal half-unit per operation.
double ScoreBound(const float* q, const float* x, int64_t dim, float scale) {
  double abs_sum = 0.0;
  for (int64_t i = 0; i < dim; ++i) abs_sum += std::fabs(static_cast<double>(q[i]) * x[i]);
  const double k = static_cast<double>(dim + 2);
  return k * kEps / (1.0 - k * kEps) * std::fabs(scale) * abs_sum + 2.0 * k * kTinyAbs;
}

// Checks codec.Scores and codec.AccumulateV against double math over
// codec.Decode's output: the definition in codec.h.
void ExpectFusedMatchDecode(const KvCodec& codec, const std::vector<uint8_t>& rows, int64_t n,
                            int64_t group, std::mt19937& rng, const std::string& what) {
  const int64_t dim = codec.head_dim();
  std::vector<float> x(static_cast<size_t>(n * dim));  // [n, dim]
  if (n > 0) codec.Decode(rows.data(), n, x.data());
  std::optional<codec::IntFormat> int_format;
  const std::string name = codec.Name();
  if (name.rfind("int", 0) == 0 && name.find("-g") != std::string::npos) {
    int_format = codec::IntFormat{name[3] - '0', std::stoll(name.substr(name.find("-g") + 2)),
                                  name.find("-sym") != std::string::npos};
  }
  // Per-channel int tiles (int2-c32-asym...): integer Scores too, bound from
  // the tile's channel scales.
  const bool per_channel_int = name.rfind("int", 0) == 0 && name.find("-c") != std::string::npos;
  const int64_t tile_tokens = codec.streaming().tile_tokens;
  const std::vector<float> q = Normal(static_cast<size_t>(group * dim), rng);  // [group, dim]
  const int64_t stride = n + 3;  // not n: the kernels must honour it
  const float scale = 0.125f;
  std::vector<float> scores(static_cast<size_t>(group * stride), -7.0f);
  codec.Scores(rows.data(), n, q.data(), group, scale, scores.data(), stride);
  for (int64_t h = 0; h < group; ++h) {
    for (int64_t t = 0; t < stride; ++t) {
      const float got = scores[h * stride + t];
      if (t >= n) {
        ASSERT_EQ(got, -7.0f) << what << ": Scores wrote past n";
        continue;
      }
      const float* xt = x.data() + t * dim;
      const float* qh = q.data() + h * dim;
      double exact = 0.0;
      for (int64_t i = 0; i < dim; ++i) exact += static_cast<double>(qh[i]) * xt[i];
      exact *= scale;
      if (!std::isfinite(exact)) continue;  // inf rows (f16 overflow) are checked elsewhere
      double bound = ScoreBound(qh, xt, dim, scale);
      if (int_format) {  // q quantized per group: codec_int_scores.h
        bound = int_scores_bounds::QuantizationBound(*int_format, dim, xt, qh, scale) +
                int_scores_bounds::EpilogueBound(*int_format, dim,
                                                 rows.data() + t * codec.RowBytes(), qh, scale);
      }
      if (per_channel_int) {
        const uint8_t* tile = rows.data() + t / tile_tokens * tile_tokens * codec.RowBytes();
        bound = int_scores_bounds::ChannelScoreBound(
            name[3] - '0', name.find("-sym") != std::string::npos, dim, tile, xt, qh, scale);
      }
      ASSERT_NEAR(got, exact, bound) << what << " Scores h " << h << " t " << t;
    }
  }
  // Softmax-like weights (non-negative, some exactly 0) and a non-zero start.
  std::vector<float> p(static_cast<size_t>(group * stride));
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (float& v : p) v = unit(rng) < 0.1f ? 0.0f : unit(rng);
  const std::vector<float> acc0 = Normal(static_cast<size_t>(group * dim), rng);
  std::vector<float> acc = acc0;
  codec.AccumulateV(rows.data(), n, p.data(), group, stride, acc.data());
  for (int64_t h = 0; h < group; ++h) {
    for (int64_t i = 0; i < dim; ++i) {
      double exact = acc0[h * dim + i], abs_sum = std::fabs(exact);
      for (int64_t t = 0; t < n; ++t) {
        const double term = static_cast<double>(p[h * stride + t]) * x[t * dim + i];
        exact += term;
        abs_sum += std::fabs(term);
      }
      if (!std::isfinite(exact)) continue;
      // n products and n sums into the running f32 accumulator (or one
      // rounding from double on the reference path): gamma_(n+1).
      const double k = static_cast<double>(n + 2);
      ASSERT_NEAR(acc[h * dim + i], exact, k * kEps / (1.0 - k * kEps) * abs_sum + 2 * k * kTinyAbs)
          << what << " AccumulateV h " << h << " i " << i;
    }
  }
}

TEST_P(CodecSimdTest, EncodeDecodeBitExactAndFusedKernelsMatchDecode) {
  std::mt19937 rng(2024);
  const int64_t lengths[] = {0, 1, 2, 7, 33, 1001};
  for (int64_t dim : {8, 32, 64, 96, 128}) {
    for (const std::string& name : AllKvCodecNames(dim)) {
      for (RowKind kind : kAllKinds) {
        for (int64_t n : lengths) {
          // Long rows only for the normal kind, to keep the emulated targets quick.
          if (n > 33 && kind != RowKind::kNormal) continue;
          const std::string what = name + " dim " + std::to_string(dim) + " n " +
                                   std::to_string(n) + " kind " +
                                   std::to_string(static_cast<int>(kind));
          const std::vector<float> x = MakeRows(kind, n, dim, rng);
          // fp8: calibrate on the first half, so the rest includes values
          // beyond the calibrated range (saturation on both paths).
          const CodecPair pair = MakePair(name, dim, x, n / 2);
          const size_t bytes = static_cast<size_t>(n) * pair.fast->RowBytes();
          std::vector<uint8_t> fast_rows(bytes + 1, 0xAB), ref_rows(bytes + 1, 0xCD);
          pair.fast->Encode(x.data(), n, fast_rows.data());
          pair.ref->Encode(x.data(), n, ref_rows.data());
          ASSERT_EQ(fast_rows[bytes], 0xAB) << what << ": Encode wrote past its rows";
          fast_rows.pop_back();
          ref_rows.pop_back();
          for (size_t b = 0; b < bytes; ++b) {
            ASSERT_EQ(fast_rows[b], ref_rows[b]) << what << " byte " << b;
          }
          std::vector<float> fast_x(x.size(), 1.0f), ref_x(x.size(), 2.0f);
          if (n > 0) {
            pair.fast->Decode(fast_rows.data(), n, fast_x.data());
            pair.ref->Decode(ref_rows.data(), n, ref_x.data());
          }
          for (size_t i = 0; i < x.size(); ++i) {
            ASSERT_TRUE(SameBits(fast_x[i], ref_x[i]))
                << what << " value " << i << ": " << fast_x[i] << " vs " << ref_x[i];
          }
          const int64_t group = 1 + static_cast<int64_t>(rng() % 8);
          ExpectFusedMatchDecode(*pair.fast, fast_rows, n, group, rng, what + " simd");
          if (n <= 33) ExpectFusedMatchDecode(*pair.ref, ref_rows, n, group, rng, what + " ref");
        }
      }
    }
  }
}

// Per-channel tiles and streaming options: Encode takes whole tiles, the
// fused kernels any prefix of them (the cache's causal mask asks for those).
TEST_P(CodecSimdTest, PerChannelTilesMatchDecode) {
  std::mt19937 rng(404);
  for (int64_t dim : {32, 64, 128}) {
    for (const std::string& name : AllKvStreamingCodecNames(dim)) {
      const CodecPair pair = MakePair(name, dim, {}, 0);
      const int64_t tile = pair.fast->streaming().tile_tokens;
      for (int64_t tiles : {0, 1, 3}) {
        const int64_t n = tiles * tile;
        const std::string what = name + " dim " + std::to_string(dim) + " n " + std::to_string(n);
        const std::vector<float> x = MakeRows(RowKind::kNormal, n, dim, rng);
        const size_t bytes = static_cast<size_t>(n) * pair.fast->RowBytes();
        std::vector<uint8_t> fast_rows(bytes + 1, 0xAB), ref_rows(bytes + 1, 0xCD);
        pair.fast->Encode(x.data(), n, fast_rows.data());
        pair.ref->Encode(x.data(), n, ref_rows.data());
        ASSERT_EQ(fast_rows[bytes], 0xAB) << what << ": Encode wrote past its rows";
        fast_rows.pop_back();
        ref_rows.pop_back();
        ASSERT_EQ(fast_rows, ref_rows) << what;
        std::vector<float> fast_x(x.size()), ref_x(x.size());
        if (n > 0) {
          pair.fast->Decode(fast_rows.data(), n, fast_x.data());
          pair.ref->Decode(ref_rows.data(), n, ref_x.data());
        }
        for (size_t i = 0; i < x.size(); ++i) {
          ASSERT_TRUE(SameBits(fast_x[i], ref_x[i])) << what << " value " << i;
        }
        for (int64_t prefix : {n, n - 1, std::min<int64_t>(n, 5)}) {
          if (prefix < 0) continue;
          const int64_t group = 1 + static_cast<int64_t>(rng() % 8);
          const std::string where = what + " prefix " + std::to_string(prefix);
          ExpectFusedMatchDecode(*pair.fast, fast_rows, prefix, group, rng, where + " simd");
          ExpectFusedMatchDecode(*pair.ref, ref_rows, prefix, group, rng, where + " ref");
        }
      }
    }
  }
}

// Per channel, each value is within half a step of its channel's grid over
// the tile (plus the f16 rounding of scale and min), even when other
// channels are 1000x larger: the property KIVI relies on for keys.
TEST(CodecRoundTripTest, PerChannelErrorFollowsEachChannelsRange) {
  std::mt19937 rng(8);
  for (const char* name : {"int2-c32-asym", "int4-c64-asym", "int8-c32-asym"}) {
    const auto codec = MustParse(name, 64, CodecPath::kSimd);
    const int64_t tile = codec->streaming().tile_tokens;
    std::vector<float> x = Normal(static_cast<size_t>(tile * 64), rng);
    for (int64_t t = 0; t < tile; ++t) x[t * 64 + 9] = 1000.0f + x[t * 64 + 9];
    std::vector<uint8_t> rows(static_cast<size_t>(tile) * codec->RowBytes());
    codec->Encode(x.data(), tile, rows.data());
    std::vector<float> back(x.size());
    codec->Decode(rows.data(), tile, back.data());
    const int bits = name[3] - '0';
    for (int64_t c = 0; c < 64; ++c) {
      float lo = x[c], hi = x[c];
      for (int64_t t = 0; t < tile; ++t) {
        lo = std::min(lo, x[t * 64 + c]);
        hi = std::max(hi, x[t * 64 + c]);
      }
      const double step = (hi - lo) / ((1 << bits) - 1);
      // Half a step, plus the f16 scale's error (relative 2^-11, times at most
      // 2^bits - 1 steps) and the f16 min's (2^-11 |min|).
      const double bound =
          step / 2 + step * ((1 << bits) - 1) * 0x1p-11 + std::fabs(lo) * 0x1p-11 + 1e-6;
      for (int64_t t = 0; t < tile; ++t) {
        ASSERT_NEAR(back[t * 64 + c], x[t * 64 + c], bound) << name << " channel " << c;
      }
    }
  }
}

TEST_P(CodecSimdTest, EveryGqaGroupSizeIncludingWideOnes) {
  std::mt19937 rng(77);
  for (const char* name : {"f16", "int4-g32-asym", "int2-g64-sym", "fp8_e5m2"}) {
    for (int64_t group : {1, 2, 3, 4, 5, 6, 7, 8, 14, 71}) {
      const std::vector<float> x = MakeRows(RowKind::kNormal, 17, 128, rng);
      const CodecPair pair = MakePair(name, 128, x, 17);
      std::vector<uint8_t> rows(17 * pair.fast->RowBytes());
      pair.fast->Encode(x.data(), 17, rows.data());
      ExpectFusedMatchDecode(*pair.fast, rows, 17, group, rng, name);
    }
  }
}

// Per-channel integer Scores: the SIMD kernel equals its scalar twin up to
// the epilogue's f32 rounding (the integer dots are exact on both), over
// whole and partial tiles, every GQA group size up to two passes.
TEST_P(CodecSimdTest, PerChannelIntegerScoresMatchTheScalarTwin) {
  std::mt19937 rng(91);
  for (int64_t dim : {32, 64, 128}) {
    for (const char* name : {"int2-c32-asym", "int4-c64-asym", "int8-c32-sym", "int2-c128-sym"}) {
      if (!ParseKvCodec(name, dim).ok()) continue;  // e.g. a tile whose rows are not whole words
      const CodecPair pair = MakePair(name, dim, {}, 0);
      const int64_t tile = pair.fast->streaming().tile_tokens, n = 3 * tile;
      const std::vector<float> x = MakeRows(RowKind::kNormal, n, dim, rng);
      std::vector<uint8_t> rows(static_cast<size_t>(n) * pair.fast->RowBytes());
      pair.fast->Encode(x.data(), n, rows.data());
      const bool symmetric = std::string(name).find("-sym") != std::string::npos;
      for (int64_t group : {1, 3, 7, 8, 9, 16}) {
        const std::vector<float> q = Normal(static_cast<size_t>(group * dim), rng);
        for (int64_t count : {n, n - 1, tile + 1, int64_t{1}}) {
          std::vector<float> fast(static_cast<size_t>(group * n)), ref(fast.size());
          pair.fast->Scores(rows.data(), count, q.data(), group, 0.125f, fast.data(), n);
          pair.ref->Scores(rows.data(), count, q.data(), group, 0.125f, ref.data(), n);
          for (int64_t h = 0; h < group; ++h) {
            for (int64_t t = 0; t < count; ++t) {
              const uint8_t* tile_bytes = rows.data() + t / tile * tile * pair.fast->RowBytes();
              const double bound = int_scores_bounds::ChannelEpilogueBound(
                  name[3] - '0', symmetric, dim, tile_bytes, &q[h * dim], 0.125f);
              ASSERT_NEAR(fast[h * n + t], ref[h * n + t], bound)
                  << name << " dim " << dim << " group " << group << " h " << h << " t " << t;
            }
          }
        }
      }
    }
  }
}

// A query prepared once (PrepareQuery) gives exactly the scores Scores gives
// (codec.h): the same quantization, hoisted. Every codec, GQA groups past one
// 8-head pass, row counts around the vector width, on both paths.
TEST_P(CodecSimdTest, PreparedQueryScoresEqualScoresBitForBit) {
  std::mt19937 rng(31);
  for (int64_t dim : {64, 128}) {
    for (const std::string& name : AllKvCodecNames(dim)) {
      for (CodecPath path : {CodecPath::kSimd, CodecPath::kReference}) {
        const std::unique_ptr<KvCodec> codec = MustParse(name, dim, path);
        const int64_t n = 33;
        const std::vector<float> x = MakeRows(RowKind::kNormal, n, dim, rng);
        codec->Calibrate(x.data(), n);
        std::vector<uint8_t> rows(static_cast<size_t>(n) * codec->RowBytes());
        codec->Encode(x.data(), n, rows.data());
        for (int64_t group : {1, 7, 9}) {
          const std::vector<float> q = Normal(static_cast<size_t>(group * dim), rng);
          std::vector<uint8_t> prepared(codec->PreparedQueryBytes(group));
          codec->PrepareQuery(q.data(), group, prepared.data());
          for (int64_t count : {1, 15, 16, 17, 33}) {
            std::vector<float> direct(static_cast<size_t>(group * n), -1.0f), hoisted = direct;
            codec->Scores(rows.data(), count, q.data(), group, 0.125f, direct.data(), n);
            codec->ScoresPrepared(rows.data(), count, q.data(), prepared.data(), group, 0.125f,
                                  hoisted.data(), n);
            for (size_t i = 0; i < direct.size(); ++i) {
              ASSERT_TRUE(SameBits(direct[i], hoisted[i]))
                  << name << " dim " << dim << " group " << group << " count " << count << " at "
                  << i << ": " << direct[i] << " vs " << hoisted[i];
            }
          }
        }
      }
    }
  }
}

TEST_P(CodecSimdTest, Fp8EveryCodeAndEveryTieRoundsToNearestEven) {
  for (const codec::Fp8Format& f : {codec::kE4M3, codec::kE5M2}) {
    // Finite codes sorted by value: 0x00..max_code (positive magnitudes).
    std::vector<float> values;
    for (int c = 0; c <= f.max_code; ++c) values.push_back(codec::Fp8DecodeRef(c, f));
    EXPECT_EQ(values.back(), f.max_finite);
    // Inputs: every code's value, every midpoint between neighbours (a tie),
    // points just inside each midpoint, and beyond the range; both signs.
    std::vector<float> inputs;
    for (size_t c = 0; c < values.size(); ++c) {
      inputs.push_back(values[c]);
      if (c + 1 < values.size()) {
        const float mid = 0.5f * (values[c] + values[c + 1]);  // exact: one more bit
        inputs.push_back(mid);
        inputs.push_back(std::nextafter(mid, 0.0f));
        inputs.push_back(std::nextafter(mid, 1e30f));
      }
    }
    for (float big : {f.max_finite * 1.01f, f.max_finite * 1000.0f, 3e38f,
                      std::numeric_limits<float>::infinity(), 1e-30f, 1e-44f}) {
      inputs.push_back(big);
    }
    const size_t positive = inputs.size();
    for (size_t i = 0; i < positive; ++i) inputs.push_back(-inputs[i]);
    while (inputs.size() % 16 != 0) inputs.push_back(0.0f);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const float y = inputs[i];
      const uint8_t code = codec::Fp8EncodeRef(y, f);
      const float got = codec::Fp8DecodeRef(code, f);
      ASSERT_TRUE(std::isfinite(got)) << f.name << " " << y;
      ASSERT_EQ(std::signbit(got), std::signbit(y)) << f.name << " " << y;
      // Nearest finite value by brute force; a tie goes to the even code.
      const double a = std::fabs(static_cast<double>(y));
      // (Beyond max_finite the nearest is max_code; a double difference
      // cannot resolve neighbours near 3e38, so that case is set directly.)
      int best = a >= f.max_finite ? f.max_code : 0;
      for (int c = 1; c < static_cast<int>(values.size()) && a < f.max_finite; ++c) {
        const double dc = std::fabs(values[c] - a), db = std::fabs(values[best] - a);
        if (dc < db || (dc == db && c % 2 == 0)) best = c;
      }
      ASSERT_EQ(code & 0x7F, best) << f.name << " y " << y;
    }
    // The SIMD encoder on the same inputs (scale 1: an uncalibrated codec).
    const int64_t dim = 16;
    const int64_t n = static_cast<int64_t>(inputs.size()) / dim;
    auto fast = MustParse(f.name, dim);
    std::vector<uint8_t> rows(inputs.size());
    fast->Encode(inputs.data(), n, rows.data());
    for (size_t i = 0; i < inputs.size(); ++i) {
      ASSERT_EQ(rows[i], codec::Fp8EncodeRef(inputs[i], f)) << f.name << " " << inputs[i];
    }
    // NaN stays NaN through both paths.
    std::vector<float> nan_row(dim, std::numeric_limits<float>::quiet_NaN());
    fast->Encode(nan_row.data(), 1, rows.data());
    std::vector<float> back(dim);
    fast->Decode(rows.data(), 1, back.data());
    EXPECT_TRUE(std::isnan(back[0])) << f.name;
  }
}

// ---------------------------------------------------------------- round-trip bounds

std::vector<float> RoundTrip(const KvCodec& codec, const std::vector<float>& x, int64_t n,
                             std::vector<uint8_t>* rows_out = nullptr) {
  std::vector<uint8_t> rows(static_cast<size_t>(n) * codec.RowBytes());
  codec.Encode(x.data(), n, rows.data());
  std::vector<float> back(x.size());
  codec.Decode(rows.data(), n, back.data());
  if (rows_out) *rows_out = rows;
  return back;
}

TEST(CodecRoundTripTest, ZerosStayExactlyZero) {
  for (const std::string& name : AllKvCodecNames(64)) {
    auto codec = MustParse(name, 64);
    const std::vector<float> zeros(3 * 64, 0.0f);
    codec->Calibrate(zeros.data(), 3);
    for (float v : RoundTrip(*codec, zeros, 3)) ASSERT_EQ(v, 0.0f) << name;
  }
}

TEST(CodecRoundTripTest, F32ExactF16AndBf16WithinHalfAnUlp) {
  std::mt19937 rng(5);
  for (RowKind kind : kAllKinds) {
    const std::vector<float> x = MakeRows(kind, 9, 128, rng);
    const std::vector<float> f32 = RoundTrip(*MustParse("f32", 128), x, 9);
    const std::vector<float> f16 = RoundTrip(*MustParse("f16", 128), x, 9);
    const std::vector<float> bf16 = RoundTrip(*MustParse("bf16", 128), x, 9);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(SameBits(f32[i], x[i]));
      const double a = std::fabs(x[i]);
      // f16: 10 stored mantissa bits, round to nearest: relative 2^-11 for
      // normals (>= 2^-14), absolute half the subnormal unit 2^-24 below;
      // from 65520 up (round-to-nearest overflow) the value is inf.
      if (a >= 65520.0) {
        ASSERT_TRUE(std::isinf(f16[i]) && std::signbit(f16[i]) == std::signbit(x[i])) << x[i];
      } else {
        ASSERT_LE(std::fabs(f16[i] - x[i]),
                  a >= std::ldexp(1.0, -14) ? std::ldexp(a, -11) : std::ldexp(1.0, -25))
            << x[i];
      }
      // bf16: 7 stored mantissa bits: relative 2^-8 (every test value is an f32 normal).
      ASSERT_LE(std::fabs(bf16[i] - x[i]), std::ldexp(a, -8)) << x[i];
    }
  }
}

TEST(CodecRoundTripTest, Fp8RelativeErrorAndSaturationBeyondCalibratedRange) {
  std::mt19937 rng(6);
  for (const codec::Fp8Format& f : {codec::kE4M3, codec::kE5M2}) {
    for (RowKind kind : kAllKinds) {
      const int64_t n = 20, dim = 64, calib_rows = 5;
      std::vector<float> x = MakeRows(kind, n, dim, rng);
      // Rows after the calibration rows grow up to 4x, beyond the range.
      for (int64_t i = calib_rows * dim; i < n * dim; ++i) x[i] *= 1.0f + 3.0f * (i % 7) / 6.0f;
      auto codec = MustParse(f.name, dim);
      codec->Calibrate(x.data(), calib_rows);
      // The documented scale: absmax of the calibration rows / max_finite (1 if 0).
      float absmax = 0.0f;
      for (int64_t i = 0; i < calib_rows * dim; ++i) absmax = std::fmax(absmax, std::fabs(x[i]));
      const float scale = absmax > 0 ? absmax / f.max_finite : 1.0f;
      const std::vector<float> back = RoundTrip(*codec, x, n);
      const int m = f.mantissa_bits;
      const double top = static_cast<double>(f.max_finite) * scale;
      for (size_t i = 0; i < x.size(); ++i) {
        const double a = std::fabs(x[i]);
        ASSERT_TRUE(std::isfinite(back[i])) << f.name << " " << x[i];
        if (a > top * (1.0 + 4 * kEps)) {  // beyond the range: saturates to +-max * scale
          ASSERT_EQ(back[i], std::copysign(f.max_finite * scale, x[i])) << f.name << " " << x[i];
          continue;
        }
        // Normal range: rounding to m mantissa bits is relative 2^-(m+1);
        // x / scale and code * scale add one f32 rounding each (2 eps, plus
        // eps for the slightly larger intermediate). Below the smallest
        // normal 2^(1-bias), the absolute half-unit 2^(1-bias-m-1) * scale.
        const double bound = a * (std::ldexp(1.0, -(m + 1)) + 4 * kEps) +
                             std::ldexp(1.0, -f.bias - m) * scale * (1 + 4 * kEps) + kTinyAbs;
        ASSERT_LE(std::fabs(back[i] - x[i]), bound)
            << f.name << " kind " << static_cast<int>(kind) << " x " << x[i];
      }
    }
  }
}

// Reads group g's stored scale and min per the row layout in codec.h.
struct StoredGroup {
  float scale, offset;
};
StoredGroup ReadGroup(const codec::IntFormat& f, int64_t dim, const uint8_t* row, int64_t g) {
  const size_t codes = static_cast<size_t>(dim * f.bits / 8);
  uint16_t scale_bits, min_bits = 0;
  std::memcpy(&scale_bits, row + codes + 2 * g, 2);
  if (!f.symmetric) std::memcpy(&min_bits, row + codes + 2 * (dim / f.group + g), 2);
  const float scale = F16ToF32(scale_bits);
  return {scale, f.symmetric ? -std::ldexp(scale, f.bits - 1) : F16ToF32(min_bits)};
}

TEST(CodecRoundTripTest, IntGroupsPickTheNearestOf2ToTheBLevels) {
  std::mt19937 rng(8);
  for (int64_t dim : {64, 128}) {
    for (const std::string& name : AllKvCodecNames(dim)) {
      if (name.rfind("int", 0) != 0) continue;
      codec::IntFormat f;
      f.bits = name[3] - '0';
      f.group = std::stoll(name.substr(name.find("-g") + 2));
      f.symmetric = name.find("-sym") != std::string::npos;
      const int64_t levels = int64_t{1} << f.bits, half = levels / 2;
      for (RowKind kind : kAllKinds) {
        const int64_t n = 6;
        const std::vector<float> x = MakeRows(kind, n, dim, rng);
        std::vector<uint8_t> rows;
        const std::vector<float> back = RoundTrip(*MustParse(name, dim), x, n, &rows);
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t g = 0; g < dim / f.group; ++g) {
            const StoredGroup sg = ReadGroup(f, dim, rows.data() + t * f.RowBytes(dim), g);
            const float* xg = x.data() + t * dim + g * f.group;
            const float* bg = back.data() + t * dim + g * f.group;
            double lo = xg[0], hi = xg[0];
            for (int64_t i = 0; i < f.group; ++i) {
              lo = std::fmin(lo, xg[i]);
              hi = std::fmax(hi, xg[i]);
            }
            const bool in_f16_range =
                std::fmax(-lo, hi) <= (f.symmetric ? 65504.0 * half : 65504.0);
            // Exact step (before f16 rounding) and the extreme the grid is anchored on.
            const double extreme = hi >= -lo ? hi : lo;
            const double exact_step = f.symmetric ? extreme / -half : (hi - lo) / (levels - 1);
            // Computing (x - offset) * (1/s) rounds ~3 times in f32: the code
            // can only differ from the nearest where x is within that of a
            // tie, costing at most 4 eps * levels * |s|.
            const double slack = 4 * kEps * levels * std::fabs(sg.scale) + 4 * kTinyAbs;
            for (int64_t i = 0; i < f.group; ++i) {
              ASSERT_TRUE(std::isfinite(bg[i])) << name;
              double nearest = INFINITY;
              bool on_grid = false;
              for (int64_t u = 0; u < levels; ++u) {
                const float level = static_cast<float>(u) * sg.scale + sg.offset;
                nearest = std::fmin(nearest, std::fabs(static_cast<double>(level) - xg[i]));
                on_grid = on_grid || level == bg[i];
              }
              const double err = std::fabs(static_cast<double>(bg[i]) - xg[i]);
              ASSERT_TRUE(on_grid) << name << " decoded " << bg[i] << " is not a level";
              ASSERT_LE(err, nearest + slack)
                  << name << " x " << xg[i] << " kind " << static_cast<int>(kind);
              if (!in_f16_range) continue;  // documented clipping
              // Format bound from the stored parameters. asym: half a step,
              // plus the min's f16 rounding, plus the range lost to the
              // step's f16 rounding over levels - 1 steps. sym: the side
              // opposite the extreme has one level fewer (up to a full step).
              double bound;
              if (f.symmetric) {
                const bool opposite = (xg[i] > 0) != (extreme > 0) && xg[i] != 0;
                bound = std::fabs(sg.scale) * (opposite ? 1.0 : 0.5) +
                        half * std::fabs(exact_step - sg.scale);
              } else {
                bound = std::fabs(sg.scale) / 2 + std::fabs(lo - sg.offset) +
                        (levels - 1) * std::fabs(exact_step - sg.scale);
              }
              ASSERT_LE(err, bound + slack) << name << " x " << xg[i];
            }
          }
        }
      }
    }
  }
}

TEST(CodecRoundTripTest, IntConstantRowsAndOutliers) {
  std::mt19937 rng(9);
  for (const std::string& name : AllKvCodecNames(128)) {
    if (name.rfind("int", 0) != 0 || name.find("-asym") == std::string::npos) continue;
    // asym, constant group: step 0, every value is the f16-rounded constant.
    const std::vector<float> x = MakeRows(RowKind::kConstant, 4, 128, rng);
    const std::vector<float> back = RoundTrip(*MustParse(name, 128), x, 4);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(back[i], F16ToF32(F32ToF16(x[i]))) << name;
  }
  // One outlier: its own value survives (it is a grid end) and the other
  // groups decode exactly as without it (groups are independent).
  for (const char* name : {"int4-g32-sym", "int4-g32-asym", "int2-g32-asym", "int8-g32-sym"}) {
    std::vector<float> x = MakeRows(RowKind::kNormal, 1, 128, rng);
    const std::vector<float> without = RoundTrip(*MustParse(name, 128), x, 1);
    x[5] = 1000.0f;
    const std::vector<float> back = RoundTrip(*MustParse(name, 128), x, 1);
    // The outlier is level 0 (sym) or the top level (asym): only the f16
    // rounding of scale (and min) moves it, relative 2^-11 each, times
    // 2^(bits-1) or (2^bits - 1) steps: within 2^-10 * 1000 * (1 + levels/2^10).
    EXPECT_NEAR(back[5], 1000.0f, 1000.0f * std::ldexp(1.0, -10) * 1.25) << name;
    for (int64_t i = 32; i < 128; ++i) ASSERT_EQ(back[i], without[i]) << name;
  }
}

}  // namespace
}  // namespace kvq
