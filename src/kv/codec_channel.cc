// Per-channel integer codecs ("int2-c32", KIVI's keys): each channel of a
// tile of G consecutive tokens gets its own scale (and min), so a channel
// that is large in every token (the fixed outlier channels of K) does not
// stretch the grid of the others.
//
// Tile layout (G = format.group tokens, d = head_dim, B bits):
//   [d f16 scales][d f16 mins (asym only)][G rows of codes, d * B / 8 bytes]
// Codes are packed inside each row exactly as the per-token int formats pack
// them (codec.h), so the same unpacking applies. RowBytes() is the tile's
// bytes / G (ParseKvCodec checks it is whole). Scales, mins and the mapping
// x^ = u * s + offset are IntGroupParams' over the G values of one channel.
//
// Scores use integer dot products like the per-token int codecs
// (codec_int_scores.h). Within a tile x^[t][c] = u[t][c] s[c] + o[c], so
//   q . x^[t] = sum_c (q[c] s[c]) u[t][c] + sum_c q[c] o[c]:
// the channel-scaled query q' = f32(q * s) is quantized per 32 channels as
// the int codecs quantize q (q8, qscale: QuantizeQueryRef), the dots I_g of
// q8 with the codes are exact integers, and the constant b = sum_c q[c] o[c]
// is an f32 dot, so
//   score = scale * (b + sum_g qscale_g * I_g).
// Its distance from the f32-query dot is at most
//   |scale| sum_c (qscale_g / 2 + 4 eps |q[c] s[c]|) u[t][c] plus the
// epilogue's f32 rounding (derived in tests/kv/codec_test.cc).
// AVX3_DL (vpdpbusd) as in codec_int.cc, before any Highway include.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/fp16.h"
#include "kv/codec_formats.h"
#include "kv/codec_int_scores.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/codec_channel.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h (per-target code).
#include "kv/codec_int_scores-inl.h"
#include "kv/codec_kernels-inl.h"

namespace kvq::codec {
#ifndef KVQ_CODEC_CHANNEL_ONCE
#define KVQ_CODEC_CHANNEL_ONCE

// One tile's channel parameters in f32: x^[c] = u * scale[c] + offset[c].
// Fixed arrays (8 KiB on the stack) so attention allocates nothing.
struct ChannelParams {
  alignas(64) float scale[kMaxCodecHeadDim];   // [head_dim] used
  alignas(64) float offset[kMaxCodecHeadDim];  // [head_dim] used
};

inline size_t ChannelParamBytes(const IntFormat& f, int64_t dim) {
  return static_cast<size_t>(dim) * (f.symmetric ? 2 : 4);
}

inline void ReadChannelParams(const IntFormat& f, int64_t dim, const uint8_t* tile, float* scale,
                              float* offset) {
  for (int64_t c = 0; c < dim; ++c) {
    uint16_t scale_bits, min_bits = 0;
    std::memcpy(&scale_bits, tile + 2 * c, 2);
    if (!f.symmetric) std::memcpy(&min_bits, tile + 2 * (dim + c), 2);
    scale[c] = F16ToF32(scale_bits);
    offset[c] = f.symmetric ? -static_cast<float>(f.Levels() / 2) * scale[c] : F16ToF32(min_bits);
  }
}

inline void ReadChannelParams(const IntFormat& f, int64_t dim, const uint8_t* tile,
                              ChannelParams* p) {
  ReadChannelParams(f, dim, tile, p->scale, p->offset);
}

// Channels per q quantization group of the integer Scores.
inline constexpr int64_t kChannelQueryGroup = 32;

// The scalar twin of the integer Scores above (in double after the exact
// integer dots and the f32 q' and q8).
inline void ChannelIntScoresRef(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n,
                                const float* q, int64_t heads, float scale, float* scores,
                                int64_t stride) {
  const IntFormat dots{f.bits, kChannelQueryGroup, f.symmetric};  // groups of channels
  const int64_t tile_tokens = f.group, groups = dim / kChannelQueryGroup;
  const size_t param_bytes = ChannelParamBytes(f, dim);
  const size_t code_bytes = f.CodeBytes(dim);
  std::vector<float> s(static_cast<size_t>(dim)), o(s.size()), q_scaled(s.size());  // [dim]
  std::vector<int8_t> q8(s.size());                                                 // [dim]
  std::vector<float> qscale(static_cast<size_t>(groups));                           // [groups]
  std::vector<int32_t> qsum(qscale.size());                                         // [groups]
  for (int64_t t0 = 0; t0 < n; t0 += tile_tokens) {
    const uint8_t* tile = rows + static_cast<size_t>(t0) * f.RowBytes(dim);
    ReadChannelParams(f, dim, tile, s.data(), o.data());
    for (int64_t h = 0; h < heads; ++h) {
      const float* qh = q + h * dim;
      double bias = 0.0;
      for (int64_t c = 0; c < dim; ++c) {
        q_scaled[c] = qh[c] * s[c];
        bias += static_cast<double>(qh[c]) * o[c];
      }
      QuantizeQueryRef(q_scaled.data(), dim, kChannelQueryGroup, q8.data(), qscale.data(),
                       qsum.data());
      for (int64_t t = t0; t < std::min(n, t0 + tile_tokens); ++t) {
        const uint8_t* codes = tile + param_bytes + static_cast<size_t>(t - t0) * code_bytes;
        double score = bias;
        for (int64_t g = 0; g < groups; ++g) {
          score += static_cast<double>(qscale[g]) * IntGroupDotRef(dots, codes, q8.data(), g);
        }
        scores[h * stride + t] = static_cast<float>(scale * score);
      }
    }
  }
}
#endif  // KVQ_CODEC_CHANNEL_ONCE
}  // namespace kvq::codec

HWY_BEFORE_NAMESPACE();
namespace kvq::codec {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A row format for the shared kernels (codec_kernels-inl.h): one row is the
// codes of one token; the per-channel scale and offset come from the tile's
// parameters (set before each tile) instead of the row.
template <int kBits>
struct ChannelFmt {
  using D = hn::CappedTag<float, kBits == 2 ? 8 : 16>;
  int64_t head_dim;
  size_t row_bytes;  // code bytes of one token
  const float* scale;
  const float* offset;

  static constexpr bool kHasParams = false;
  int64_t ParamGroup() const { return head_dim; }
  HWY_INLINE ScaleOffset Params(const uint8_t*, int64_t) const { return {0.0f, 0.0f}; }

  HWY_INLINE hn::Vec<D> Load(D d, const uint8_t* row, int64_t i, hn::Vec<D>, hn::Vec<D>) const {
    const auto u = LoadIntCodes<kBits>(d, row, i);
    return hn::MulAdd(hn::ConvertTo(d, u), hn::LoadU(d, scale + i), hn::LoadU(d, offset + i));
  }
};

// Runs fn(fmt, codes, count, t0) for each tile of the first n tokens.
template <int kBits, class F>
HWY_INLINE void ForEachTile(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n,
                            const F& fn) {
  const int64_t tile_tokens = f.group;
  const size_t param_bytes = ChannelParamBytes(f, dim);
  const size_t tile_bytes = static_cast<size_t>(tile_tokens) * f.RowBytes(dim);
  ChannelParams params;
  for (int64_t t0 = 0; t0 < n; t0 += tile_tokens) {
    const uint8_t* tile = rows + static_cast<size_t>(t0 / tile_tokens) * tile_bytes;
    ReadChannelParams(f, dim, tile, &params);
    ChannelFmt<kBits> fmt{dim, f.CodeBytes(dim), params.scale, params.offset};
    fn(fmt, tile + param_bytes, std::min(tile_tokens, n - t0), t0);
  }
}

// This family's one dispatcher: false (running nothing) for a width it has
// no instantiation for; MakeChannelCodec refuses those formats first.
template <class F>
HWY_INLINE bool WithBits(int bits, const F& fn) {
  switch (bits) {
    case 8:
      return fn(std::integral_constant<int, 8>()), true;
    case 4:
      return fn(std::integral_constant<int, 4>()), true;
    case 2:
      return fn(std::integral_constant<int, 2>()), true;
    default:
      return false;
  }
}

bool ChannelKernelExistsImpl(int bits) {
  return WithBits(bits, [](auto) {});
}

void ChannelDecodeImpl(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n, float* x) {
  WithBits(f.bits, [&](auto bits) {
    ForEachTile<decltype(bits)::value>(
        f, dim, rows, n, [&](const auto& fmt, const uint8_t* codes, int64_t count, int64_t t0) {
          DecodeRows(fmt, codes, count, x + t0 * dim);
        });
  });
}

// The integer Scores (file comment): per tile and pass of <= 8 heads, fold
// the channel scales into q, quantize, and run the int codecs' dot pass over
// the tile's bare code rows.
template <int kBits>
void ChannelIntScores(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n,
                      const float* q, int64_t heads, float scale, float* scores, int64_t stride) {
  const int64_t tile_tokens = f.group;
  const size_t param_bytes = ChannelParamBytes(f, dim);
  const int64_t code_bytes = static_cast<int64_t>(f.CodeBytes(dim));
  const IntRowLayout layout{dim, code_bytes, code_bytes, kChannelQueryGroup,
                            dim / kChannelQueryGroup};
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const auto sym_offset = hn::Set(df, -static_cast<float>(f.Levels() / 2));
  alignas(64) float s[kMaxCodecHeadDim], o[kMaxCodecHeadDim];
  alignas(64) float q_scaled[kMaxHeadsPerPass * kMaxCodecHeadDim];  // [heads, dim]
  float bias[kMaxHeadsPerPass];
  alignas(64) uint8_t prepared[kPreparedPassBytes];
  for (int64_t t0 = 0; t0 < n; t0 += tile_tokens) {
    const uint8_t* tile = rows + static_cast<size_t>(t0) * f.RowBytes(dim);
    const int64_t count = std::min(tile_tokens, n - t0);
    // ReadChannelParams, vectorized: f16 -> f32 is exact either way.
    const auto* halves = reinterpret_cast<const hwy::float16_t*>(tile);
    for (int64_t c = 0; c < dim; c += lanes) {
      const auto vs = hn::PromoteTo(df, hn::LoadU(dh, halves + c));
      hn::Store(vs, df, s + c);
      hn::Store(f.symmetric ? hn::Mul(sym_offset, vs)
                            : hn::PromoteTo(df, hn::LoadU(dh, halves + dim + c)),
                df, o + c);
    }
    for (int64_t h0 = 0; h0 < heads; h0 += kMaxHeadsPerPass) {
      const int64_t pass_heads = std::min(kMaxHeadsPerPass, heads - h0);
      for (int64_t h = 0; h < pass_heads; ++h) {
        const float* qh = q + (h0 + h) * dim;
        auto vbias = hn::Zero(df);
        for (int64_t c = 0; c < dim; c += lanes) {
          const auto vq = hn::LoadU(df, qh + c);
          hn::Store(hn::Mul(vq, hn::Load(df, s + c)), df, q_scaled + h * dim + c);
          vbias = hn::MulAdd(vq, hn::Load(df, o + c), vbias);
        }
        bias[h] = hn::GetLane(hn::SumOfLanes(df, vbias));
      }
      PrepareQueryHeads<kBits>(layout, q_scaled, pass_heads, prepared);
      IntDotScoresPrepared<kBits, false, /*kRowParams=*/false>(
          layout, tile + param_bytes, count, prepared, pass_heads, scale, scores + h0 * stride + t0,
          stride, bias);
    }
  }
}

void ChannelScoresImpl(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n,
                       const float* q, int64_t group, float scale, float* scores, int64_t stride) {
  WithBits(f.bits, [&](auto bits) {
    ChannelIntScores<decltype(bits)::value>(f, dim, rows, n, q, group, scale, scores, stride);
  });
}

void ChannelAccumulateImpl(const IntFormat& f, int64_t dim, const uint8_t* rows, int64_t n,
                           const float* p, int64_t group, int64_t stride, float* acc) {
  WithBits(f.bits, [&](auto bits) {
    ForEachTile<decltype(bits)::value>(
        f, dim, rows, n, [&](const auto& fmt, const uint8_t* codes, int64_t count, int64_t t0) {
          AccumulateV(fmt, codes, count, p + t0, group, stride, acc);
        });
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::codec
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::codec {

HWY_EXPORT(ChannelDecodeImpl);
HWY_EXPORT(ChannelScoresImpl);
HWY_EXPORT(ChannelAccumulateImpl);
HWY_EXPORT(ChannelKernelExistsImpl);

namespace {

class ChannelCodec final : public KvCodec {
 public:
  ChannelCodec(const IntFormat& format, int64_t head_dim, CodecPath path)
      : KvCodec(head_dim),
        format_(format),
        // The SIMD loads step 8 (int2) or 16 values inside 32-value packing blocks.
        path_(head_dim % 32 == 0 ? path : CodecPath::kReference) {
    streaming_.tile_tokens = format.group;
    streaming_.flush_tokens = format.group;
  }

  std::string FormatName() const override { return format_.Name(); }
  size_t RowBytes() const override { return format_.RowBytes(head_dim_); }

  // Encoding runs once per tile (not per decode step); one scalar version.
  void Encode(const float* x, int64_t n, uint8_t* rows) const override {
    const int64_t tile_tokens = format_.group, dim = head_dim_;
    const size_t param_bytes = ChannelParamBytes(format_, dim);
    const size_t code_bytes = format_.CodeBytes(dim);
    for (int64_t t0 = 0; t0 + tile_tokens <= n; t0 += tile_tokens) {
      uint8_t* tile = rows + static_cast<size_t>(t0) * RowBytes();
      std::memset(tile + param_bytes, 0, static_cast<size_t>(tile_tokens) * code_bytes);
      for (int64_t c = 0; c < dim; ++c) {
        float min = x[t0 * dim + c], max = min;
        for (int64_t t = t0 + 1; t < t0 + tile_tokens; ++t) {
          min = std::fmin(min, x[t * dim + c]);
          max = std::fmax(max, x[t * dim + c]);
        }
        const GroupParams p = IntGroupParams(format_, min, max);
        std::memcpy(tile + 2 * c, &p.scale_bits, 2);
        if (!format_.symmetric) std::memcpy(tile + 2 * (dim + c), &p.min_bits, 2);
        for (int64_t t = 0; t < tile_tokens; ++t) {
          IntPackRef(format_, c, IntQuantizeRef(format_, p, x[(t0 + t) * dim + c]),
                     tile + param_bytes + static_cast<size_t>(t) * code_bytes);
        }
      }
    }
  }

  void Decode(const uint8_t* rows, int64_t n, float* x) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(ChannelDecodeImpl)(format_, head_dim_, rows, n, x);
    }
    const int64_t tile_tokens = format_.group, dim = head_dim_;
    const size_t param_bytes = ChannelParamBytes(format_, dim);
    const size_t code_bytes = format_.CodeBytes(dim);
    ChannelParams params;
    for (int64_t t0 = 0; t0 < n; t0 += tile_tokens) {
      const uint8_t* tile = rows + static_cast<size_t>(t0) * RowBytes();
      ReadChannelParams(format_, dim, tile, &params);
      for (int64_t t = t0; t < std::min(n, t0 + tile_tokens); ++t) {
        const uint8_t* codes = tile + param_bytes + static_cast<size_t>(t - t0) * code_bytes;
        for (int64_t c = 0; c < dim; ++c) {
          x[t * dim + c] = static_cast<float>(IntUnpackRef(format_, c, codes)) * params.scale[c] +
                           params.offset[c];
        }
      }
    }
  }

  void Scores(const uint8_t* rows, int64_t n, const float* q, int64_t group, float scale,
              float* scores, int64_t stride) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(ChannelScoresImpl)(format_, head_dim_, rows, n, q, group, scale,
                                                     scores, stride);
    }
    ChannelIntScoresRef(format_, head_dim_, rows, n, q, group, scale, scores, stride);
  }

  void AccumulateV(const uint8_t* rows, int64_t n, const float* p, int64_t group, int64_t stride,
                   float* acc) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(ChannelAccumulateImpl)(format_, head_dim_, rows, n, p, group,
                                                         stride, acc);
    }
    std::vector<float> x(static_cast<size_t>(n * head_dim_));  // [n, head_dim]
    Decode(rows, n, x.data());
    auto f32 = MakeFloatCodec(FloatKind::kF32, head_dim_, CodecPath::kReference);
    AccumulateVByDecoding(*f32, reinterpret_cast<const uint8_t*>(x.data()), n, p, group, stride,
                          acc);
  }

 private:
  IntFormat format_;
  CodecPath path_;
};

}  // namespace

StatusOr<std::unique_ptr<KvCodec>> MakeChannelCodec(const IntFormat& format, int64_t head_dim,
                                                    CodecPath path) {
  if (!HWY_DYNAMIC_DISPATCH(ChannelKernelExistsImpl)(format.bits)) {
    return Status::Error("KV cache type '" + format.Name() + "': no " +
                         std::to_string(format.bits) +
                         "-bit per-channel kernel in this build (int8, int4, int2)");
  }
  return std::unique_ptr<KvCodec>(std::make_unique<ChannelCodec>(format, head_dim, path));
}

}  // namespace kvq::codec
#endif  // HWY_ONCE
