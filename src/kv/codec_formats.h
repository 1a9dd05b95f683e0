// Scalar definitions of the codec formats (see codec.h for the layouts):
// the reference twins the SIMD kernels must match, shared by the codec
// implementations and their tests. Internal to the kv layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/codec.h"

namespace kvq::codec {

// ---- fp8 ----
struct Fp8Format {
  const char* name;
  int mantissa_bits;
  int bias;
  float max_finite;
  uint8_t max_code;  // magnitude code of max_finite; codes above it are NaN (or inf)
  uint8_t nan_code;  // magnitude code written for NaN input
};
inline constexpr Fp8Format kE4M3{"fp8_e4m3", 3, 7, 448.0f, 0x7E, 0x7F};
inline constexpr Fp8Format kE5M2{"fp8_e5m2", 2, 15, 57344.0f, 0x7B, 0x7E};

// y (already divided by the scale) -> code: round to nearest even,
// subnormals kept, |y| beyond max_finite (and inf) saturate, NaN -> NaN.
uint8_t Fp8EncodeRef(float y, const Fp8Format& f);
// code -> value (exact; NaN codes -> NaN). Multiply by the scale afterwards.
float Fp8DecodeRef(uint8_t code, const Fp8Format& f);

// ---- integer groups ----
struct IntFormat {
  int bits = 4;              // 8, 4 or 2
  int64_t group = 32;        // 32, 64 or 128: values per group (tokens per tile if per_channel)
  bool symmetric = false;    // sym: scale only; asym: scale + min
  bool per_channel = false;  // codec_channel.cc: one group = one channel over `group` tokens

  int64_t Levels() const { return int64_t{1} << bits; }
  int64_t Groups(int64_t head_dim) const { return head_dim / group; }
  size_t CodeBytes(int64_t head_dim) const { return static_cast<size_t>(head_dim * bits / 8); }
  size_t ParamBytes() const { return symmetric ? 2 : 4; }
  // Per channel: a tile's parameters (head_dim of them) spread over its
  // `group` rows; ParseKvCodec checks the division is exact.
  size_t RowBytes(int64_t head_dim) const {
    if (per_channel)
      return CodeBytes(head_dim) + static_cast<size_t>(head_dim) * ParamBytes() / group;
    return CodeBytes(head_dim) + static_cast<size_t>(Groups(head_dim)) * ParamBytes();
  }
  std::string Name() const;
};

// Group parameters as stored (f16 bits) and as used in f32.
struct GroupParams {
  uint16_t scale_bits, min_bits;  // min_bits unused (0) for sym
  float scale;                    // f16 value of scale_bits
  float offset;                   // asym: min; sym: -2^(bits-1) * scale (x^ = u * scale + offset)
  float inv_scale;                // 1 / scale, or 0 when scale == 0
};
// Parameters from a group's min and max (the SIMD path reduces those itself).
GroupParams IntGroupParams(const IntFormat& f, float min, float max);
// The code of x under p (see codec.h).
uint8_t IntQuantizeRef(const IntFormat& f, const GroupParams& p, float x);
// Stores code u of element i (0 <= i < head_dim) into a row's code bytes.
void IntPackRef(const IntFormat& f, int64_t i, uint8_t u, uint8_t* codes);
uint8_t IntUnpackRef(const IntFormat& f, int64_t i, const uint8_t* codes);

// ---- GEAR (codec_gear.cc) ----
// Base quantizer + low-rank residual + sparse outliers per tile; the layout
// and the algorithm are described at the top of codec_gear.cc.
struct GearFormat {
  int bits = 2;               // base quantizer bits (2, 4 or 8), asymmetric
  bool per_channel = true;    // base: per channel over the tile (K) or per token (V)
  int64_t group = 32;         // per token: channels per base group (32, 64, 128)
  int64_t tile_tokens = 64;   // GEAR's buffer: tokens compressed together (32, 64, 128)
  int rank = 4;               // low-rank factors reserved (and used) per tile, 0..16
  int iterations = 3;         // power (subspace) iterations, 1..20
  int outlier_permille = 20;  // sparse outliers per 1000 values (20 = 2%), 0..100
  // The base quantizer as an integer format (per channel: group = tile_tokens).
  IntFormat Base() const;
  // Outlier slots per tile: ceil(permille / 1000 * tile_tokens * head_dim).
  int64_t OutlierSlots(int64_t head_dim) const;
  std::string Name() const;
};
// "gear2-c64-rank4-iter3-out2" -> format (no head_dim checks; MakeGearCodec
// does those). `spelled` is the user's full name for messages.
StatusOr<GearFormat> ParseGearFormat(const std::string& name, const std::string& spelled);
StatusOr<std::unique_ptr<KvCodec>> MakeGearCodec(const GearFormat& format, int64_t head_dim,
                                                 CodecPath path);
// Test hook: a GEAR codec's tiles split into their parts, each [n, head_dim]:
// the base quantizer's values, the low-rank term (A B)[t, c] as Decode sums
// it, sum_j |A[t, j] B[j, c]| (for rounding bounds), and a 0/1 mask of the
// sparse outliers (where Decode returns the stored value instead of the sum).
// Error if `codec` is not a GEAR codec.
struct GearParts {
  std::vector<float> base, low_rank, low_rank_abs, outlier_mask;  // [n, head_dim] each
};
StatusOr<GearParts> GearDecodeParts(const KvCodec& codec, const uint8_t* rows, int64_t n);
// ---- NUQ: KVQuant's non-uniform codebooks with dense-and-sparse rows ----
// (codec_nuq.cc has the layout.) Outlier channels are stored in one byte.
inline constexpr int64_t kNuqMaxHeadDim = 256;
inline constexpr int64_t kNuqMaxOutlierPercent = 10;
inline constexpr int64_t kNuqMaxSlots = (kNuqMaxOutlierPercent * kNuqMaxHeadDim + 99) / 100;

struct NuqFormat {
  int bits = 3;       // 2, 3 or 4: 2^bits levels
  bool is_v = false;  // V: per-token scale/offset; K: calibrated per-channel ones
  int64_t outlier_percent = 1;

  int64_t Levels() const { return int64_t{1} << bits; }
  // Outlier slots per row: ceil(outlier_percent% of head_dim).
  int64_t Slots(int64_t head_dim) const { return (outlier_percent * head_dim + 99) / 100; }
  size_t CodeBytes(int64_t head_dim) const { return static_cast<size_t>(head_dim * bits / 8); }
  size_t ParamBytes() const { return is_v ? 4 : 0; }
  // Offsets inside a row: codes, params (V), slot values (f16), slot channels (u8).
  size_t ValuesOffset(int64_t head_dim) const { return CodeBytes(head_dim) + ParamBytes(); }
  size_t ChannelsOffset(int64_t head_dim) const {
    return ValuesOffset(head_dim) + 2 * static_cast<size_t>(Slots(head_dim));
  }
  size_t RowBytes(int64_t head_dim) const {
    return (ChannelsOffset(head_dim) + static_cast<size_t>(Slots(head_dim)) + 3) / 4 * 4;
  }
  std::string Name() const;  // "nuq3-k-o1"
};

// How one row is split before quantization: the normalized values y (the
// inliers in [-1, 1]) and the outlier channels kept exactly.
struct NuqRowSplit {
  uint16_t scale_bits = 0, offset_bits = 0;  // V: f16 per-token scale and offset
  float scale = 1.0f, offset = 0.0f;         // V: their values
  int64_t slots = 0;
  uint8_t channels[kNuqMaxSlots] = {};  // outlier channels, ascending
};
// x: [head_dim] (finite or not; never crashes). K: y = (x - ch_offset) /
// ch_scale, the outliers are the Slots() channels of largest |y| (lower
// channel first on ties). V: the outliers are removed greedily from the ends
// of the sorted row (each time the end whose removal shrinks the range more,
// the maximum on a tie); scale = f16(half the inliers' range), offset =
// f16(their midpoint), y = (x - offset) / scale (0 when scale is 0). y: [head_dim].
void NuqSplitRowRef(const NuqFormat& f, int64_t head_dim, const float* x, const float* ch_offset,
                    const float* ch_scale, float* y, NuqRowSplit* split);
// Index of the level nearest y given the midpoints between sorted levels
// (levels - 1 of them): the number of midpoints below y (ties go down).
uint8_t NuqNearestRef(const float* midpoints, int64_t levels, float y);
// bits 2 and 4 pack as the int formats; 3 bits as 12 bytes per 32 values:
// bytes 0-7 the low two bits exactly as int2, bytes 8-11 the high bit
// (byte 8 + m, bit l: element 8m + l).
void NuqPackRef(int bits, int64_t i, uint8_t u, uint8_t* codes);
uint8_t NuqUnpackRef(int bits, int64_t i, const uint8_t* codes);

// ---- vLLM's formats (codec_vllm.cc) ----
// vLLM's int4_per_token_head rotation: D's diagonal (+-1, from mt19937
// seeded 0x9E3779B9 as torch.bernoulli(0.5) draws them) and the unnormalized
// Sylvester Hadamard transform in place (its butterfly order), dim a power of two.
std::vector<float> VllmRhtSigns(int64_t dim);
void VllmHadamard(float* x, int64_t dim);
// vLLM's int4_per_token_head rotation as an orthonormal matrix, M = H D /
// sqrt(dim) (D = diag(VllmRhtSigns)), row-major [dim, dim].
std::vector<float> VllmRotationMatrix(int64_t dim);
// name: a vLLM format name (fp8_e4m3-t1, int8_per_token_head, ...).
StatusOr<std::unique_ptr<KvCodec>> MakeVllmCodec(const std::string& name, int64_t head_dim,
                                                 CodecPath path);
// The per-tensor scale a vLLM fp8 codec uses (1, or the calibration's).
StatusOr<float> VllmCodecTensorScale(const KvCodec& codec);

// ---- reference fused kernels ----
// Scores / AccumulateV as codec.h defines them, computed by decoding each row
// with codec.Decode and accumulating in double: the scalar truth.
void ScoresByDecoding(const KvCodec& codec, const uint8_t* rows, int64_t n, const float* q,
                      int64_t group, float scale, float* scores, int64_t stride);
void AccumulateVByDecoding(const KvCodec& codec, const uint8_t* rows, int64_t n, const float* p,
                           int64_t group, int64_t stride, float* acc);

// ---- factories (one per codec family file) ----
// Each kernel family has one dispatcher from its format to the compiled
// instantiations; a factory asks it first and returns an error for a width
// or option it does not implement instead of running another one.
enum class FloatKind { kF32, kF16, kBF16, kFp8E4M3, kFp8E5M2 };
std::unique_ptr<KvCodec> MakeFloatCodec(FloatKind kind, int64_t head_dim, CodecPath path);
Status IntKernelStatus(const IntFormat& format);
StatusOr<std::unique_ptr<KvCodec>> MakeIntCodec(const IntFormat& format, int64_t head_dim,
                                                CodecPath path);
StatusOr<std::unique_ptr<KvCodec>> MakeChannelCodec(const IntFormat& format, int64_t head_dim,
                                                    CodecPath path);
StatusOr<std::unique_ptr<KvCodec>> MakeNuqCodec(const NuqFormat& format, int64_t head_dim,
                                                CodecPath path);

}  // namespace kvq::codec
