// How one KV head's rows are stored inside a cache block, and the fused
// kernels that read them back. A codec sees a *tile*: up to `tile_tokens`
// consecutive tokens of one (layer, K-or-V, KV head), head_dim values each.
// Per-token codecs (f16, fp8, intN) encode each row independently; a codec
// that needs a whole tile at once (per-channel schemes) can still implement
// this interface because the cache hands it the whole tile every time.
//
// Attention never materializes an f32 copy of the cache: it calls Scores on K
// tiles and AccumulateV on V tiles, block by block (see paged_cache.cc).
//
// The codecs (bytes per row for head_dim d; docs/ARCHITECTURE.md has the table):
//   f32        4d bytes, the reference.
//   f16        2d bytes, IEEE binary16, round to nearest even; |x| >= 65520
//              becomes inf (as every f16 cache does).
//   bf16       2d bytes, round to nearest even.
//   fp8_e4m3   d bytes (OCP E4M3FN: bias 7, max finite 448, no inf, 0x7F/0xFF NaN)
//   fp8_e5m2   d bytes (bias 15, max finite 57344)
//              Both fp8 codecs store x / scale, rounded to nearest even with
//              subnormals, saturating to +-max finite (finite input never gives
//              inf/NaN; NaN stays NaN). `scale` is one f32 per codec instance,
//              i.e. per (layer, K/V, KV head) when the cache makes one codec per
//              head: Calibrate() sets scale = absmax / max_finite from the first
//              rows it is given (the first prefill), later values beyond that
//              range saturate. Before calibration scale = 1. SideBytes() = 4.
//   intB-gG-sym / intB-gG-asym  (B = 8, 4, 2; G = 32, 64, 128 dividing d)
//              Per token, groups of G consecutive values, 2^B levels each,
//              codes u in [0, 2^B - 1]. Row = packed codes (d*B/8 bytes), then
//              one f16 scale per group, then (asym) one f16 min per group.
//              sym  (llama.cpp q4_0 style): m = the group's value of largest
//                   magnitude (the positive one on a tie), s = f16(m / -2^(B-1)),
//                   x^ = (u - 2^(B-1)) * s: m itself is level u = 0 and all
//                   2^B levels are used (2^(B-1) on m's side, 2^(B-1) - 1 on
//                   the other, plus zero).
//              asym: s = f16((max - min) / (2^B - 1)), m = f16(min),
//                   x^ = u * s + m, levels spanning [min, max].
//              u = clamp(round_half_even((x - offset) * (1 / s)), 0, 2^B - 1).
//              Scales and mins saturate at the f16 range (+-65504), so groups
//              with |x| beyond it (asym) or beyond 65504 * 2^(B-1) (sym) clip.
//              Packing inside each 32-value block: int8 one byte per value;
//              int4 16 bytes, byte j = element j (low nibble) | element j+16
//              (high nibble); int2 8 bytes, byte j = elements j, j+8, j+16,
//              j+24 in bits 0-1, 2-3, 4-5, 6-7. This lets a SIMD register of
//              up to 16 (int4) or 8 (int2) lanes decode from one load.
//   nuqB-k-oP / nuqB-v-oP  (B = 2, 3, 4; P% outlier slots, default 1)
//              KVQuant's non-uniform codebooks with dense-and-sparse rows;
//              need a calibration file (SetCalibration). Layout and mapping
//              in codec_nuq.cc; head_dim a multiple of 32 up to 256.
// head_dim may be 1 to kMaxCodecHeadDim; integer codecs need it to be a
// multiple of their group size. The float codecs' SIMD kernels need a
// multiple of 16 (every common head_dim: 64, 80, 96, 128, 256); other sizes
// (toy test models) run the scalar reference kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace kvq {

struct KvCalibration;  // kv/kv_calibration.h

inline constexpr int64_t kMaxCodecHeadDim = 1024;

// How the cache feeds a codec over time (docs/ARCHITECTURE.md, "Streaming").
// Tokens the cache has not encoded yet stay in f16 (the residual, KIVI's
// full-precision window); whenever keep_tokens + flush_tokens of them are
// waiting it encodes the oldest flush_tokens. So:
//   plain per-token codec      keep 0, flush 1: every token encoded at once;
//   per-token with -rN         keep N, flush 1: exactly the newest N in f16
//                              (KIVI's values);
//   per-channel (-cG) with -rN keep 0, flush N (a multiple of G): up to N - 1
//                              in f16, all N quantized together once N have
//                              arrived (KIVI's keys); without -rN, flush G.
// The rule depends only on token counts, so appending one token at a time or
// all at once leaves the same state (the cache rounds every input to f16
// first, so the values are the same too).
struct KvStreaming {
  int64_t tile_tokens = 1;   // Encode/Decode take whole tiles of this many rows
  int64_t keep_tokens = 0;   // newest tokens kept unencoded (f16)
  int64_t flush_tokens = 1;  // encoded together, oldest first
  int64_t sink_tokens = 0;   // first tokens also kept in f16; attention reads those (-sN)
  // -aN: up to N tokens per sequence and layer that drew the most attention
  // mass during prefill (measured by the cache, paged_cache.cc) also kept in
  // f16; attention reads those rows instead of the encoded ones.
  int64_t detect_sinks = 0;
  bool pre_rope = false;  // K encoded before RoPE; attention applies RoPE after decoding
  bool Plain() const {
    return tile_tokens == 1 && keep_tokens == 0 && flush_tokens == 1 && sink_tokens == 0 &&
           detect_sinks == 0 && !pre_rope;
  }
  // Unencoded tokens the cache must hold at once (0 for a plain codec).
  int64_t ResidualCapacity() const { return Plain() ? 0 : keep_tokens + flush_tokens; }
  // Tokens encoded once `length` tokens have been appended.
  int64_t EncodedAt(int64_t length) const {
    if (length < keep_tokens + flush_tokens) return 0;
    return length - keep_tokens - (length - keep_tokens) % flush_tokens;
  }
};

class KvCodec {
 public:
  virtual ~KvCodec() = default;

  // Canonical name, e.g. "int4-g32-asym" or "int2-c32-r128";
  // ParseKvCodec(Name()) gives the same codec.
  std::string Name() const { return FormatName() + streaming_suffix_; }
  int64_t head_dim() const { return head_dim_; }
  const KvStreaming& streaming() const { return streaming_; }
  // Set by ParseKvCodec from the name's -rN / -sN options (with the suffix
  // they add to Name()).
  void SetStreaming(const KvStreaming& streaming, const std::string& suffix) {
    streaming_ = streaming;
    streaming_suffix_ = suffix;
  }

  // Bytes one row (one token of one KV head) occupies, scales included.
  virtual size_t RowBytes() const = 0;
  // llama.cpp's cache types rotate by default (kv/codec_ggml.h): the block
  // size B of the orthonormal Walsh-Hadamard matrix (Sylvester H_B / sqrt(B),
  // no signs, on each B consecutive values of a row) the cache applies to K
  // rows and q (is_v false) or to V rows and, undoing it, to the attention
  // output (is_v true), before Encode. 0: none.
  virtual int64_t RotationBlock(bool /*is_v*/) const { return 0; }
  // A dense orthogonal rotation M of this (layer, K/V, KV head), row-major
  // [head_dim, head_dim] (OSCAR's calibrated rotations, codec_oscar.cc): the
  // cache stores M x for every row (after --kv-rotate's R and RotationBlock),
  // rotates the query heads of this KV head by the K codec's M (scores are
  // unchanged) and maps the attention output back by the V codec's Mᵀ, once
  // per Attend. nullptr: none. Fixed once the codec is calibrated.
  virtual const float* RotationMatrix() const { return nullptr; }
  // Bytes of per-(layer, K/V, head) side data (e.g. an fp8 scale) that is not
  // part of any row. Counted once per cache by the planner.
  virtual size_t SideBytes() const { return 0; }

  // Codecs with a per-head parameter (fp8's scale) set it from the first rows
  // they are given; the first call wins and later calls are ignored, so a
  // cache may call it before every Encode. x: [n, head_dim].
  virtual bool NeedsCalibration() const { return false; }
  virtual void Calibrate(const float* /*x*/, int64_t /*n*/) {}

  // Codecs built from offline calibration (KVQuant's non-uniform codebooks
  // and per-channel key scales, codec_nuq.cc) need a calibration file: the
  // cache loads it once (KvCacheOptions::calibration_path) and hands every
  // instance its (layer, KV head, K or V) share before the first Encode.
  // Errors name what the file lacks.
  virtual bool NeedsCalibrationFile() const { return false; }
  virtual Status SetCalibration(const KvCalibration& /*calibration*/, int64_t /*layer*/,
                                int64_t /*head*/, bool /*is_v*/) {
    return Status::Ok();
  }

  // x: [n, head_dim] -> rows: n * RowBytes() bytes. Tile codecs
  // (streaming().tile_tokens > 1) take whole tiles: n % tile_tokens == 0,
  // `rows` at a tile start; Decode, Scores and AccumulateV then accept any
  // prefix of encoded tiles.
  virtual void Encode(const float* x, int64_t n, uint8_t* rows) const = 0;
  // rows -> x: [n, head_dim]. Exact (no rounding beyond the format's own), so
  // the SIMD and reference paths agree bit for bit.
  virtual void Decode(const uint8_t* rows, int64_t n, float* x) const = 0;

  // Fused K side. q: [group, head_dim] (the query heads sharing this KV head).
  // scores[h * stride + t] = scale * dot(q[h], row t), t < n, h < group.
  // Integer codecs first quantize q[h] to int8 per group of their group size
  // (llama.cpp's q8_0 for q4_0 keys) and use exact integer dot products, so
  // their scores are dot(q8 dequantized, row t): within sum |q8 step / 2 *
  // x| of the f32-q value (kv/codec_int_scores.h states the rule and bound).
  virtual void Scores(const uint8_t* rows, int64_t n, const float* q, int64_t group, float scale,
                      float* scores, int64_t stride) const = 0;
  // The same scores with the query's per-call preparation hoisted out: a
  // cache calls PrepareQuery once per attention call (prepared: an opaque
  // buffer of PreparedQueryBytes(group) bytes) and ScoresPrepared for every
  // block, which equals Scores(rows, n, q, ...) bit for bit. Integer codecs
  // quantize q there (per block it costs as much as 16 rows of dots);
  // others prepare nothing and ScoresPrepared is Scores.
  virtual size_t PreparedQueryBytes(int64_t /*group*/) const { return 0; }
  virtual void PrepareQuery(const float* /*q*/, int64_t /*group*/, uint8_t* /*prepared*/) const {}
  virtual void ScoresPrepared(const uint8_t* rows, int64_t n, const float* q,
                              const uint8_t* /*prepared*/, int64_t group, float scale,
                              float* scores, int64_t stride) const {
    Scores(rows, n, q, group, scale, scores, stride);
  }
  // Fused V side. acc: [group, head_dim];
  // acc[h] += sum over t < n of p[h * stride + t] * row t.
  virtual void AccumulateV(const uint8_t* rows, int64_t n, const float* p, int64_t group,
                           int64_t stride, float* acc) const = 0;

 protected:
  explicit KvCodec(int64_t head_dim) : head_dim_(head_dim) {}
  // The name of the stored format without streaming options.
  virtual std::string FormatName() const = 0;
  int64_t head_dim_;
  KvStreaming streaming_;
  std::string streaming_suffix_;
};

// A codec that stores another codec's rows (`inner`) and reads them with the
// inner codec's decode and fused kernels; what differs is the name, how rows
// are written (OSCAR's clipped codes) or the flush rule (HF quanto).
class ForwardingKvCodec : public KvCodec {
 public:
  size_t RowBytes() const override { return inner_->RowBytes(); }
  size_t SideBytes() const override { return inner_->SideBytes(); }
  void Encode(const float* x, int64_t n, uint8_t* rows) const override {
    inner_->Encode(x, n, rows);
  }
  void Decode(const uint8_t* rows, int64_t n, float* x) const override {
    inner_->Decode(rows, n, x);
  }
  void Scores(const uint8_t* rows, int64_t n, const float* q, int64_t group, float scale,
              float* scores, int64_t stride) const override {
    inner_->Scores(rows, n, q, group, scale, scores, stride);
  }
  size_t PreparedQueryBytes(int64_t group) const override {
    return inner_->PreparedQueryBytes(group);
  }
  void PrepareQuery(const float* q, int64_t group, uint8_t* prepared) const override {
    inner_->PrepareQuery(q, group, prepared);
  }
  void ScoresPrepared(const uint8_t* rows, int64_t n, const float* q, const uint8_t* prepared,
                      int64_t group, float scale, float* scores, int64_t stride) const override {
    inner_->ScoresPrepared(rows, n, q, prepared, group, scale, scores, stride);
  }
  void AccumulateV(const uint8_t* rows, int64_t n, const float* p, int64_t group, int64_t stride,
                   float* acc) const override {
    inner_->AccumulateV(rows, n, p, group, stride, acc);
  }

 protected:
  ForwardingKvCodec(int64_t head_dim, std::unique_ptr<KvCodec> inner)
      : KvCodec(head_dim), inner_(std::move(inner)) {}
  const KvCodec& inner() const { return *inner_; }

 private:
  std::unique_ptr<KvCodec> inner_;
};

// Which implementation a codec's methods run: the Highway SIMD kernels
// (runtime dispatch) or the plain scalar reference twins (double
// accumulation), which tests compare them against.
enum class CodecPath { kSimd, kReference };

// "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "int2",
// with integer options as suffixes in any order: "int4-g64", "int4-sym",
// "int8-g128-sym" (defaults: group 32, asymmetric); "-cG" instead of "-gG"
// quantizes per channel over tiles of G tokens (KIVI's keys: "int2-c32").
// Streaming options for any codec: "-rN" residual of N f16 tokens (see
// KvStreaming; per-channel codecs need N a multiple of G), "-sN" the first N
// tokens kept in f16. Errors name the choices and reject a group size that
// does not divide head_dim.
StatusOr<std::unique_ptr<KvCodec>> ParseKvCodec(const std::string& name, int64_t head_dim,
                                                CodecPath path = CodecPath::kSimd);

// Canonical names of every per-token codec valid for head_dim (tests, `kvq plan`).
std::vector<std::string> AllKvCodecNames(int64_t head_dim);
// Per-channel codecs and a sample of streaming options (-r, -s, -prerope)
// valid for head_dim: the tile and streaming tests iterate these.
std::vector<std::string> AllKvStreamingCodecNames(int64_t head_dim);

}  // namespace kvq
