// NUQ codecs (KVQuant, arXiv:2401.18079): "nuqB-k-oP" and "nuqB-v-oP",
// B = 2, 3, 4 bits, P = percent of each row kept exactly (default 1).
// A row is one token of one KV head (tile_tokens 1):
//   K: [codes][P% slots: f16 values][slots: u8 channels][zero pad to 4 bytes]
//   V: [codes][f16 scale][f16 offset][f16 values][u8 channels][pad]
// Values are normalized, y = (x - offset) / scale, and y's code is the index
// of the nearest of 2^B levels (a per-layer codebook from `kvq calibrate`'s
// sensitivity-weighted k-means); x^ = level[u] * scale + offset, then the
// outlier channels are overwritten with their exact f16 values.
//   K: scale and offset per channel, from calibration (KVQuant's offline
//      per-channel scaling of pre-RoPE keys: the channel structure of keys is
//      stable across tokens, so per-channel ranges need no per-token bytes);
//      the outliers are the channels of largest |y|.
//   V: scale and offset per token (f16 in the row) over the inliers.
// Levels and K's channel scales are rounded to f16 when set, so level * scale
// is exact in f32 and the fused multiply-add of the SIMD path equals the
// scalar twin's multiply then add bit for bit on every target.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "base/fp16.h"
#include "kv/codec_formats.h"
#include "kv/codec_registry.h"
#include "kv/kv_calibration.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/codec_nuq.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h (per-target code).
#include "kv/codec_kernels-inl.h"

namespace kvq::codec {
#ifndef KVQ_CODEC_NUQ_ONCE
#define KVQ_CODEC_NUQ_ONCE
// What the kernels need besides the row bytes. levels: 16 entries (the
// codebook, padded with its last level) so one vector load covers any B.
struct NuqTables {
  const float* levels;     // [16]
  const float* ch_scale;   // K: [head_dim]
  const float* ch_offset;  // K: [head_dim]
};
#endif  // KVQ_CODEC_NUQ_ONCE
}  // namespace kvq::codec

HWY_BEFORE_NAMESPACE();
namespace kvq::codec {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

HWY_INLINE float NuqHalf(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return F16ToF32(bits);
}

// Row format for the shared kernels (codec_kernels-inl.h). 4-bit codes
// decode 16 lanes per load; 2- and 3-bit codes (8 code bytes per 32 values,
// element e in byte e % 8) 16 on AVX-512, where one vector takes the same 8
// bytes twice with per-half shifts, else 8.
template <int kBits, bool kIsV>
struct NuqFmt {
  static constexpr bool kWide = kBits == 4 || HWY_TARGET <= HWY_AVX3;
  using D = hn::CappedTag<float, kWide ? 16 : 8>;
  int64_t head_dim;
  size_t row_bytes;
  int64_t code_bytes, values_offset, channels_offset, slots;
  NuqTables tables;

  static constexpr bool kHasParams = kIsV;
  int64_t ParamGroup() const { return head_dim; }
  HWY_INLINE ScaleOffset Params(const uint8_t* row, int64_t) const {
    if constexpr (kIsV) return {NuqHalf(row + code_bytes), NuqHalf(row + code_bytes + 2)};
    return {0.0f, 0.0f};
  }

  HWY_INLINE hn::Vec<D> Load(D d, const uint8_t* row, int64_t i, hn::Vec<D> scale,
                             hn::Vec<D> offset) const {
    const hn::RebindToSigned<D> di;
    const hn::Rebind<uint8_t, D> du8;
    const int64_t within = i & 31;
    hn::Vec<decltype(di)> u;
    if constexpr (kBits == 4) {
      const auto raw = hn::PromoteTo(di, hn::LoadU(du8, row + (i >> 5) * 16 + (within & 15)));
      u = within < 16 ? hn::And(raw, hn::Set(di, 0xF)) : hn::ShiftRight<4>(raw);
    }
#if HWY_TARGET <= HWY_AVX3
    else if constexpr (kWide) {
      // Lanes 0-7: elements within + 0..7 (field within / 8 of bytes 0-7),
      // lanes 8-15: the next field of the same bytes.
      constexpr int64_t kBlockBytes = kBits == 3 ? 12 : 8;
      const uint8_t* block = row + (i >> 5) * kBlockBytes;
      const hn::Half<decltype(di)> dh;
      const auto bytes = hn::PromoteTo(dh, hn::LoadU(hn::Rebind<uint8_t, decltype(dh)>(), block));
      alignas(64) static constexpr int32_t kHalfShift[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                                             2, 2, 2, 2, 2, 2, 2, 2};
      const int field = static_cast<int>(within >> 3);
      const auto shift = hn::Add(hn::Load(di, kHalfShift), hn::Set(di, 2 * field));
      u = hn::And(hn::Shr(hn::Combine(di, bytes, bytes), shift), hn::Set(di, 3));
      if constexpr (kBits == 3) {
        // Element 8m + j is bit j of high-bit byte m.
        alignas(64) static constexpr int32_t kLaneBit[16] = {1, 2, 4, 8, 16, 32, 64, 128,
                                                             1, 2, 4, 8, 16, 32, 64, 128};
        const auto high =
            hn::Combine(di, hn::Set(dh, block[8 + field + 1]), hn::Set(dh, block[8 + field]));
        const auto set = hn::TestBit(high, hn::Load(di, kLaneBit));
        u = hn::Or(u, hn::IfThenElseZero(set, hn::Set(di, 4)));
      }
    }
#endif
    else {
      constexpr int64_t kBlockBytes = kBits == 3 ? 12 : 8;
      const uint8_t* block = row + (i >> 5) * kBlockBytes;
      const int shift = static_cast<int>(2 * (within >> 3));
      const auto raw = hn::PromoteTo(di, hn::LoadU(du8, block + (within & 7)));
      u = hn::And(hn::ShiftRightSame(raw, shift), hn::Set(di, 3));
      if constexpr (kBits == 3) {
        // Element 8m + j is bit j of high-bit byte m (narrow targets start
        // mid-byte: j = within % 8 + lane).
        // One test against a constant vector of lane bits, not a variable shift.
        alignas(64) static constexpr int32_t kLaneBit[16] = {1, 2, 4, 8, 16, 32, 64, 128,
                                                             1, 2, 4, 8, 16, 32, 64, 128};
        const auto high = hn::Set(di, block[8 + (within >> 3)]);
        const auto set = hn::TestBit(high, hn::LoadU(di, kLaneBit + (within & 7)));
        u = hn::Or(u, hn::IfThenElseZero(set, hn::Set(di, 4)));
      }
    }
    hn::Vec<D> level;
    if constexpr (!HWY_HAVE_SCALABLE && hn::MaxLanes(D()) >= (1 << kBits)) {
      level = hn::TableLookupLanes(hn::LoadU(d, tables.levels), hn::IndicesFromVec(d, u));
    } else {
      level = hn::GatherIndex(d, tables.levels, u);
    }
    if constexpr (kIsV) return hn::MulAdd(level, scale, offset);
    return hn::MulAdd(level, hn::LoadU(d, tables.ch_scale + i), hn::LoadU(d, tables.ch_offset + i));
  }

  // The outliers' exact values over rows Load decoded (codec_kernels-inl.h:
  // HasPatch). Patching a whole row after its loads replaces a test per
  // slot and vector, taken at random, with one store per slot.
  HWY_INLINE void Patch(const uint8_t* rows, int64_t n, float* x) const {
    for (int64_t t = 0; t < n; ++t) {
      const uint8_t* row = rows + t * static_cast<int64_t>(row_bytes);
      for (int64_t s = 0; s < slots; ++s) {
        const int64_t c = row[channels_offset + s];
        if (c < head_dim) x[t * head_dim + c] = NuqHalf(row + values_offset + 2 * s);
      }
    }
  }
};

// This family's one dispatcher: false (running nothing) for a width it has
// no instantiation for; MakeNuqCodec refuses those formats first.
template <class F>
HWY_INLINE bool WithNuqFormat(const NuqFormat& f, int64_t dim, const NuqTables& tables,
                              const F& fn) {
  auto run = [&](auto fmt) {
    fmt.head_dim = dim;
    fmt.row_bytes = f.RowBytes(dim);
    fmt.code_bytes = static_cast<int64_t>(f.CodeBytes(dim));
    fmt.values_offset = static_cast<int64_t>(f.ValuesOffset(dim));
    fmt.channels_offset = static_cast<int64_t>(f.ChannelsOffset(dim));
    fmt.slots = f.Slots(dim);
    fmt.tables = tables;
    fn(fmt);
    return true;
  };
  switch (f.bits * 2 + (f.is_v ? 1 : 0)) {
    case 4:
      return run(NuqFmt<2, false>{});
    case 5:
      return run(NuqFmt<2, true>{});
    case 6:
      return run(NuqFmt<3, false>{});
    case 7:
      return run(NuqFmt<3, true>{});
    case 8:
      return run(NuqFmt<4, false>{});
    case 9:
      return run(NuqFmt<4, true>{});
    default:
      return false;
  }
}

bool NuqKernelExistsImpl(const NuqFormat& f) {
  return WithNuqFormat(f, 32, NuqTables{}, [](const auto&) {});
}

void NuqDecodeImpl(const NuqFormat& f, int64_t dim, const NuqTables& tables, const uint8_t* rows,
                   int64_t n, float* x) {
  WithNuqFormat(f, dim, tables, [&](const auto& fmt) { DecodeRows(fmt, rows, n, x); });
}

void NuqScoresImpl(const NuqFormat& f, int64_t dim, const NuqTables& tables, const uint8_t* rows,
                   int64_t n, const float* q, int64_t group, float scale, float* scores,
                   int64_t stride) {
  WithNuqFormat(f, dim, tables,
                [&](const auto& fmt) { Scores(fmt, rows, n, q, group, scale, scores, stride); });
}

void NuqAccumulateImpl(const NuqFormat& f, int64_t dim, const NuqTables& tables,
                       const uint8_t* rows, int64_t n, const float* p, int64_t group,
                       int64_t stride, float* acc) {
  WithNuqFormat(f, dim, tables,
                [&](const auto& fmt) { AccumulateV(fmt, rows, n, p, group, stride, acc); });
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::codec
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::codec {

HWY_EXPORT(NuqDecodeImpl);
HWY_EXPORT(NuqScoresImpl);
HWY_EXPORT(NuqAccumulateImpl);
HWY_EXPORT(NuqKernelExistsImpl);

std::string NuqFormat::Name() const {
  return "nuq" + std::to_string(bits) + (is_v ? "-v" : "-k") + "-o" +
         std::to_string(outlier_percent);
}

void NuqSplitRowRef(const NuqFormat& f, int64_t dim, const float* x, const float* ch_offset,
                    const float* ch_scale, float* y, NuqRowSplit* split) {
  const int64_t slots = f.Slots(dim);
  split->slots = slots;
  std::vector<int64_t> outliers;
  outliers.reserve(static_cast<size_t>(slots));
  if (!f.is_v) {
    for (int64_t c = 0; c < dim; ++c) y[c] = (x[c] - ch_offset[c]) / ch_scale[c];
    std::vector<char> taken(static_cast<size_t>(dim), 0);
    for (int64_t s = 0; s < slots; ++s) {
      int64_t best = -1;
      for (int64_t c = 0; c < dim; ++c) {
        // NaN sorts as the largest magnitude, so it is kept exactly.
        if (taken[c]) continue;
        const float a = std::isnan(y[c]) ? INFINITY : std::fabs(y[c]);
        const float b = best < 0 ? -1.0f : (std::isnan(y[best]) ? INFINITY : std::fabs(y[best]));
        if (a > b) best = c;
      }
      taken[best] = 1;
      outliers.push_back(best);
    }
  } else {
    // NaN sorts above +inf so it is removed first.
    auto key = [&](int64_t c) { return std::isnan(x[c]) ? INFINITY : x[c]; };
    // Channels by value, NaN last, equal values (and NaNs) in channel
    // order: the order a stable sort by value gives. The peeling below
    // reads only the slots + 1 first and last, so when those do not
    // overlap two partial sorts place them, instead of sorting the row.
    const auto before = [&](int64_t a, int64_t b) {
      const bool a_nan = std::isnan(x[a]), b_nan = std::isnan(x[b]);
      if (a_nan != b_nan) return b_nan;
      if (!a_nan && x[a] != x[b]) return x[a] < x[b];
      return a < b;
    };
    std::vector<int64_t> order(static_cast<size_t>(dim));
    std::iota(order.begin(), order.end(), 0);
    const int64_t ends = slots + 1;
    if (2 * ends < dim) {
      std::partial_sort(order.begin(), order.begin() + ends, order.end(), before);
      std::partial_sort(order.rbegin(), order.rbegin() + ends, order.rend() - ends,
                        [&](int64_t a, int64_t b) { return before(b, a); });
    } else {
      std::sort(order.begin(), order.end(), before);
    }
    int64_t lo = 0, hi = dim - 1;
    for (int64_t s = 0; s < slots && lo < hi; ++s) {
      const float drop_hi = key(order[hi]) - key(order[hi - 1]);
      const float drop_lo = key(order[lo + 1]) - key(order[lo]);
      // !(drop_hi < drop_lo): the maximum on a tie and on NaN/inf differences.
      if (!(drop_hi < drop_lo)) {
        outliers.push_back(order[hi--]);
      } else {
        outliers.push_back(order[lo++]);
      }
    }
    const float min = x[order[lo]], max = x[order[hi]];
    split->scale_bits = F32ToF16((max - min) * 0.5f);
    split->offset_bits = F32ToF16(min + (max - min) * 0.5f);
    split->scale = F16ToF32(split->scale_bits);
    split->offset = F16ToF32(split->offset_bits);
    const float inv =
        split->scale != 0.0f && std::isfinite(split->scale) ? 1.0f / split->scale : 0.0f;
    for (int64_t c = 0; c < dim; ++c) y[c] = (x[c] - split->offset) * inv;
  }
  std::sort(outliers.begin(), outliers.end());
  for (int64_t s = 0; s < slots; ++s) split->channels[s] = static_cast<uint8_t>(outliers[s]);
}

uint8_t NuqNearestRef(const float* midpoints, int64_t levels, float y) {
  uint8_t u = 0;
  for (int64_t j = 0; j + 1 < levels; ++j) {
    if (y > midpoints[j]) u = static_cast<uint8_t>(j + 1);
  }
  return u;
}

void NuqPackRef(int bits, int64_t i, uint8_t u, uint8_t* codes) {
  if (bits != 3) return IntPackRef(IntFormat{bits}, i, u, codes);
  const int64_t block = i / 32, within = i % 32;
  IntPackRef(IntFormat{2}, within, u & 3, codes + block * 12);
  uint8_t& high = codes[block * 12 + 8 + within / 8];
  const int bit = static_cast<int>(within % 8);
  high = static_cast<uint8_t>((high & ~(1 << bit)) | (((u >> 2) & 1) << bit));
}

uint8_t NuqUnpackRef(int bits, int64_t i, const uint8_t* codes) {
  if (bits != 3) return IntUnpackRef(IntFormat{bits}, i, codes);
  const int64_t block = i / 32, within = i % 32;
  const uint8_t low = IntUnpackRef(IntFormat{2}, within, codes + block * 12);
  const uint8_t high = (codes[block * 12 + 8 + within / 8] >> (within % 8)) & 1;
  return static_cast<uint8_t>(low | (high << 2));
}

namespace {

float RoundToF16(float v) { return F16ToF32(F32ToF16(v)); }

class NuqCodec final : public KvCodec {
 public:
  NuqCodec(const NuqFormat& format, int64_t head_dim, CodecPath path)
      : KvCodec(head_dim), format_(format), path_(path) {
    // Until calibrated: uniform levels over [-1, 1], K channels unscaled.
    std::vector<float> uniform(static_cast<size_t>(format.Levels()));
    for (int64_t j = 0; j < format.Levels(); ++j) {
      uniform[j] = -1.0f + 2.0f * static_cast<float>(j) / static_cast<float>(format.Levels() - 1);
    }
    SetLevels(uniform.data());
    if (!format.is_v) {
      ch_scale_.assign(static_cast<size_t>(head_dim), 1.0f);
      ch_offset_.assign(static_cast<size_t>(head_dim), 0.0f);
    }
  }

  std::string FormatName() const override { return format_.Name(); }
  size_t RowBytes() const override { return format_.RowBytes(head_dim_); }
  // The codebook and (K) the channel scales and offsets this instance holds.
  size_t SideBytes() const override {
    return sizeof(float) *
           static_cast<size_t>(format_.Levels() + (format_.is_v ? 0 : 2 * head_dim_));
  }
  bool NeedsCalibrationFile() const override { return true; }

  Status SetCalibration(const KvCalibration& c, int64_t layer, int64_t head, bool is_v) override {
    const std::string what = "calibration file '" + c.source + "' for " + Name();
    if (is_v != format_.is_v) {
      return Status::Error(Name() + " is a " + (format_.is_v ? "V" : "K") + " codec, used for " +
                           (is_v ? "V" : "K"));
    }
    if (c.head_dim != head_dim_) {
      return Status::Error(what + ": head_dim " + std::to_string(c.head_dim) + ", the model's " +
                           std::to_string(head_dim_));
    }
    if (layer < 0 || layer >= c.num_layers || head < 0 || head >= c.num_kv_heads) {
      return Status::Error(what + ": no layer " + std::to_string(layer) + " / KV head " +
                           std::to_string(head) + " (file has " + std::to_string(c.num_layers) +
                           " layers, " + std::to_string(c.num_kv_heads) + " KV heads)");
    }
    auto books = c.ForBits(format_.bits);
    if (!books.ok()) return books.status().WithContext(Name());
    const std::vector<float>& levels = format_.is_v ? (*books)->v : (*books)->k;
    SetLevels(&levels[static_cast<size_t>(layer * format_.Levels())]);
    if (!format_.is_v) {
      const size_t base = static_cast<size_t>((layer * c.num_kv_heads + head) * head_dim_);
      for (int64_t i = 0; i < head_dim_; ++i) {
        // f16 so level * scale is exact (see the top); never 0 or inf.
        ch_scale_[i] = std::clamp(RoundToF16(c.k_scale[base + i]), 0x1p-24f, 65504.0f);
        ch_offset_[i] = c.k_offset[base + i];
      }
    }
    return Status::Ok();
  }

  // Encoding runs once per token; one scalar version for both paths.
  void Encode(const float* x, int64_t n, uint8_t* rows) const override {
    const int64_t dim = head_dim_;
    const size_t row_bytes = RowBytes();
    std::vector<float> y(static_cast<size_t>(dim));  // [head_dim]
    NuqRowSplit split;
    for (int64_t t = 0; t < n; ++t) {
      const float* xr = x + t * dim;
      uint8_t* row = rows + t * row_bytes;
      std::memset(row, 0, row_bytes);
      NuqSplitRowRef(format_, dim, xr, ch_offset_.data(), ch_scale_.data(), y.data(), &split);
      for (int64_t c = 0; c < dim; ++c) {
        NuqPackRef(format_.bits, c, NuqNearestRef(midpoints_, format_.Levels(), y[c]), row);
      }
      if (format_.is_v) {
        std::memcpy(row + format_.CodeBytes(dim), &split.scale_bits, 2);
        std::memcpy(row + format_.CodeBytes(dim) + 2, &split.offset_bits, 2);
      }
      const size_t values = format_.ValuesOffset(dim), channels = format_.ChannelsOffset(dim);
      for (int64_t s = 0; s < split.slots; ++s) {
        const uint16_t bits = F32ToF16(xr[split.channels[s]]);
        std::memcpy(row + values + 2 * s, &bits, 2);
        row[channels + s] = split.channels[s];
      }
    }
  }

  void Decode(const uint8_t* rows, int64_t n, float* x) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(NuqDecodeImpl)(format_, head_dim_, Tables(), rows, n, x);
    }
    const int64_t dim = head_dim_;
    const size_t values = format_.ValuesOffset(dim), channels = format_.ChannelsOffset(dim);
    for (int64_t t = 0; t < n; ++t) {
      const uint8_t* row = rows + t * RowBytes();
      float* xr = x + t * dim;
      float scale = 0.0f, offset = 0.0f;
      if (format_.is_v) {
        uint16_t bits;
        std::memcpy(&bits, row + format_.CodeBytes(dim), 2);
        scale = F16ToF32(bits);
        std::memcpy(&bits, row + format_.CodeBytes(dim) + 2, 2);
        offset = F16ToF32(bits);
      }
      for (int64_t c = 0; c < dim; ++c) {
        const float level = levels_[NuqUnpackRef(format_.bits, c, row)];
        xr[c] = format_.is_v ? level * scale + offset : level * ch_scale_[c] + ch_offset_[c];
      }
      for (int64_t s = 0; s < format_.Slots(dim); ++s) {
        uint16_t bits;
        std::memcpy(&bits, row + values + 2 * s, 2);
        xr[row[channels + s]] = F16ToF32(bits);
      }
    }
  }

  void Scores(const uint8_t* rows, int64_t n, const float* q, int64_t group, float scale,
              float* scores, int64_t stride) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(NuqScoresImpl)(format_, head_dim_, Tables(), rows, n, q, group,
                                                 scale, scores, stride);
    }
    ScoresByDecoding(*this, rows, n, q, group, scale, scores, stride);
  }

  void AccumulateV(const uint8_t* rows, int64_t n, const float* p, int64_t group, int64_t stride,
                   float* acc) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(NuqAccumulateImpl)(format_, head_dim_, Tables(), rows, n, p,
                                                     group, stride, acc);
    }
    AccumulateVByDecoding(*this, rows, n, p, group, stride, acc);
  }

 private:
  // levels: [Levels()], sorted; stored rounded to f16 (see the top).
  void SetLevels(const float* levels) {
    const int64_t count = format_.Levels();
    for (int64_t j = 0; j < 16; ++j) levels_[j] = RoundToF16(levels[std::min(j, count - 1)]);
    for (int64_t j = 0; j + 1 < count; ++j) {
      midpoints_[j] = levels_[j] + (levels_[j + 1] - levels_[j]) * 0.5f;
    }
  }
  NuqTables Tables() const { return {levels_, ch_scale_.data(), ch_offset_.data()}; }

  NuqFormat format_;
  CodecPath path_;
  alignas(64) float levels_[16];
  float midpoints_[15];
  std::vector<float> ch_scale_, ch_offset_;  // K: [head_dim] each
};

}  // namespace

StatusOr<std::unique_ptr<KvCodec>> MakeNuqCodec(const NuqFormat& format, int64_t head_dim,
                                                CodecPath path) {
  if (!HWY_DYNAMIC_DISPATCH(NuqKernelExistsImpl)(format)) {
    return Status::Error("KV cache type '" + format.Name() + "': no " +
                         std::to_string(format.bits) + "-bit NUQ kernel in this build (2, 3, 4)");
  }
  return std::unique_ptr<KvCodec>(std::make_unique<NuqCodec>(format, head_dim, path));
}

}  // namespace kvq::codec

// ---- registry entry (kv/codec_registry.h) ----
namespace kvq {
namespace {

Status BadNuq(const std::string& spelled, const std::string& why) {
  return Status::Error("KV cache type '" + spelled + "': " + why);
}

// The registry's factory: head_dim checks, then the codec.
StatusOr<std::unique_ptr<KvCodec>> MakeNuqFamilyCodec(const codec::NuqFormat& f, int64_t head_dim,
                                                      CodecPath path) {
  if (head_dim % 32 != 0 || head_dim > codec::kNuqMaxHeadDim) {
    return BadNuq(f.Name(), "NUQ codecs need head_dim a multiple of 32 up to " +
                                std::to_string(codec::kNuqMaxHeadDim) + " (head_dim " +
                                std::to_string(head_dim) + ")");
  }
  return codec::MakeNuqCodec(f, head_dim, path);
}
using NuqFormatSpec = KvFormatOf<codec::NuqFormat, MakeNuqFamilyCodec>;

// "nuq3-k", "nuq2-v-o2".
StatusOr<std::shared_ptr<const KvFormat>> ParseNuq(const std::string& base,
                                                   const std::string& spelled) {
  const std::vector<std::string> parts = SplitKvName(base);
  codec::NuqFormat format;
  format.bits = KvNameBits(parts[0], "nuq", {2, 3, 4});
  if (format.bits < 0) {
    return BadNuq(spelled, "unknown type '" + parts[0] + "' (NUQ bits are 2, 3 or 4)");
  }
  if (parts.size() < 2 || (parts[1] != "k" && parts[1] != "v")) {
    return BadNuq(spelled, "NUQ codecs name the side they calibrate for: nuq3-k or nuq3-v");
  }
  format.is_v = parts[1] == "v";
  bool have_outliers = false;
  for (size_t i = 2; i < parts.size(); ++i) {
    const std::string& o = parts[i];
    const bool digits = o.size() >= 2 && o.size() <= 7 && o[0] == 'o' &&
                        o.find_first_not_of("0123456789", 1) == std::string::npos;
    if (!digits) return BadNuq(spelled, "unknown option '" + o + "'");
    if (have_outliers) return BadNuq(spelled, "-o given twice");
    const int64_t percent = std::stoll(o.substr(1));
    if (percent > codec::kNuqMaxOutlierPercent) {
      return BadNuq(spelled, "-oP keeps P% of each row exactly, 0 <= P <= " +
                                 std::to_string(codec::kNuqMaxOutlierPercent));
    }
    have_outliers = true;
    format.outlier_percent = percent;
  }
  return NuqFormatSpec::Of(format);
}

std::vector<std::string> NuqSamples(int64_t head_dim) {
  if (head_dim % 32 != 0 || head_dim > codec::kNuqMaxHeadDim) return {};
  std::vector<std::string> names;
  for (int bits : {2, 3, 4}) {
    for (const char* side : {"k", "v"}) {
      names.push_back("nuq" + std::to_string(bits) + "-" + side + "-o1");
    }
  }
  names.push_back("nuq3-k-o0-s1-prerope");
  return names;
}

}  // namespace

const KvCodecFamily& NuqCodecFamily() {
  static const KvCodecFamily family{
      "nuq",
      "nuq2|nuq3|nuq4-k|-v[-oP]",
      "KVQuant (arXiv:2401.18079): non-uniform codebooks from `kvq calibrate` (keys with "
      "calibrated per-channel scales, values per token), P% of each row exact (default 1); "
      "need --kv-calibration.",
      [](const std::string& base) { return base.rfind("nuq", 0) == 0; },
      ParseNuq,
      [](int64_t) { return std::vector<std::string>{}; },
      NuqSamples,
      {"kvquant4", "kvquant3", "kvquant2"},
      {"kvquant4", "kvquant3", "kvquant2"},
      {},
      {{"kvquant2", "nuq2-k-o1-s1-prerope", "nuq2-v-o1-s1",
        "KVQuant: keys before RoPE, 1% outliers, first token f16 (needs --kv-calibration)"},
       {"kvquant3", "nuq3-k-o1-s1-prerope", "nuq3-v-o1-s1", "KVQuant at 3 bits"},
       {"kvquant4", "nuq4-k-o1-s1-prerope", "nuq4-v-o1-s1", "KVQuant at 4 bits"}}};
  return family;
}

}  // namespace kvq
#endif  // HWY_ONCE
