// llama.cpp's cache types (codec_ggml.h): ggml's quantizers spelled out in
// their f32 operation order, and the fused kernels over ggml's blocks. The
// SIMD Decode / Scores / AccumulateV are the shared kernels of
// codec_kernels-inl.h over a block format whose Load decodes as the weight
// decoders of ops/quant_decode-inl.h do (bit-identical to ggml's
// dequantize); the reference twins decode with ops::DequantizeRowRef and
// accumulate in double. Scores multiplies the f32 query with the stored
// values: llama.cpp's CPU kernels first quantize q to q8_0 (q8_1 for q4_1 and
// q5_1), an error of their own that kvq does not add.
#include "kv/codec_ggml.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/fp16.h"
#include "kv/codec_formats.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/codec_ggml.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h (per-target code).
#include "kv/codec_kernels-inl.h"
#include "ops/quant_decode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq::codec {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace qd = ops::HWY_NAMESPACE::qd;

// One ggml block type as codec_kernels-inl.h sees it: a parameter group is a
// block (d, and m for q4_1 / q5_1), Load decodes Lanes values of it.
template <GgmlType kType>
struct GgmlFmt {
  using D = qd::DF;  // <= 16 lanes (quant_decode-inl.h asserts it): a vector stays in a block
  static constexpr bool kHasParams = true;
  static constexpr bool kHasMin = kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1;
  static constexpr bool kDecodeOnce = true;  // codec_kernels-inl.h: DecodesOnce
  int64_t head_dim;
  size_t row_bytes;
  size_t block_bytes;

  int64_t ParamGroup() const { return kGgmlBlock; }
  HWY_INLINE ScaleOffset Params(const uint8_t* row, int64_t g) const {
    const uint8_t* b = row + g * block_bytes;
    return {qd::Half(qd::Load16(b)), kHasMin ? qd::Half(qd::Load16(b + 2)) : 0.0f};
  }

  // Nibbles of elements [i, i + Lanes) of a block: byte j holds element j
  // (low) and j + 16 (high).
  HWY_INLINE qd::VU Nibbles(const uint8_t* qs, int64_t within) const {
    const qd::VU bytes = qd::Bytes(qs + (within & 15));
    return within < 16 ? qd::Low4(bytes) : qd::High4(bytes);
  }
  // Adds the fifth bits (bit `within + lane` of the block's qh word).
  HWY_INLINE qd::VU WithHighBit(const uint8_t* qh, int64_t within, qd::VU nibbles) const {
    uint32_t word;
    std::memcpy(&word, qh, 4);
    const uint64_t bits = word >> within;
    const auto mask = hn::LoadMaskBits(qd::DU(), reinterpret_cast<const uint8_t*>(&bits));
    return hn::IfThenElse(mask, hn::Or(nibbles, hn::Set(qd::DU(), 16)), nibbles);
  }

  HWY_INLINE hn::Vec<D> Load(D d, const uint8_t* row, int64_t i, hn::Vec<D> vs,
                             hn::Vec<D> vo) const {
    const uint8_t* b = row + (i / kGgmlBlock) * static_cast<int64_t>(block_bytes);
    const int64_t within = i % kGgmlBlock;
    // The products and sums below are ggml's: (q - 8) * d, q * d + m (one
    // FMA: q * d is exact in f32), level * d.
    if constexpr (kType == GgmlType::kQ8_0) {
      const hn::Rebind<int8_t, qd::DI> d8;
      const auto q =
          hn::PromoteTo(qd::DI(), hn::LoadU(d8, reinterpret_cast<const int8_t*>(b + 2 + within)));
      return hn::Mul(hn::ConvertTo(d, q), vs);
    } else if constexpr (kType == GgmlType::kQ4_0) {
      return hn::Mul(hn::Sub(qd::ToF(Nibbles(b + 2, within)), hn::Set(d, 8.0f)), vs);
    } else if constexpr (kType == GgmlType::kQ4_1) {
      return hn::MulAdd(qd::ToF(Nibbles(b + 4, within)), vs, vo);
    } else if constexpr (kType == GgmlType::kQ5_0) {
      const qd::VU q = WithHighBit(b + 2, within, Nibbles(b + 6, within));
      return hn::Mul(hn::Sub(qd::ToF(q), hn::Set(d, 16.0f)), vs);
    } else if constexpr (kType == GgmlType::kQ5_1) {
      const qd::VU q = WithHighBit(b + 4, within, Nibbles(b + 8, within));
      return hn::MulAdd(qd::ToF(q), vs, vo);
    } else {
      alignas(64) static constexpr float kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                        1,    13,   25,  38,  53,  69,  89,  113};
      const auto idx = hn::BitCast(qd::DI(), Nibbles(b + 2, within));
      // The same table values either way: a register permute where one
      // vector holds all 16 (AVX-512), two halves where it holds 8 (AVX2),
      // else a gather.
      hn::Vec<D> level;
      if constexpr (!HWY_HAVE_SCALABLE && hn::MaxLanes(D()) >= 16) {
        level = hn::TableLookupLanes(hn::LoadU(d, kLevels), hn::IndicesFromVec(d, idx));
      } else if constexpr (!HWY_HAVE_SCALABLE && hn::MaxLanes(D()) == 8) {
        const auto low = hn::And(idx, hn::Set(qd::DI(), 7));
        const auto lo = hn::TableLookupLanes(hn::LoadU(d, kLevels), hn::IndicesFromVec(d, low));
        const auto hi = hn::TableLookupLanes(hn::LoadU(d, kLevels + 8), hn::IndicesFromVec(d, low));
        level = hn::IfThenElse(hn::RebindMask(d, hn::Gt(idx, hn::Set(qd::DI(), 7))), hi, lo);
      } else {
        level = hn::GatherIndex(d, kLevels, idx);
      }
      return hn::Mul(vs, level);
    }
  }
};

template <class Body>
HWY_INLINE void WithGgmlFmt(GgmlType type, int64_t dim, const Body& body) {
  const size_t bb = GgmlBlockBytes(type), rb = static_cast<size_t>(dim / kGgmlBlock) * bb;
  switch (type) {
    case GgmlType::kQ8_0:
      return body(GgmlFmt<GgmlType::kQ8_0>{dim, rb, bb});
    case GgmlType::kQ4_0:
      return body(GgmlFmt<GgmlType::kQ4_0>{dim, rb, bb});
    case GgmlType::kQ4_1:
      return body(GgmlFmt<GgmlType::kQ4_1>{dim, rb, bb});
    case GgmlType::kQ5_0:
      return body(GgmlFmt<GgmlType::kQ5_0>{dim, rb, bb});
    case GgmlType::kQ5_1:
      return body(GgmlFmt<GgmlType::kQ5_1>{dim, rb, bb});
    case GgmlType::kIQ4_NL:
      return body(GgmlFmt<GgmlType::kIQ4_NL>{dim, rb, bb});
  }
}

void GgmlDecodeImpl(GgmlType type, int64_t dim, const uint8_t* rows, int64_t n, float* x) {
  WithGgmlFmt(type, dim, [&](const auto& fmt) { DecodeRows(fmt, rows, n, x); });
}

void GgmlScoresImpl(GgmlType type, int64_t dim, const uint8_t* rows, int64_t n, const float* q,
                    int64_t group, float scale, float* scores, int64_t stride) {
  WithGgmlFmt(type, dim,
              [&](const auto& fmt) { Scores(fmt, rows, n, q, group, scale, scores, stride); });
}

void GgmlAccumulateImpl(GgmlType type, int64_t dim, const uint8_t* rows, int64_t n, const float* p,
                        int64_t group, int64_t stride, float* acc) {
  WithGgmlFmt(type, dim,
              [&](const auto& fmt) { AccumulateV(fmt, rows, n, p, group, stride, acc); });
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::codec
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::codec {

HWY_EXPORT(GgmlDecodeImpl);
HWY_EXPORT(GgmlScoresImpl);
HWY_EXPORT(GgmlAccumulateImpl);

namespace {

// ggml's C casts (int8_t)f and (uint8_t)f as x86-64 compiles them: cvttss2si
// to int32 (INT32_MIN for NaN and out-of-range values), then the low byte.
// In range (every finite value the quantizers produce) this is the C cast.
uint8_t CastLowByte(float v) {
  int32_t i = INT32_MIN;
  if (v >= -2147483648.0f && v < 2147483648.0f) i = static_cast<int32_t>(v);
  return static_cast<uint8_t>(static_cast<uint32_t>(i) & 0xFFu);
}
// ggml's MIN(limit, (int8_t)f) stored into a uint8_t.
uint8_t MinCode(int limit, float v) {
  const int c = static_cast<int8_t>(CastLowByte(v));
  return static_cast<uint8_t>(limit < c ? limit : c);
}

void Store16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// The block's element of largest magnitude, the first on a tie (q4_0, q5_0).
float SignedAbsMax(const float* x, float* amax_out) {
  float amax = 0.0f, max = 0.0f;
  for (int64_t j = 0; j < kGgmlBlock; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  if (amax_out != nullptr) *amax_out = amax;
  return max;
}

void MinMax(const float* x, float* min, float* max) {
  *min = FLT_MAX;
  *max = -FLT_MAX;
  for (int64_t j = 0; j < kGgmlBlock; ++j) {
    if (x[j] < *min) *min = x[j];
    if (x[j] > *max) *max = x[j];
  }
}

// q4_0 (levels = 16, offset 8.5) and q5_0 (32, 16.5): d = max / -(levels/2).
void QuantizeSym(const float* x, int levels, uint8_t* b) {
  const float max = SignedAbsMax(x, nullptr);
  const float d = max / static_cast<float>(-levels / 2);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const float offset = static_cast<float>(levels / 2) + 0.5f;
  Store16(b, F32ToF16(d));
  uint32_t qh = 0;
  uint8_t* qs = b + (levels == 16 ? 2 : 6);
  for (int64_t j = 0; j < kGgmlBlock / 2; ++j) {
    const uint8_t lo = MinCode(levels - 1, x[j] * id + offset);
    const uint8_t hi = MinCode(levels - 1, x[j + 16] * id + offset);
    if (levels == 16) {
      qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    } else {
      qs[j] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
      qh |= ((lo & 0x10u) >> 4) << j;
      qh |= ((hi & 0x10u) >> 4) << (j + 16);
    }
  }
  if (levels == 32) std::memcpy(b + 2, &qh, 4);
}

// q4_1 (levels 16) and q5_1 (32): d = (max - min) / (levels - 1), m = min.
void QuantizeAsym(const float* x, int levels, uint8_t* b) {
  float min, max;
  MinMax(x, &min, &max);
  const float d = (max - min) / static_cast<float>(levels - 1);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  Store16(b, F32ToF16(d));
  Store16(b + 2, F32ToF16(min));
  uint32_t qh = 0;
  uint8_t* qs = b + (levels == 16 ? 4 : 8);
  for (int64_t j = 0; j < kGgmlBlock / 2; ++j) {
    const float x0 = (x[j] - min) * id + 0.5f, x1 = (x[j + 16] - min) * id + 0.5f;
    if (levels == 16) {
      qs[j] = static_cast<uint8_t>(MinCode(15, x0) | (MinCode(15, x1) << 4));
    } else {  // q5_1 casts straight to uint8_t, without a MIN
      const uint8_t lo = CastLowByte(x0), hi = CastLowByte(x1);
      qs[j] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
      qh |= ((lo & 0x10u) >> 4) << j;
      qh |= ((hi & 0x10u) >> 4) << (j + 16);
    }
  }
  if (levels == 32) std::memcpy(b + 4, &qh, 4);
}

// x86's maxps / maxss: the second operand unless a > b (so NaN gives b).
float MaxPs(float a, float b) { return a > b ? a : b; }

// q8_0 as ggml-cpu's x86 quantize_row_q8_0 (AVX/AVX2): |x| max over four
// 8-lane vectors, reduced in its shuffle order (which decides where a NaN
// goes), d = amax / 127, codes rne(x * (127 / amax)) saturated to int8.
void QuantizeQ8_0(const float* x, uint8_t* b) {
  float lane[8];
  for (int l = 0; l < 8; ++l) {
    lane[l] = std::fabs(x[l]);
    for (int v = 1; v < 4; ++v) lane[l] = MaxPs(lane[l], std::fabs(x[8 * v + l]));
  }
  float m4[4];
  for (int l = 0; l < 4; ++l) m4[l] = MaxPs(lane[l + 4], lane[l]);
  const float amax = MaxPs(MaxPs(m4[0], m4[2]), MaxPs(m4[1], m4[3]));
  Store16(b, F32ToF16(amax / 127.0f));
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  for (int64_t j = 0; j < kGgmlBlock; ++j) {
    const float v = std::nearbyint(x[j] * id);  // the default rounding: half to even
    // cvtps2dq gives INT32_MIN for NaN and out of range; the packs saturate.
    int32_t q = (v >= -2147483648.0f && v < 2147483648.0f) ? static_cast<int32_t>(v) : INT32_MIN;
    q = q < -128 ? -128 : (q > 127 ? 127 : q);
    b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
  }
}

constexpr const int8_t* kIq4Levels = ops::kIQ4NLValues;

// Index of the level nearest v, ggml's bisection (ties go up).
int NearestIq4(float v) {
  if (v <= kIq4Levels[0]) return 0;
  if (v >= kIq4Levels[15]) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (v < kIq4Levels[mid]) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return v - kIq4Levels[hi - 1] < kIq4Levels[hi] - v ? hi - 1 : hi;
}

// iq4_nl as quantize_row_iq4_nl_ref (no importance weights, no extra
// tries): d0 = max / -127, indices nearest x / d0, then the least-squares
// scale over weights x^2. A block with amax < 1e-15 stores d = 0; ggml then
// leaves its indices as whatever its buffer held (the previous block's, or
// uninitialized), kvq writes index 8 (level +1, so it decodes to +0).
void QuantizeIq4Nl(const float* x, uint8_t* b) {
  float amax;
  const float max = SignedAbsMax(x, &amax);
  uint8_t idx[kGgmlBlock];
  float d = 0.0f;
  if (amax < 1e-15f) {
    std::memset(idx, 8, sizeof idx);
  } else {
    const float id = 1.0f / (max / static_cast<float>(kIq4Levels[0]));
    float sumqx = 0.0f, sumq2 = 0.0f;
    for (int64_t j = 0; j < kGgmlBlock; ++j) {
      idx[j] = static_cast<uint8_t>(NearestIq4(id * x[j]));
      const float q = kIq4Levels[idx[j]], w = x[j] * x[j];
      sumqx += w * q * x[j];
      sumq2 += w * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.0f;
  }
  Store16(b, F32ToF16(d));
  for (int64_t j = 0; j < kGgmlBlock / 2; ++j) {
    b[2 + j] = static_cast<uint8_t>(idx[j] | (idx[j + 16] << 4));
  }
}

class GgmlCodec final : public KvCodec {
 public:
  GgmlCodec(const GgmlFormat& format, int64_t head_dim, CodecPath path)
      : KvCodec(head_dim), format_(format), path_(path) {}

  std::string FormatName() const override { return format_.Name(); }
  size_t RowBytes() const override { return format_.RowBytes(head_dim_); }
  int64_t RotationBlock(bool is_v) const override { return format_.RotationBlock(head_dim_, is_v); }

  // One implementation on both paths: the quantizer is the format's
  // definition (ggml's operation order), run once per token and head.
  void Encode(const float* x, int64_t n, uint8_t* rows) const override {
    for (int64_t t = 0; t < n; ++t) {
      GgmlQuantizeRow(format_.type, x + t * head_dim_, head_dim_, rows + t * RowBytes());
    }
  }

  void Decode(const uint8_t* rows, int64_t n, float* x) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(GgmlDecodeImpl)(format_.type, head_dim_, rows, n, x);
    }
    ops::WeightView view;
    view.type = GgmlWeightType(format_.type);
    view.rows = n;
    view.cols = head_dim_;
    view.data = rows;
    for (int64_t t = 0; t < n; ++t) ops::DequantizeRowRef(view, t, x + t * head_dim_);
  }

  void Scores(const uint8_t* rows, int64_t n, const float* q, int64_t group, float scale,
              float* scores, int64_t stride) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(GgmlScoresImpl)(format_.type, head_dim_, rows, n, q, group, scale,
                                                  scores, stride);
    }
    ScoresByDecoding(*this, rows, n, q, group, scale, scores, stride);
  }

  void AccumulateV(const uint8_t* rows, int64_t n, const float* p, int64_t group, int64_t stride,
                   float* acc) const override {
    if (path_ == CodecPath::kSimd) {
      return HWY_DYNAMIC_DISPATCH(GgmlAccumulateImpl)(format_.type, head_dim_, rows, n, p, group,
                                                      stride, acc);
    }
    AccumulateVByDecoding(*this, rows, n, p, group, stride, acc);
  }

 private:
  GgmlFormat format_;
  CodecPath path_;
};

}  // namespace

const char* GgmlTypeName(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
      return "q8_0";
    case GgmlType::kQ4_0:
      return "q4_0";
    case GgmlType::kQ4_1:
      return "q4_1";
    case GgmlType::kQ5_0:
      return "q5_0";
    case GgmlType::kQ5_1:
      return "q5_1";
    case GgmlType::kIQ4_NL:
      return "iq4_nl";
  }
  return "?";
}

ops::WeightType GgmlWeightType(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
      return ops::WeightType::kQ8_0;
    case GgmlType::kQ4_0:
      return ops::WeightType::kQ4_0;
    case GgmlType::kQ4_1:
      return ops::WeightType::kQ4_1;
    case GgmlType::kQ5_0:
      return ops::WeightType::kQ5_0;
    case GgmlType::kQ5_1:
      return ops::WeightType::kQ5_1;
    case GgmlType::kIQ4_NL:
      return ops::WeightType::kIQ4_NL;
  }
  return ops::WeightType::kQ4_0;
}

int GgmlCodeBits(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
      return 8;
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
      return 5;
    default:
      return 4;
  }
}

size_t GgmlBlockBytes(GgmlType type) {
  return static_cast<size_t>(ops::BlockBytes(GgmlWeightType(type)));
}

std::string GgmlFormat::Name() const {
  return std::string(GgmlTypeName(type)) + (rotate ? "" : "-norot");
}

int64_t GgmlFormat::RotationBlock(int64_t head_dim, bool is_v) const {
  if (!rotate || head_dim % 64 != 0) return 0;
  if (is_v) return 64;
  int64_t block = 64;  // the largest power of two dividing head_dim
  while (head_dim % (2 * block) == 0) block *= 2;
  return block;
}

void GgmlQuantizeRow(GgmlType type, const float* x, int64_t n, uint8_t* out) {
  const size_t bb = GgmlBlockBytes(type);
  for (int64_t blk = 0; blk < n / kGgmlBlock; ++blk) {
    const float* xb = x + blk * kGgmlBlock;
    uint8_t* b = out + static_cast<size_t>(blk) * bb;
    switch (type) {
      case GgmlType::kQ8_0:
        QuantizeQ8_0(xb, b);
        break;
      case GgmlType::kQ4_0:
        QuantizeSym(xb, 16, b);
        break;
      case GgmlType::kQ5_0:
        QuantizeSym(xb, 32, b);
        break;
      case GgmlType::kQ4_1:
        QuantizeAsym(xb, 16, b);
        break;
      case GgmlType::kQ5_1:
        QuantizeAsym(xb, 32, b);
        break;
      case GgmlType::kIQ4_NL:
        QuantizeIq4Nl(xb, b);
        break;
    }
  }
}

StatusOr<std::unique_ptr<KvCodec>> MakeGgmlCodec(const GgmlFormat& format, int64_t head_dim,
                                                 CodecPath path) {
  if (head_dim % kGgmlBlock != 0) {
    return Status::Error("KV cache type '" + format.Name() +
                         "': llama.cpp's blocks hold 32 values, so head_dim must be a multiple "
                         "of 32 (head_dim " +
                         std::to_string(head_dim) + ")");
  }
  return std::unique_ptr<KvCodec>(std::make_unique<GgmlCodec>(format, head_dim, path));
}

}  // namespace kvq::codec
#endif  // HWY_ONCE
