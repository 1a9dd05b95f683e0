// The reference fused kernels every codec's SIMD path is tested against,
// and the sample of streaming names the tile tests iterate. Names -> codecs
// is the registry's (kv/codec_registry.h).
#include "kv/codec.h"

#include <vector>

#include "kv/codec_formats.h"

namespace kvq {

namespace {
constexpr int64_t kGroupSizes[] = {32, 64, 128};
constexpr int kIntBits[] = {8, 4, 2};
}  // namespace

std::vector<std::string> AllKvStreamingCodecNames(int64_t head_dim) {
  std::vector<std::string> names;
  if (head_dim % 32 != 0) return names;
  for (int bits : kIntBits) {
    for (int64_t group : kGroupSizes) {
      for (bool symmetric : {true, false}) {
        if (static_cast<size_t>(head_dim) * (symmetric ? 2 : 4) % group != 0) continue;
        const std::string base = codec::IntFormat{bits, group, symmetric, true}.Name();
        names.push_back(base);
        names.push_back(base + "-r" + std::to_string(4 * group));
      }
    }
    names.push_back("int" + std::to_string(bits) + "-g32-asym-r128");
  }
  names.push_back("f16-s1");
  names.push_back("int4-g32-asym-s4");
  names.push_back("int4-c32-asym-prerope");
  return names;
}

namespace codec {

void ScoresByDecoding(const KvCodec& codec, const uint8_t* rows, int64_t n, const float* q,
                      int64_t group, float scale, float* scores, int64_t stride) {
  const int64_t dim = codec.head_dim();
  std::vector<float> x(static_cast<size_t>(dim));  // [head_dim], one decoded row
  for (int64_t t = 0; t < n; ++t) {
    codec.Decode(rows + t * codec.RowBytes(), 1, x.data());
    for (int64_t h = 0; h < group; ++h) {
      double dot = 0.0;
      for (int64_t i = 0; i < dim; ++i) dot += static_cast<double>(q[h * dim + i]) * x[i];
      scores[h * stride + t] = static_cast<float>(scale * dot);
    }
  }
}

void AccumulateVByDecoding(const KvCodec& codec, const uint8_t* rows, int64_t n, const float* p,
                           int64_t group, int64_t stride, float* acc) {
  const int64_t dim = codec.head_dim();
  std::vector<float> x(static_cast<size_t>(n * dim));  // [n, head_dim]
  if (n > 0) codec.Decode(rows, n, x.data());
  for (int64_t h = 0; h < group; ++h) {
    for (int64_t i = 0; i < dim; ++i) {
      double sum = acc[h * dim + i];
      for (int64_t t = 0; t < n; ++t)
        sum += static_cast<double>(p[h * stride + t]) * x[t * dim + i];
      acc[h * dim + i] = static_cast<float>(sum);
    }
  }
}

}  // namespace codec
}  // namespace kvq
