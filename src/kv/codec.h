// How one KV head's rows are stored inside a cache block, and the fused
// kernels that read them back. A codec sees a *tile*: up to `tile_tokens`
// consecutive tokens of one (layer, K-or-V, KV head), head_dim values each.
// Per-token codecs (f16, fp8, intN) encode each row independently; a codec
// that needs a whole tile at once (per-channel schemes) can still implement
// this interface because the cache hands it the whole tile every time.
//
// Attention never materializes an f32 copy of the cache: it calls Scores on K
// tiles and AccumulateV on V tiles, block by block (see paged_cache.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace kvq {

class KvCodec {
 public:
  virtual ~KvCodec() = default;

  // Canonical name, e.g. "int4-g32-asym"; ParseKvCodec(Name()) gives the same codec.
  virtual std::string Name() const = 0;
  int64_t head_dim() const { return head_dim_; }

  // Bytes one row (one token of one KV head) occupies, scales included.
  virtual size_t RowBytes() const = 0;
  // Bytes of per-(layer, K/V, head) side data (e.g. an fp8 scale) that is not
  // part of any row. Counted once per cache by the planner.
  virtual size_t SideBytes() const { return 0; }

  // Codecs with a per-head parameter (fp8's scale) set it from the first rows
  // they ever see; see each codec's comment. Called once, before Encode.
  virtual bool NeedsCalibration() const { return false; }
  virtual void Calibrate(const float* /*x*/, int64_t /*n*/) {}

  // x: [n, head_dim] -> rows: n * RowBytes() bytes.
  virtual void Encode(const float* x, int64_t n, uint8_t* rows) const = 0;
  // rows -> x: [n, head_dim]. The reference path (tests, study); attention
  // does not call it.
  virtual void Decode(const uint8_t* rows, int64_t n, float* x) const = 0;

  // Fused K side. q: [group, head_dim] (the query heads sharing this KV head).
  // scores[h * stride + t] = scale * dot(q[h], row t), t < n, h < group.
  virtual void Scores(const uint8_t* rows, int64_t n, const float* q, int64_t group, float scale,
                      float* scores, int64_t stride) const = 0;
  // Fused V side. acc: [group, head_dim];
  // acc[h] += sum over t < n of p[h * stride + t] * row t.
  virtual void AccumulateV(const uint8_t* rows, int64_t n, const float* p, int64_t group,
                           int64_t stride, float* acc) const = 0;

 protected:
  explicit KvCodec(int64_t head_dim) : head_dim_(head_dim) {}
  int64_t head_dim_;
};

// "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "int2",
// with integer options as suffixes: "int4-g64", "int4-g32-sym" (defaults:
// group 32, asymmetric). Errors name the choices and reject a group size that
// does not divide head_dim.
StatusOr<std::unique_ptr<KvCodec>> ParseKvCodec(const std::string& name, int64_t head_dim);

}  // namespace kvq
