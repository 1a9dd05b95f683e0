// TurboQuant (arXiv:2504.19874) and QJL (arXiv:2406.03482) as KV codecs:
// the formats, the math they share (Lloyd-Max codebooks, the seeded
// rotation and Gaussian sketch) and the factory. Internal to the kv layer;
// codec_turbo.cc describes the row layouts and registers the names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "kv/codec.h"

namespace kvq::codec {

// Largest head_dim these codecs take: the fused kernels keep a few rows of
// decoded values and sketches on the stack.
inline constexpr int64_t kTurboMaxHeadDim = 256;

enum class TurboKind {
  kMse,     // tqB[-nc]: rotation + Lloyd-Max codes + f16 norm
  kProd,    // tqB-qjl: (B-1)-bit MSE codes + 1-bit QJL sketch of the residual
  kQjl,     // qjl[-xM]: signs of a Gaussian projection + f16 norm
  kUniform  // tqvB: vLLM's TurboQuant values, uniform over the whole row
};

struct TurboFormat {
  TurboKind kind = TurboKind::kMse;
  // Bits per value in tenths (25 = 2.5): the name's B. For kProd the MSE
  // part has B - 1 bits and the sketch one.
  int bits10 = 30;
  bool norm_correction = false;  // -nc (kMse only)
  int sketch_multiple = 1;       // kQjl: sketch rows m = multiple * head_dim
  uint64_t seed = 0;             // -seedN: rotation signs and sketch
  double bits = 3.0;             // the name's bits (KvFormatOf's NominalBits)

  // Bits of the MSE codes in tenths (0 for kQjl, kUniform: bits10).
  int MseBits10() const { return kind == TurboKind::kProd ? bits10 - 10 : bits10; }
  std::string Name() const;
};

// "tq3-nc", "tq2.5-qjl", "qjl-x2", "tqv4" (base names without streaming
// options) -> format; `spelled` names the user's text in errors.
StatusOr<TurboFormat> ParseTurboFormat(const std::string& base, const std::string& spelled);
// The codec for head_dim (a power of two from 16 to kTurboMaxHeadDim), or
// an error naming the constraint.
StatusOr<std::unique_ptr<KvCodec>> MakeTurboCodec(const TurboFormat& format, int64_t head_dim,
                                                  CodecPath path);

// The Lloyd-Max quantizer of N(0, 1) with 2^bits levels (bits 1..4): sorted
// levels, found by Lloyd iterations on the exact Gaussian cell means until
// no level moves by more than 1e-13. The coordinates of a uniformly random
// unit vector in d dimensions are close to N(0, 1/d) (exactly a scaled
// Beta; the gap is O(1/d)), so the codecs use these levels / sqrt(d).
std::vector<double> GaussianLloydMax(int bits);
// Mean squared error of that quantizer on N(0, 1) (exact integrals).
double GaussianLloydMaxMse(const std::vector<double>& levels);

// The seeded rotation R = H * D_fixed * D_seed / sqrt(d) (kv/hadamard.h's
// rotation after seed-dependent sign flips), applied in double as the
// reference twin does (and as Encode/Decode do on every path).
void TurboRotateRef(uint64_t seed, int64_t dim, const double* x, double* y);
void TurboUnrotateRef(uint64_t seed, int64_t dim, const double* y, double* x);
// D_seed's entry i (+1 or -1).
float TurboSign(uint64_t seed, int64_t i);
// The Gaussian sketch S: [rows, dim], N(0, 1) entries rounded to f32, from
// a counter-based generator (SplitMix64 + Box-Muller): identical everywhere.
std::vector<float> TurboSketch(uint64_t seed, int64_t rows, int64_t dim);

// Test hook: what one stored row is made of, for rounding bounds. y_norm =
// ||y|| (the MSE part in the rotated domain, or the uniform row's decoded
// values), sketch_factor f and rows m (0 without a sketch), ||S||_F, and
// whether the row is rotated. Error if `codec` is not one of these codecs.
struct TurboRowParts {
  double y_norm = 0, sketch_factor = 0, sketch_frobenius = 0;
  int64_t sketch_rows = 0;
  bool rotated = false;
};
StatusOr<TurboRowParts> TurboDecodeParts(const KvCodec& codec, const uint8_t* row);
// Test hook: n rows as the fused kernels read them, [n, expanded] f32 values
// [y | f s] (kUniform: the row's values), from the scalar expansion
// (simd false) or the SIMD kernels' decoding (the dispatched target); the
// two must agree bit for bit. Error if `codec` is not one of these codecs.
StatusOr<std::vector<float>> TurboExpandRows(const KvCodec& codec, const uint8_t* rows, int64_t n,
                                             bool simd);

// What the SIMD kernels (kv/turbo_kernels.cc) need to read a row as its
// expanded f32 vector [y | f s] (kUniform: its values): the code runs of one
// width, the byte offsets, and each width's levels padded to 16 floats.
struct TurboKernelLayout {
  int64_t head_dim = 0, y_dim = 0, expanded = 0, sketch_rows = 0;
  size_t row_bytes = 0, sketch_offset = 0, norm_offset = 0;
  bool uniform = false, has_gamma = false;
  int num_segments = 0;  // runs of one code width: 1 or 2
  int64_t seg_first[2] = {0, 0};
  int seg_width[2] = {0, 0};
  size_t seg_byte[2] = {0, 0};
  int64_t min_segment = 0;      // shortest run (codes) or y_dim
  const float* levels[5] = {};  // by width: 16 floats (Lloyd-Max levels / sqrt(d))
};
// Runtime-dispatched kernels over rows of that layout. q: [group, expanded]
// (the prepared query); acc: [group, expanded]; x: [n, expanded].
void TurboDecodeExpanded(const TurboKernelLayout& layout, const uint8_t* rows, int64_t n, float* x);
void TurboScores(const TurboKernelLayout& layout, const uint8_t* rows, int64_t n, const float* q,
                 int64_t group, float scale, float* scores, int64_t stride);
void TurboAccumulate(const TurboKernelLayout& layout, const uint8_t* rows, int64_t n,
                     const float* p, int64_t group, int64_t stride, float* acc);

}  // namespace kvq::codec
