// llama.cpp's KV cache types as kvq codecs (codec_ggml.cc): q8_0, q4_0,
// q4_1, q5_0, q5_1 and iq4_nl, stored as ggml's 32-value blocks byte for
// byte (ops/weights.h has the layouts), so a row of head_dim values is
// head_dim / 32 blocks exactly as llama.cpp's cache holds one head of one
// token. Internal to the kv layer; users name them "q4_0", "q4_0-norot".
//
// Encode is the quantizer llama.cpp's CPU backend writes its cache rows with
// (ggml_set_rows calls the CPU type traits' from_float):
//   q4_0 ... q5_1, iq4_nl: ggml's reference quantizers (quantize_row_*_ref;
//     the CPU from_float of these types only forwards to them);
//   q8_0: the CPU backend's own x86 quantize_row_q8_0 (AVX/AVX2), which is
//     not the reference one: it multiplies by 127 / amax (the reference by
//     1 / f32(amax / 127)) and rounds half to even (the reference: half away
//     from zero), so a few values per million land one code apart.
// Both are spelled out in codec_ggml.cc in their f32 operation order; the
// conformance test (tests/conformance/llamacpp_kv_types_test.cc) checks the
// bytes against ggml's on the same input. Decode is ggml's dequantize
// (ops::DequantizeRowRef, the weight decoders' scalar truth).
//
// Rotation (llama.cpp PR 21038, llama-kv-cache.cpp): llama.cpp rotates K
// (and q) of a quantized K cache and V (undone on the attention output) of
// a quantized V cache by an orthonormal Walsh-Hadamard matrix when the head
// size is a multiple of 64: K by blocks of the largest power of two dividing
// head_dim, V by blocks of 64. These names do the same by default
// (RotationBlock below, applied by the paged cache); "-norot" turns it off
// (llama.cpp's LLAMA_ATTN_ROT_DISABLE=1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "kv/codec.h"
#include "ops/weights.h"

namespace kvq::codec {

enum class GgmlType { kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kIQ4_NL };
inline constexpr GgmlType kGgmlTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                          GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL};
// Values per block (ggml's QK8_0 = QK4_0 = ... = QK4_NL).
inline constexpr int64_t kGgmlBlock = 32;

const char* GgmlTypeName(GgmlType type);  // "q4_0"
ops::WeightType GgmlWeightType(GgmlType type);
int GgmlCodeBits(GgmlType type);  // 8, 4 or 5
size_t GgmlBlockBytes(GgmlType type);

struct GgmlFormat {
  GgmlType type = GgmlType::kQ4_0;
  bool rotate = true;  // llama.cpp's default Hadamard rotation (false: "-norot")
  int bits = 4;        // nominal code bits (KvFormatOf reads it)
  std::string Name() const;
  size_t RowBytes(int64_t head_dim) const {
    return static_cast<size_t>(head_dim / kGgmlBlock) * GgmlBlockBytes(type);
  }
  // llama.cpp's rotation block for K (is_v false) or V at head_dim, 0 = none.
  int64_t RotationBlock(int64_t head_dim, bool is_v) const;
};

// x[n] (n % 32 == 0) -> n / 32 blocks, the bytes llama.cpp's CPU cache writer
// stores (see above). Non-finite input gives what ggml's C code gives on
// x86-64, where its casts to int8_t/uint8_t go through cvttss2si (NaN and
// out-of-range values become INT32_MIN, whose low byte is 0) and q8_0's
// packs saturate (NaN -> -128); such rows decode to NaN or inf either way.
void GgmlQuantizeRow(GgmlType type, const float* x, int64_t n, uint8_t* out);

StatusOr<std::unique_ptr<KvCodec>> MakeGgmlCodec(const GgmlFormat& format, int64_t head_dim,
                                                 CodecPath path);

}  // namespace kvq::codec
