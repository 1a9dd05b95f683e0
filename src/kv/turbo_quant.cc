// The TurboQuant / QJL codec (layouts and sources: codec_turbo.cc). One
// class serves the four kinds; a row decodes to
//   x^ = R^T (y + f * S^T s)   (kMse: f = 0; kQjl: no R and y = 0;
//                               kUniform: x^ = u * scale + min, no R),
// where y = stored norm * Lloyd-Max levels (rotated domain), s the stored
// signs (+-1) and f = norm * gamma * sqrt(pi/2) / m.
//
// Fused kernels: the query is prepared once per attention call as
// [R q | S R q] per head (kQjl: [S q]); the SIMD kernels
// (kv/turbo_kernels.cc, runtime dispatch) read each row as the matching f32
// vector [y | f s], decoded a register at a time by table lookups of the
// levels, so q . x^ = (R q) . y + f (S R q) . s is computed without
// unrotating rows or storing an expanded copy.
// Values accumulate in the rotated (and sketch) domain per call and are
// mapped back once per call: acc += R^T (a_y + S^T a_s).
// The reference path decodes each row in double (Decode, the same on both
// paths, so decoded values agree bit for bit) and accumulates in double.
#include "kv/turbo_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/fp16.h"
#include "kv/codec_formats.h"
#include "kv/hadamard.h"

namespace kvq::codec {
namespace {

constexpr double kSqrtHalfPi = 1.2533141373155003;      // sqrt(pi / 2)
constexpr int64_t kHeadsPerPass = 8;                    // AccumulateV's rotated accumulators
constexpr int64_t kMaxExpanded = 3 * kTurboMaxHeadDim;  // d + m with m <= 2d

uint64_t Mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double Density(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }

// In-place unnormalized Walsh-Hadamard transform in double.
void FwhtDouble(double* x, int64_t dim) {
  for (int64_t h = 1; h < dim; h *= 2) {
    for (int64_t block = 0; block < dim; block += 2 * h) {
      for (int64_t j = block; j < block + h; ++j) {
        const double a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

// f16 bits of v, saturating at +-65504 (NaN stays NaN).
uint16_t SaturatingHalf(double v) {
  if (std::isnan(v)) return F32ToF16(std::numeric_limits<float>::quiet_NaN());
  return F32ToF16(static_cast<float>(std::clamp(v, -65504.0, 65504.0)));
}
float HalfAt(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return F16ToF32(bits);
}
void PutHalf(uint16_t bits, uint8_t* p) { std::memcpy(p, &bits, 2); }

// Little-endian bit stream: `width` bits of v at bit `pos`.
void PutBits(uint8_t* p, int64_t pos, int width, uint32_t v) {
  for (int b = 0; b < width; ++b, ++pos) {
    if ((v >> b) & 1u) p[pos >> 3] = static_cast<uint8_t>(p[pos >> 3] | (1u << (pos & 7)));
  }
}
// Codes are at most 4 bits wide, so one spans at most two bytes; the byte
// after the last code is the row's norm, so the two-byte read stays inside.
uint32_t GetBits(const uint8_t* p, int64_t pos, int width) {
  const uint32_t two = p[pos >> 3] | (static_cast<uint32_t>(p[(pos >> 3) + 1]) << 8);
  return (two >> (pos & 7)) & ((1u << width) - 1);
}

// Calls fn(k, code) for `count` codes of one width (count a multiple of 8)
// packed from byte p: every 8 codes fill `width` whole bytes, so the fused
// kernels unpack a byte group at a time instead of bit by bit.
template <class F>
void ForEachCode(const uint8_t* p, int width, int64_t count, const F& fn) {
  const uint64_t mask = (uint64_t{1} << width) - 1;
  for (int64_t k = 0; k < count; k += 8, p += width) {
    uint64_t bits = 0;
    for (int b = 0; b < width; ++b) bits |= static_cast<uint64_t>(p[b]) << (8 * b);
    for (int c = 0; c < 8; ++c) fn(k + c, static_cast<uint32_t>((bits >> (width * c)) & mask));
  }
}

// +-1 for the 8 sign bits of every byte (bit k set: entry k is -1).
struct SignTable {
  float v[256][8];
};
constexpr SignTable MakeSignTable() {
  SignTable t{};
  for (int b = 0; b < 256; ++b) {
    for (int k = 0; k < 8; ++k) t.v[b][k] = (b >> k) & 1 ? -1.0f : 1.0f;
  }
  return t;
}
constexpr SignTable kSignTable = MakeSignTable();

// A run of coordinates coded with one width, starting on a byte.
struct CodeSegment {
  int64_t first, count;
  int width;
  size_t byte;
};

class TurboCodec final : public KvCodec {
 public:
  TurboCodec(const TurboFormat& f, int64_t dim, CodecPath path) : KvCodec(dim), f_(f), path_(path) {
    rotated_ = f.kind == TurboKind::kMse || f.kind == TurboKind::kProd;
    sketch_rows_ = f.kind == TurboKind::kProd  ? dim
                   : f.kind == TurboKind::kQjl ? dim * f.sketch_multiple
                                               : 0;
    y_dim_ = f.kind == TurboKind::kQjl ? 0 : dim;
    expanded_ = y_dim_ + sketch_rows_;
    SetUpCodes();
    for (int64_t i = 0; i < dim && rotated_; ++i) signs_.push_back(TurboSign(f.seed, i));
    if (sketch_rows_ > 0) sketch_ = TurboSketch(f.seed, sketch_rows_, dim);
    // Sketch bytes, then the f16 norm (and gamma) after the codes.
    sketch_offset_ = code_bytes_;
    norm_offset_ = sketch_offset_ + static_cast<size_t>(sketch_rows_ / 8);
    const size_t tail = f.kind == TurboKind::kMse || f.kind == TurboKind::kQjl ? 2 : 4;
    row_bytes_ = (norm_offset_ + tail + 3) / 4 * 4;
    SetUpLayout();
  }

  std::string FormatName() const override { return f_.Name(); }
  size_t RowBytes() const override { return row_bytes_; }
  // The tables every instance holds: sketch, rotation signs, levels.
  size_t SideBytes() const override {
    size_t levels = 0;
    for (const auto& l : levels_) levels += l.size();
    return sizeof(float) * (sketch_.size() + signs_.size() + levels);
  }

  void Encode(const float* x, int64_t n, uint8_t* rows) const override {
    double u[kTurboMaxHeadDim], y[kTurboMaxHeadDim];  // on the stack: appends allocate nothing
    for (int64_t t = 0; t < n; ++t) {
      uint8_t* row = rows + t * row_bytes_;
      std::memset(row, 0, row_bytes_);
      if (f_.kind == TurboKind::kUniform) {
        EncodeUniform(x + t * head_dim_, row);
      } else {
        EncodeRow(x + t * head_dim_, u, y, row);
      }
    }
  }

  void Decode(const uint8_t* rows, int64_t n, float* x) const override {
    std::vector<double> y(static_cast<size_t>(head_dim_)), out(y.size());  // [head_dim] each
    for (int64_t t = 0; t < n; ++t) {
      const uint8_t* row = rows + t * row_bytes_;
      float* xr = x + t * head_dim_;
      if (f_.kind == TurboKind::kUniform) {
        ExpandUniform(row, xr);
        continue;
      }
      std::fill(y.begin(), y.end(), 0.0);
      if (y_dim_ > 0) {
        const double norm = HalfAt(row + norm_offset_);
        for (int64_t i = 0; i < head_dim_; ++i) y[i] = norm * LevelOf(row, i);
      }
      if (sketch_rows_ > 0) {
        const double factor = SketchFactor(row);
        for (int64_t j = 0; j < sketch_rows_; ++j) {
          const double s = SignOf(row, j) * factor;
          for (int64_t i = 0; i < head_dim_; ++i) y[i] += s * sketch_[j * head_dim_ + i];
        }
      }
      if (rotated_) {
        TurboUnrotateRef(f_.seed, head_dim_, y.data(), out.data());
      } else {
        out = y;
      }
      for (int64_t i = 0; i < head_dim_; ++i) xr[i] = static_cast<float>(out[i]);
    }
  }

  size_t PreparedQueryBytes(int64_t group) const override {
    return path_ == CodecPath::kSimd && f_.kind != TurboKind::kUniform
               ? sizeof(float) * static_cast<size_t>(group * expanded_)
               : 0;
  }

  // prepared: [group, expanded_] floats, [R q | S R q] (kQjl: [S q]).
  void PrepareQuery(const float* q, int64_t group, uint8_t* prepared) const override {
    if (PreparedQueryBytes(group) == 0) return;
    float* out = reinterpret_cast<float*>(prepared);
    float rotated[kHeadsPerPass * kTurboMaxHeadDim];  // [heads, head_dim]
    for (int64_t h0 = 0; h0 < group; h0 += kHeadsPerPass) {
      const int64_t heads = std::min(kHeadsPerPass, group - h0);
      const float* qp = q + h0 * head_dim_;
      if (rotated_) {
        for (int64_t k = 0; k < heads * head_dim_; ++k) {
          rotated[k] = qp[k] * signs_[k % head_dim_];
        }
        (void)HadamardRotate(rotated, heads, head_dim_);  // head_dim checked at Make
      }
      for (int64_t h = 0; h < heads; ++h) {
        const float* src = rotated_ ? rotated + h * head_dim_ : qp + h * head_dim_;
        float* oh = out + (h0 + h) * expanded_;
        if (y_dim_ > 0) std::memcpy(oh, src, sizeof(float) * static_cast<size_t>(head_dim_));
        float* sq = oh + y_dim_;
        for (int64_t j = 0; j < sketch_rows_; ++j) {
          const float* sj = sketch_.data() + j * head_dim_;
          float sum = 0.0f;
          for (int64_t i = 0; i < head_dim_; ++i) sum += sj[i] * src[i];
          sq[j] = sum;
        }
      }
    }
  }

  void Scores(const uint8_t* rows, int64_t n, const float* q, int64_t group, float scale,
              float* scores, int64_t stride) const override {
    if (path_ == CodecPath::kReference) {
      return ScoresByDecoding(*this, rows, n, q, group, scale, scores, stride);
    }
    std::vector<uint8_t> prepared(PreparedQueryBytes(group));
    PrepareQuery(q, group, prepared.data());
    ScoresPrepared(rows, n, q, prepared.data(), group, scale, scores, stride);
  }

  void ScoresPrepared(const uint8_t* rows, int64_t n, const float* q, const uint8_t* prepared,
                      int64_t group, float scale, float* scores, int64_t stride) const override {
    if (path_ == CodecPath::kReference) return Scores(rows, n, q, group, scale, scores, stride);
    const float* query =
        f_.kind == TurboKind::kUniform ? q : reinterpret_cast<const float*>(prepared);
    TurboScores(layout_, rows, n, query, group, scale, scores, stride);
  }

  void AccumulateV(const uint8_t* rows, int64_t n, const float* p, int64_t group, int64_t stride,
                   float* acc) const override {
    if (path_ == CodecPath::kReference) {
      return AccumulateVByDecoding(*this, rows, n, p, group, stride, acc);
    }
    if (f_.kind == TurboKind::kUniform) {  // rows are values: straight into acc
      return TurboAccumulate(layout_, rows, n, p, group, stride, acc);
    }
    alignas(64) float domain[kHeadsPerPass * kMaxExpanded];  // [heads, expanded_]
    for (int64_t h0 = 0; h0 < group; h0 += kHeadsPerPass) {
      const int64_t heads = std::min(kHeadsPerPass, group - h0);
      std::fill(domain, domain + heads * expanded_, 0.0f);
      TurboAccumulate(layout_, rows, n, p + h0 * stride, heads, stride, domain);
      MapBack(domain, heads, acc + h0 * head_dim_);
    }
  }

  std::vector<float> ExpandRows(const uint8_t* rows, int64_t n, bool simd) const {
    std::vector<float> out(static_cast<size_t>(n * expanded_));
    if (simd) {
      TurboDecodeExpanded(layout_, rows, n, out.data());
    } else {
      for (int64_t t = 0; t < n; ++t) Expand(rows + t * row_bytes_, out.data() + t * expanded_);
    }
    return out;
  }

  TurboRowParts Parts(const uint8_t* row) const {
    TurboRowParts parts;
    float expanded[kMaxExpanded];
    Expand(row, expanded);
    double y2 = 0;
    const int64_t y_len = f_.kind == TurboKind::kUniform ? head_dim_ : y_dim_;
    for (int64_t i = 0; i < y_len; ++i) y2 += static_cast<double>(expanded[i]) * expanded[i];
    parts.y_norm = std::sqrt(y2);
    parts.sketch_rows = sketch_rows_;
    parts.rotated = rotated_;
    if (sketch_rows_ > 0) {
      parts.sketch_factor = SketchFactor(row);
      double s2 = 0;
      for (float v : sketch_) s2 += static_cast<double>(v) * v;
      parts.sketch_frobenius = std::sqrt(s2);
    }
    return parts;
  }

 private:
  // Bits per coordinate, code offsets and each width's levels / midpoints.
  void SetUpCodes() {
    const int mse10 = f_.kind == TurboKind::kQjl ? 0 : f_.MseBits10();
    const int lo = mse10 / 10, hi = (mse10 + 9) / 10;
    levels_.resize(5);
    midpoints_.resize(5);
    int64_t pos = 0;
    for (int64_t i = 0; i < head_dim_ && mse10 > 0; ++i) {
      const int bits = f_.kind == TurboKind::kUniform ? lo : (i < head_dim_ / 2 ? hi : lo);
      bits_.push_back(bits);
      offsets_.push_back(pos);
      pos += bits;
    }
    code_bytes_ = static_cast<size_t>((pos + 7) / 8);
    for (int64_t i = 0; i < static_cast<int64_t>(bits_.size()); ++i) {
      if (i == 0 || bits_[i] != bits_[i - 1]) {
        segments_.push_back({i, 0, bits_[i], static_cast<size_t>(offsets_[i] / 8)});
      }
      ++segments_.back().count;
    }
    if (f_.kind == TurboKind::kUniform || mse10 == 0) return;
    const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(head_dim_));
    for (int bits : {lo, hi}) {
      if (!levels_[bits].empty()) continue;
      for (double level : GaussianLloydMax(bits)) {
        levels_[bits].push_back(static_cast<float>(level * inv_sqrt_d));
      }
      for (size_t j = 0; j + 1 < levels_[bits].size(); ++j) {
        midpoints_[bits].push_back(0.5 *
                                   (static_cast<double>(levels_[bits][j]) + levels_[bits][j + 1]));
      }
    }
  }

  // The SIMD kernels' view of the same layout (kv/turbo_kernels.cc).
  void SetUpLayout() {
    TurboKernelLayout& L = layout_;
    L.head_dim = head_dim_;
    L.y_dim = y_dim_;
    L.expanded = expanded_;
    L.sketch_rows = sketch_rows_;
    L.row_bytes = row_bytes_;
    L.sketch_offset = sketch_offset_;
    L.norm_offset = norm_offset_;
    L.uniform = f_.kind == TurboKind::kUniform;
    L.has_gamma = f_.kind == TurboKind::kProd;
    L.num_segments = static_cast<int>(segments_.size());
    L.min_segment = y_dim_ > 0 ? y_dim_ : sketch_rows_;
    for (size_t s = 0; s < segments_.size() && s < 2; ++s) {
      L.seg_first[s] = segments_[s].first;
      L.seg_width[s] = segments_[s].width;
      L.seg_byte[s] = segments_[s].byte;
      L.min_segment = std::min(L.min_segment, segments_[s].count);
    }
    for (int w = 1; w <= 4; ++w) {
      if (levels_[w].empty()) continue;
      levels16_[w] = levels_[w];
      levels16_[w].resize(16, levels_[w].back());
      L.levels[w] = levels16_[w].data();
    }
  }

  float LevelOf(const uint8_t* row, int64_t i) const {
    const int bits = bits_[i];
    return levels_[bits][GetBits(row, offsets_[i], bits)];
  }
  double SignOf(const uint8_t* row, int64_t j) const {
    return (row[sketch_offset_ + (j >> 3)] >> (j & 7)) & 1 ? -1.0 : 1.0;
  }
  // f = norm * gamma * sqrt(pi/2) / m, from the stored f16 pair.
  double SketchFactor(const uint8_t* row) const {
    const double norm = HalfAt(row + norm_offset_);
    const double gamma = f_.kind == TurboKind::kProd ? HalfAt(row + norm_offset_ + 2) : 1.0;
    return norm * gamma * kSqrtHalfPi / static_cast<double>(sketch_rows_);
  }

  // One row -> [y | f s] in f32 (the fused kernels' view of it).
  void Expand(const uint8_t* row, float* out) const {
    if (f_.kind == TurboKind::kUniform) return ExpandUniform(row, out);
    if (y_dim_ > 0) {
      const float norm = HalfAt(row + norm_offset_);
      for (const CodeSegment& g : segments_) {
        const float* table = levels_[g.width].data();
        float* o = out + g.first;
        ForEachCode(row + g.byte, g.width, g.count,
                    [&](int64_t k, uint32_t code) { o[k] = norm * table[code]; });
      }
    }
    if (sketch_rows_ > 0) {
      const float factor = static_cast<float>(SketchFactor(row));
      float* s = out + y_dim_;
      const uint8_t* bytes = row + sketch_offset_;
      for (int64_t j = 0; j < sketch_rows_; j += 8) {
        const float* signs = kSignTable.v[bytes[j >> 3]];
        for (int k = 0; k < 8; ++k) s[j + k] = factor * signs[k];
      }
    }
  }

  // acc[h] += R^T (a_y + S^T a_s) for h < heads (<= kHeadsPerPass); a:
  // [heads, expanded_]. One unrotation call for all heads of a pass.
  void MapBack(const float* a, int64_t heads, float* acc) const {
    float z[kHeadsPerPass * kTurboMaxHeadDim];  // [heads, head_dim]
    for (int64_t h = 0; h < heads; ++h) {
      const float* ah = a + h * expanded_;
      float* zh = z + h * head_dim_;
      for (int64_t i = 0; i < head_dim_; ++i) zh[i] = y_dim_ > 0 ? ah[i] : 0.0f;
      for (int64_t j = 0; j < sketch_rows_; ++j) {
        const float w = ah[y_dim_ + j];
        const float* sj = sketch_.data() + j * head_dim_;
        for (int64_t i = 0; i < head_dim_; ++i) zh[i] += w * sj[i];
      }
    }
    if (rotated_) (void)HadamardUnrotate(z, heads, head_dim_);  // head_dim checked at Make
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < head_dim_; ++i) {
        acc[h * head_dim_ + i] +=
            rotated_ ? z[h * head_dim_ + i] * signs_[i] : z[h * head_dim_ + i];
      }
    }
  }

  // ---- encoding (one scalar version for both paths, in double) ----
  void EncodeRow(const float* x, double* u, double* y, uint8_t* row) const {
    double sum = 0;
    for (int64_t i = 0; i < head_dim_; ++i) sum += static_cast<double>(x[i]) * x[i];
    const double norm = std::sqrt(sum);
    if (!std::isfinite(norm)) {  // the row decodes to NaN, as f16 would carry it
      PutHalf(SaturatingHalf(std::numeric_limits<double>::quiet_NaN()), row + norm_offset_);
      return;
    }
    if (norm == 0.0) return;  // all zero: norm 0 decodes to exact zeros
    for (int64_t i = 0; i < head_dim_; ++i) u[i] = x[i] / norm;
    if (rotated_) {
      TurboRotateRef(f_.seed, head_dim_, u, y);
    } else {
      std::copy(u, u + head_dim_, y);
    }
    double stored = norm;
    if (y_dim_ > 0) {
      double c2 = 0;
      for (int64_t i = 0; i < head_dim_; ++i) {
        const int bits = bits_[i];
        const std::vector<double>& mid = midpoints_[bits];
        uint32_t code = 0;
        while (code < mid.size() && y[i] > mid[code]) ++code;  // ties go down
        PutBits(row, offsets_[i], bits, code);
        const double c = levels_[bits][code];
        c2 += c * c;
        y[i] -= c;  // y is now the residual r
      }
      // -nc: the centroid vector rescaled to unit length (vLLM's norm
      // correction), folded into the stored norm.
      if (f_.norm_correction) stored = norm / std::sqrt(c2);
    }
    PutHalf(SaturatingHalf(stored), row + norm_offset_);
    if (sketch_rows_ == 0) return;
    if (f_.kind == TurboKind::kProd) {
      double gamma2 = 0;
      for (int64_t i = 0; i < head_dim_; ++i) gamma2 += y[i] * y[i];
      PutHalf(SaturatingHalf(std::sqrt(gamma2)), row + norm_offset_ + 2);
    }
    for (int64_t j = 0; j < sketch_rows_; ++j) {
      double dot = 0;
      const float* sj = sketch_.data() + j * head_dim_;
      for (int64_t i = 0; i < head_dim_; ++i) dot += sj[i] * y[i];
      if (dot < 0) row[sketch_offset_ + (j >> 3)] |= static_cast<uint8_t>(1u << (j & 7));
    }
  }

  // vLLM's value format: the whole row, scale = (max - min) / (2^b - 1), f16
  // scale and min after the codes, nearest level (ties to even).
  void EncodeUniform(const float* x, uint8_t* row) const {
    float lo = x[0], hi = x[0];
    bool finite = true;
    for (int64_t i = 0; i < head_dim_; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
      finite = finite && std::isfinite(x[i]);
    }
    if (!finite) {  // NaN scale: the row decodes to NaN, as the others do
      PutHalf(SaturatingHalf(std::numeric_limits<double>::quiet_NaN()), row + norm_offset_);
      return;
    }
    const int bits = bits_[0];
    const double top = static_cast<double>((1 << bits) - 1);
    const uint16_t scale_bits = SaturatingHalf((static_cast<double>(hi) - lo) / top);
    const uint16_t min_bits = SaturatingHalf(lo);
    const double scale = F16ToF32(scale_bits), min = F16ToF32(min_bits);
    const double inv = scale > 0 && std::isfinite(scale) ? 1.0 / scale : 0.0;
    for (int64_t i = 0; i < head_dim_; ++i) {
      double v = std::nearbyint((x[i] - min) * inv);
      if (!(v >= 0)) v = 0;  // also NaN
      PutBits(row, offsets_[i], bits, static_cast<uint32_t>(std::min(v, top)));
    }
    PutHalf(scale_bits, row + norm_offset_);
    PutHalf(min_bits, row + norm_offset_ + 2);
  }

  void ExpandUniform(const uint8_t* row, float* x) const {
    const float scale = HalfAt(row + norm_offset_), min = HalfAt(row + norm_offset_ + 2);
    // One rounding (fma), as the SIMD kernels' fused multiply-add.
    ForEachCode(row, bits_[0], head_dim_,
                [&](int64_t i, uint32_t u) { x[i] = std::fma(static_cast<float>(u), scale, min); });
  }

  TurboFormat f_;
  CodecPath path_;
  bool rotated_ = false;
  int64_t sketch_rows_ = 0, y_dim_ = 0, expanded_ = 0;
  std::vector<int> bits_;                       // [head_dim] code width per coordinate
  std::vector<int64_t> offsets_;                // [head_dim] bit offset of each code
  std::vector<CodeSegment> segments_;           // the same, by runs of one width
  std::vector<std::vector<float>> levels_;      // by width: Lloyd-Max levels / sqrt(d)
  std::vector<std::vector<double>> midpoints_;  // by width
  std::vector<float> signs_;                    // [head_dim] D_seed
  std::vector<float> sketch_;                   // [sketch_rows, head_dim]
  size_t code_bytes_ = 0, sketch_offset_ = 0, norm_offset_ = 0, row_bytes_ = 0;
  std::vector<float> levels16_[5];  // by width: levels_ padded to 16 (SIMD table lookups)
  TurboKernelLayout layout_;
};

}  // namespace

std::vector<double> GaussianLloydMax(int bits) {
  const int count = 1 << bits;
  std::vector<double> c(static_cast<size_t>(count)), next(c.size());
  for (int j = 0; j < count; ++j) c[j] = -3.0 + 6.0 * (j + 0.5) / count;
  for (int iter = 0; iter < 200000; ++iter) {
    double moved = 0;
    for (int j = 0; j < count; ++j) {
      const double a = j == 0 ? -INFINITY : 0.5 * (c[j - 1] + c[j]);
      const double b = j == count - 1 ? INFINITY : 0.5 * (c[j] + c[j + 1]);
      // Mean of N(0, 1) on (a, b): (phi(a) - phi(b)) / (Phi(b) - Phi(a)).
      const double pa = std::isinf(a) ? 0.0 : Density(a), pb = std::isinf(b) ? 0.0 : Density(b);
      next[j] = (pa - pb) / (Phi(b) - Phi(a));
      moved = std::max(moved, std::fabs(next[j] - c[j]));
    }
    c = next;
    if (moved < 1e-13) break;
  }
  return c;
}

double GaussianLloydMaxMse(const std::vector<double>& levels) {
  // E[(X - c)^2] over a cell (a, b) = E[X^2] - 2 c E[X] + c^2 P, with
  // E[X^2 1(a,b)] = P + a phi(a) - b phi(b).
  double mse = 0;
  const size_t count = levels.size();
  for (size_t j = 0; j < count; ++j) {
    const double a = j == 0 ? -INFINITY : 0.5 * (levels[j - 1] + levels[j]);
    const double b = j + 1 == count ? INFINITY : 0.5 * (levels[j] + levels[j + 1]);
    const double pa = std::isinf(a) ? 0.0 : Density(a), pb = std::isinf(b) ? 0.0 : Density(b);
    const double p = Phi(b) - Phi(a);
    const double ex = pa - pb;
    const double ex2 = p + (std::isinf(a) ? 0.0 : a * pa) - (std::isinf(b) ? 0.0 : b * pb);
    mse += ex2 - 2 * levels[j] * ex + levels[j] * levels[j] * p;
  }
  return mse;
}

float TurboSign(uint64_t seed, int64_t i) {
  return (Mix(Mix(seed ^ 0x54757262ull) + static_cast<uint64_t>(i)) >> 63) ? -1.0f : 1.0f;
}

void TurboRotateRef(uint64_t seed, int64_t dim, const double* x, double* y) {
  for (int64_t i = 0; i < dim; ++i) y[i] = x[i] * TurboSign(seed, i) * HadamardSign(i);
  FwhtDouble(y, dim);
  const double norm = 1.0 / std::sqrt(static_cast<double>(dim));
  for (int64_t i = 0; i < dim; ++i) y[i] *= norm;
}

void TurboUnrotateRef(uint64_t seed, int64_t dim, const double* y, double* x) {
  std::copy(y, y + dim, x);
  FwhtDouble(x, dim);
  const double norm = 1.0 / std::sqrt(static_cast<double>(dim));
  for (int64_t i = 0; i < dim; ++i) x[i] *= norm * TurboSign(seed, i) * HadamardSign(i);
}

std::vector<float> TurboSketch(uint64_t seed, int64_t rows, int64_t dim) {
  std::vector<float> s(static_cast<size_t>(rows * dim));
  const uint64_t base = Mix(seed ^ 0x514A4Cull);
  for (size_t k = 0; k < s.size(); k += 2) {
    // Box-Muller on two 53-bit uniforms in (0, 1].
    const double u1 = (static_cast<double>(Mix(base + 2 * k) >> 11) + 1.0) * 0x1p-53;
    const double u2 = static_cast<double>(Mix(base + 2 * k + 1) >> 11) * 0x1p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    s[k] = static_cast<float>(r * std::cos(2.0 * M_PI * u2));
    if (k + 1 < s.size()) s[k + 1] = static_cast<float>(r * std::sin(2.0 * M_PI * u2));
  }
  return s;
}

StatusOr<TurboRowParts> TurboDecodeParts(const KvCodec& codec, const uint8_t* row) {
  const auto* turbo = dynamic_cast<const TurboCodec*>(&codec);
  if (turbo == nullptr) return Status::Error(codec.Name() + " is not a TurboQuant/QJL codec");
  return turbo->Parts(row);
}

StatusOr<std::vector<float>> TurboExpandRows(const KvCodec& codec, const uint8_t* rows, int64_t n,
                                             bool simd) {
  const auto* turbo = dynamic_cast<const TurboCodec*>(&codec);
  if (turbo == nullptr) return Status::Error(codec.Name() + " is not a TurboQuant/QJL codec");
  return turbo->ExpandRows(rows, n, simd);
}

StatusOr<std::unique_ptr<KvCodec>> MakeTurboCodec(const TurboFormat& format, int64_t head_dim,
                                                  CodecPath path) {
  if (head_dim < 16 || head_dim > kTurboMaxHeadDim || (head_dim & (head_dim - 1)) != 0) {
    return Status::Error("KV cache type '" + format.Name() +
                         "': TurboQuant/QJL codecs need head_dim a power of two from 16 to " +
                         std::to_string(kTurboMaxHeadDim) + " (head_dim " +
                         std::to_string(head_dim) + ")");
  }
  return std::unique_ptr<KvCodec>(std::make_unique<TurboCodec>(format, head_dim, path));
}

}  // namespace kvq::codec
