// kvq's llama.cpp cache types (kv/codec_ggml.h) against ggml itself: the
// same f32 rows go to the harness's `quantize-input` (ggml's reference
// quantizer and the CPU backend's from_float, the one llama.cpp's cache
// writer calls) and to kvq's codecs. kvq's bytes must equal the CPU
// backend's, and kvq's Decode (SIMD and reference) must equal ggml's
// to_float bit for bit, for all six types on random rows of many scales and
// on edge rows (zero, constant, single outlier, ties, huge, tiny, subnormal,
// blocks of mixed sign).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kv/codec.h"
#include "ops/matvec_int8.h"

namespace kvq {
namespace {

constexpr int64_t kCols = 128;  // 4 blocks: one head of a head_dim-128 model

struct Type {
  const char* name;
  int ggml_id;
  size_t block_bytes;
};
constexpr Type kTypes[] = {{"q8_0", 8, 34}, {"q4_0", 2, 18}, {"q4_1", 3, 20},
                           {"q5_0", 6, 22}, {"q5_1", 7, 24}, {"iq4_nl", 20, 18}};

// Rows [n, kCols]: random rows over 2^-30 .. 2^20 and the edge rows.
std::vector<float> InputRows(bool non_finite) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 20);
  std::vector<float> x;
  auto row = [&](auto value) {
    for (int64_t i = 0; i < kCols; ++i) x.push_back(value(i));
  };
  for (int r = 0; r < 400; ++r) {
    const float scale = std::ldexp(1.0f, exponent(rng));
    row([&](int64_t i) {
      return scale * normal(rng) + (i % 32 == 5 && r % 4 == 0 ? 30 * scale : 0);
    });
  }
  row([](int64_t) { return 0.0f; });
  row([](int64_t) { return -0.0f; });
  row([](int64_t i) { return i < 64 ? 0.0f : 1.5f; });  // zero blocks before non-zero ones
  row([](int64_t) { return 3.25f; });
  row([](int64_t) { return -7.0f; });
  row([](int64_t i) { return i % 32 == 17 ? 1000.0f : 0.0f; });
  row([](int64_t i) { return i % 32 == 3 ? -1000.0f : 0.001f; });
  // Integer multiples of amax / 254: x * 127 / amax lands on k + 0.5 ties.
  row([](int64_t i) { return i % 32 == 0 ? 254.0f : static_cast<float>((i % 32) * 2 - 31); });
  // Halfway values for q4_0 / q5_0 (x / d = k + 0.5 with d = -max / 8 or 16).
  row([](int64_t i) { return i % 32 == 0 ? -8.0f : static_cast<float>(i % 16) - 7.5f; });
  row([](int64_t i) { return i % 32 == 0 ? -16.0f : static_cast<float>(i % 32) - 15.5f; });
  row([&](int64_t) { return 3e4f * normal(rng); });
  row([&](int64_t) { return 6e5f * normal(rng); });  // q4_0's d = max / 8 overflows f16
  row([&](int64_t) { return 1e30f * normal(rng); });
  row([&](int64_t) { return 1e-6f * normal(rng); });  // f16 subnormal scales
  row([&](int64_t) { return 1e-12f * normal(rng); });
  row([&](int64_t) { return 1e-20f * normal(rng); });  // below 1e-15: iq4_nl's zero blocks
  row([&](int64_t) { return 1e-39f * normal(rng); });  // f32 subnormals: 1 / d overflows
  row([&](int64_t) { return -std::fabs(normal(rng)) - 0.5f; });
  row([&](int64_t) { return std::fabs(normal(rng)) + 0.5f; });
  row([&](int64_t i) { return (i % 2 ? 1 : -1) * std::numeric_limits<float>::max() / 2; });
  if (non_finite) {
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    row([&](int64_t i) { return i % 32 == 9 ? nan : normal(rng); });
    row([&](int64_t i) { return i % 32 == 0 ? nan : normal(rng); });
    row([&](int64_t i) { return i % 32 == 31 ? inf : normal(rng); });
    row([&](int64_t i) { return i % 32 == 12 ? -inf : normal(rng); });
    row([&](int64_t) { return nan; });
  }
  return x;
}

struct GgmlRows {
  std::vector<uint8_t> ref, cpu;
  std::vector<float> decoded;
};

GgmlRows RunHarness(const Type& t, const std::vector<float>& x, const std::string& tag) {
  const std::string base = std::string(KVQ_BINARY_DIR) + "/kvtypes_" + t.name + tag;
  {
    std::ofstream in(base + ".f32", std::ios::binary);
    in.write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size() * 4));
  }
  const std::string cmd = std::string(KVQ_LLAMACPP_HARNESS) + " quantize-input " +
                          std::to_string(t.ggml_id) + " " + std::to_string(kCols) + " '" + base +
                          ".f32' '" + base + ".bin' 2>'" + base + ".log'";
  GgmlRows out;
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << cmd;
    return out;
  }
  std::ifstream in(base + ".bin", std::ios::binary);
  char magic[8];
  int64_t row_bytes = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&row_bytes), 8);
  EXPECT_TRUE(in && std::memcmp(magic, "KVQQROWS", 8) == 0) << base;
  EXPECT_EQ(row_bytes, static_cast<int64_t>(kCols / 32 * t.block_bytes)) << t.name;
  const size_t rows = x.size() / kCols;
  out.ref.resize(rows * static_cast<size_t>(row_bytes));
  out.cpu.resize(out.ref.size());
  out.decoded.resize(x.size());
  in.read(reinterpret_cast<char*>(out.ref.data()), static_cast<std::streamsize>(out.ref.size()));
  in.read(reinterpret_cast<char*>(out.cpu.data()), static_cast<std::streamsize>(out.cpu.size()));
  in.read(reinterpret_cast<char*>(out.decoded.data()),
          static_cast<std::streamsize>(out.decoded.size() * 4));
  EXPECT_TRUE(in) << "short harness output " << base;
  std::filesystem::remove(base + ".f32");
  std::filesystem::remove(base + ".bin");
  return out;
}

bool IsZeroScaleIq4(const Type& t, const uint8_t* block) {
  return std::string(t.name) == "iq4_nl" && block[0] == 0 && block[1] == 0;
}

// kvq's bytes == ggml's CPU bytes, block by block; kvq's Decode on both paths
// == ggml's to_float. iq4_nl blocks with d = 0 (absmax < 1e-15) have
// undefined indices in ggml (codec_ggml.h): only their d is compared, and
// their values (all zero) by value.
void ExpectSameAsGgml(const Type& t, const std::vector<float>& x, const GgmlRows& g) {
  const int64_t n = static_cast<int64_t>(x.size()) / kCols;
  for (CodecPath path : {CodecPath::kSimd, CodecPath::kReference}) {
    auto codec = ParseKvCodec(t.name, kCols, path);
    ASSERT_TRUE(codec.ok()) << codec.status().message();
    std::vector<uint8_t> rows(static_cast<size_t>(n) * (*codec)->RowBytes());
    ASSERT_EQ(rows.size(), g.cpu.size());
    (*codec)->Encode(x.data(), n, rows.data());
    int64_t mismatched = 0;
    for (size_t b = 0; b < rows.size(); b += t.block_bytes) {
      const size_t compare = IsZeroScaleIq4(t, &g.cpu[b]) ? 2 : t.block_bytes;
      if (std::memcmp(&rows[b], &g.cpu[b], compare) != 0 && mismatched++ < 5) {
        ADD_FAILURE() << t.name << " block " << b / t.block_bytes << " (row "
                      << b / (*codec)->RowBytes() << ") differs from ggml's bytes";
      }
    }
    EXPECT_EQ(mismatched, 0) << t.name << ": blocks differing from ggml's";
    std::vector<float> decoded(x.size());
    (*codec)->Decode(rows.data(), n, decoded.data());
    int64_t wrong = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t block = i / 32 * t.block_bytes;
      const bool same = IsZeroScaleIq4(t, &g.cpu[block])
                            ? decoded[i] == g.decoded[i]
                            : (std::memcmp(&decoded[i], &g.decoded[i], 4) == 0 ||
                               (std::isnan(decoded[i]) && std::isnan(g.decoded[i])));
      if (!same && wrong++ < 5) {
        ADD_FAILURE() << t.name << " value " << i << ": kvq " << decoded[i] << ", ggml "
                      << g.decoded[i];
      }
    }
    EXPECT_EQ(wrong, 0) << t.name << (path == CodecPath::kSimd ? " SIMD" : " reference")
                        << " Decode values differing from ggml's to_float";
  }
}

TEST(LlamaCppKvTypes, EncodeEqualsTheCacheWriterAndDecodeEqualsToFloat) {
  const std::vector<float> x = InputRows(/*non_finite=*/false);
  for (const Type& t : kTypes) {
    SCOPED_TRACE(t.name);
    const GgmlRows g = RunHarness(t, x, "");
    ASSERT_FALSE(g.cpu.empty());
    ExpectSameAsGgml(t, x, g);
    // Which quantizer the cache writer is: the reference one for every type
    // but q8_0, whose x86 writer rounds differently (codec_ggml.h).
    int64_t differing = 0;
    for (size_t b = 0; b < g.cpu.size(); b += t.block_bytes) {
      if (!IsZeroScaleIq4(t, &g.cpu[b])) {
        differing += std::memcmp(&g.ref[b], &g.cpu[b], t.block_bytes) != 0;
      }
    }
    if (std::string(t.name) != "q8_0") {
      EXPECT_EQ(differing, 0) << "ggml's ref vs CPU writer";
    }
    std::printf("%s: %lld of %zu blocks differ between ggml's reference and CPU quantizers\n",
                t.name, static_cast<long long>(differing), g.cpu.size() / t.block_bytes);
  }
}

// The integer-dot matvec's activation quantizer (ops::QuantizeRowQ8_0, and
// QuantizeRowQ8_1, whose d and qs are computed the same way) against ggml's
// reference quantize_row_q8_0_ref, byte for byte, on the same rows. (ggml's
// q8_1 and q8_K have no to_float, so the harness cannot run them; their
// quantizers are checked on hand-worked blocks in tests/ops.)
TEST(LlamaCppKvTypes, OpsActivationQuantizersEqualGgmlReference) {
  const std::vector<float> x = InputRows(/*non_finite=*/false);
  const GgmlRows g = RunHarness(kTypes[0], x, "_ops");
  ASSERT_FALSE(g.ref.empty());
  const size_t blocks = x.size() / 32;
  std::vector<ops::BlockQ8_0> q0(blocks);
  std::vector<ops::BlockQ8_1> q1(blocks);
  ops::QuantizeRowQ8_0(x.data(), static_cast<int64_t>(x.size()), q0.data());
  ops::QuantizeRowQ8_1(x.data(), static_cast<int64_t>(x.size()), q1.data());
  ASSERT_EQ(g.ref.size(), blocks * sizeof(ops::BlockQ8_0));
  int64_t differing = 0, q1_differing = 0, cpu_differing = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* ref = &g.ref[b * sizeof(ops::BlockQ8_0)];
    if (std::memcmp(&q0[b], ref, sizeof(ops::BlockQ8_0)) != 0 && differing++ < 5) {
      ADD_FAILURE() << "q8_0 block " << b << " differs from quantize_row_q8_0_ref";
    }
    q1_differing += std::memcmp(&q1[b].d, ref, 2) != 0 || std::memcmp(q1[b].qs, ref + 2, 32) != 0;
    cpu_differing += std::memcmp(&q0[b], &g.cpu[b * sizeof(ops::BlockQ8_0)], 34) != 0;
  }
  EXPECT_EQ(differing, 0);
  EXPECT_EQ(q1_differing, 0) << "q8_1's d and qs must be quantize_row_q8_1_ref's (as q8_0's)";
  // llama.cpp's matmuls quantize x with the CPU backend's quantize_row_q8_0,
  // which rounds ties to even (codec_ggml.h): reported, not asserted.
  std::printf("ops q8_0: %lld of %zu blocks differ from ggml's CPU quantizer\n",
              static_cast<long long>(cpu_differing), blocks);
}

// NaN and inf are undefined behaviour in ggml's C (float to int casts out of
// range); codec_ggml.h documents kvq's emulation of x86-64's conversions.
// This checks that emulation against the harness as built here.
TEST(LlamaCppKvTypes, NonFiniteRowsMatchGgmlOnX86) {
  const std::vector<float> all = InputRows(/*non_finite=*/true);
  const std::vector<float> x(all.end() - 5 * kCols, all.end());
  for (const Type& t : kTypes) {
    SCOPED_TRACE(t.name);
    const GgmlRows g = RunHarness(t, x, "_nonfinite");
    ASSERT_FALSE(g.cpu.empty());
    ExpectSameAsGgml(t, x, g);
  }
}

}  // namespace
}  // namespace kvq
