// More query rows than one kernel pass holds (a prefill tile: 30 rows on
// Qwen2.5-1.5B) must give the same bits as the same heads scored a pass at a
// time. Formats that declare kDecodeOnce (codec_kernels-inl.h) take another
// road for wide groups: each block of rows decoded once into L1, then read
// by every pass. These tests hold them to the narrow road's exact results on
// every compiled Highway target, with rows spanning several decoded blocks.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL  // codec_int.cc's target too (see codec_test.cc)
#endif
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
#include "kv/codec.h"
#include "kv/codec_registry.h"
#include "kv/kv_test_util.h"

namespace kvq {
namespace {

// The widest group one pass takes (codec_kernels-inl.h's kMaxHeadsPerPass).
constexpr int64_t kNarrowGroup = 8;

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Scores and AccumulateV of `group` heads in one call, and of the same heads
// in calls of at most kNarrowGroup, on n encoded rows.
void ExpectWideEqualsNarrow(const KvCodec& codec, const std::vector<uint8_t>& rows, int64_t n,
                            int64_t group, std::mt19937& rng, const std::string& what) {
  const int64_t dim = codec.head_dim();
  const int64_t stride = n + 5;  // not n: the offsets into scores and p must honour it
  const std::vector<float> q = Normal(static_cast<size_t>(group * dim), rng);  // [group, dim]
  std::vector<float> wide(static_cast<size_t>(group * stride), -7.0f);         // [group, stride]
  std::vector<float> narrow = wide;
  codec.Scores(rows.data(), n, q.data(), group, 0.125f, wide.data(), stride);
  for (int64_t h0 = 0; h0 < group; h0 += kNarrowGroup) {
    codec.Scores(rows.data(), n, q.data() + h0 * dim, std::min(kNarrowGroup, group - h0), 0.125f,
                 narrow.data() + h0 * stride, stride);
  }
  EXPECT_TRUE(SameBits(wide, narrow)) << what << ": Scores";

  std::vector<float> p(static_cast<size_t>(group * stride));  // [group, stride]
  std::uniform_real_distribution<float> unit(0.0f, 1.0f / static_cast<float>(n));
  for (float& v : p) v = unit(rng);
  const std::vector<float> acc0 = Normal(static_cast<size_t>(group * dim), rng);  // [group, dim]
  std::vector<float> acc_wide = acc0, acc_narrow = acc0;
  codec.AccumulateV(rows.data(), n, p.data(), group, stride, acc_wide.data());
  for (int64_t h0 = 0; h0 < group; h0 += kNarrowGroup) {
    codec.AccumulateV(rows.data(), n, p.data() + h0 * stride, std::min(kNarrowGroup, group - h0),
                      stride, acc_narrow.data() + h0 * dim);
  }
  EXPECT_TRUE(SameBits(acc_wide, acc_narrow)) << what << ": AccumulateV";
}

class CodecWideGroupTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(CodecWideGroupTest);

// Every registered codec (with the calibrated nuq* samples); 300 rows cross
// the decoded blocks (8192 floats: 64 rows at head_dim 128, 128 at 64) and
// end mid-block; groups of 9 (one head past a pass) and 30.
TEST_P(CodecWideGroupTest, WideGroupsEqualTheSameHeadsAPassAtATimeBitForBit) {
  std::mt19937 rng(2026);
  constexpr int64_t n = 300;
  for (int64_t dim : {64, 128}) {
    // Every registered name; the schemes (K/V pairs, not one codec) do not parse.
    const std::vector<std::string> names = RegisteredKvCacheTypes(dim);
    // The formats that decode once must be among them.
    for (const char* once : {"nuq3-k-o1", "nuq2-v-o1", "q4_0", "iq4_nl"}) {
      EXPECT_NE(std::find(names.begin(), names.end(), once), names.end()) << once;
    }
    // The SIMD path only: the reference path has no passes (its twin is codec_test.cc's).
    for (const std::string& name : names) {
      auto parsed = ParseKvCodec(name, dim, CodecPath::kSimd);
      if (!parsed.ok()) continue;
      const std::unique_ptr<KvCodec> codec = std::move(parsed).value();
      // Tile codecs encode whole tiles; the kernels then take any prefix.
      const int64_t tile = std::max<int64_t>(1, codec->streaming().tile_tokens);
      const int64_t encoded = (n + tile - 1) / tile * tile;
      const std::vector<float> x =
          Normal(static_cast<size_t>(encoded * dim), rng);  // [encoded, dim]
      codec->Calibrate(x.data(), encoded);
      std::vector<uint8_t> rows(static_cast<size_t>(encoded) * codec->RowBytes());
      codec->Encode(x.data(), encoded, rows.data());
      for (int64_t group : {9, 30}) {
        const std::string what =
            name + " dim " + std::to_string(dim) + " group " + std::to_string(group);
        ExpectWideEqualsNarrow(*codec, rows, n, group, rng, what);
      }
    }
  }
}

}  // namespace
}  // namespace kvq
