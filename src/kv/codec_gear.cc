// GEAR (arXiv:2403.05527) as a tile codec: X ~ deq(Q(X - S)) + A B + S per
// tile of T tokens of one KV head (X: [T, d]).
//   Q    KIVI-style base quantizer, asymmetric b bits: per channel over the
//        tile ("-cT", keys) or per token in groups of G channels ("-gG", values).
//   S    sparse outliers, kept exactly (as f16, the cache's precision): a
//        fixed number of slots per tile, ceil(p% * T * d).
//   A B  rank-r approximation of the residual R = X - deq(Q(X)) - S by power
//        (subspace) iteration, A: [T, r], B: [r, d], both f16.
// Names: gear{b}-c{T}-rank{r}-iter{i}-out{p} (per channel) or
//        gear{b}-g{G}-t{T}-rank{r}-iter{i}-out{p} (per token), p in percent
//        with at most one decimal ("out0.5"). Defaults c64, rank 4, iter 3,
//        out 2 (the GEAR repository's buffer, prefill rank, iterations and
//        outlier ratio). The letters avoid the streaming options -rN/-sN.
//
// Outliers are chosen first, greedily: each step removes the extreme (the min
// or the max, with its equal copies) of one base group -- a channel of the
// tile, or a token's channel group -- whichever removal shrinks its group's
// squared range most per slot, i.e. cuts the base grid's expected squared
// error most (every group of a codec has the same number of values). Those positions are then
// quantized as the group's remaining minimum (they no longer stretch the grid), excluded from the
// residual (R = 0 there), and decoded as the stored value.
//
// Power iteration: Q0 [d, r] from a fixed hash of the index (deterministic,
// no state), then `iter` times P = orth(R Q), Q = R^T P (modified
// Gram-Schmidt; directions the residual does not have are dropped, so the
// rank used can be smaller than reserved). Each column a of P is then scaled
// so a and its partner in B have equal largest magnitudes (both fit f16 for
// residuals up to ~4e9), rounded to f16, and B's row is recomputed against
// the rounded a on the residual deflated by the columns already stored, so
// the factors' rounding is absorbed rather than accumulated.
//
// Prefill vs decode rank: GEAR uses rank 4 for the prompt and 2 for each
// decode buffer. A codec here sees only whole tiles (the cache encodes one
// tile per block, whether from a prompt or the 64th decoded token) and the
// tile size is fixed so the block store and planner stay exact: it reserves
// and uses one rank per name. A lower rank saves no bytes once reserved, so
// the default is the prefill rank 4 for every tile; "rank2" names the other.
//
// Tile layout (T tokens, d = head_dim, R reserved rank, S outlier slots):
//   [base: T * base_row bytes, exactly the per-channel tile (codec_channel.cc)
//    or T per-token int rows (codec.h)]
//   [A: T x R f16, row-major][B: R x d f16 (f16 rows)]
//   [S x (u16 index t * d + c, f16 value), ascending index]
//   [u16 rank used][u16 outliers used][zero padding to a multiple of T bytes]
// RowBytes() = tile bytes / T.
//
// Fused kernels per tile: base through the base codec's SIMD kernels, the
// low-rank term as (q B^T) A^T for scores and (p A) B for values (B's rows go
// through the f16 codec's SIMD kernels), outliers as scalar corrections
// q_c (s - base - (AB)_tc). The reference path decodes and accumulates in double.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "base/fp16.h"
#include "kv/codec_formats.h"
#include "kv/codec_registry.h"

namespace kvq::codec {
namespace {

constexpr int64_t kTileSizes[] = {32, 64, 128};
constexpr int kMaxRank = 16, kMaxIterations = 20, kMaxOutlierPermille = 100;

Status BadGear(const std::string& spelled, const std::string& why) {
  return Status::Error(
      "KV cache type '" + spelled + "': " + why +
      " (GEAR: gear2/gear4/gear8 with -cT (per channel over T-token tiles, default c64) or "
      "-gG -tT (per token, groups of G channels, T-token tiles), -rankR (0-16, default 4), "
      "-iterN (1-20, default 3), -outP (outlier percent 0-10, one decimal, default 2))");
}

// Digits after `prefix` ("rank4" -> 4), or -1.
int64_t Number(const std::string& option, const std::string& prefix) {
  if (option.size() <= prefix.size() || option.size() > prefix.size() + 5 ||
      option.compare(0, prefix.size(), prefix) != 0) {
    return -1;
  }
  const std::string digits = option.substr(prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

// "out2" -> 20, "out0.5" -> 5 (per mille), or -1.
int64_t OutlierPermille(const std::string& option) {
  if (option.size() < 4 || option.size() > 8 || option.compare(0, 3, "out") != 0) return -1;
  std::string text = option.substr(3);
  int64_t tenths = 0;
  const size_t dot = text.find('.');
  if (dot != std::string::npos) {
    if (dot + 2 != text.size() || !std::isdigit(static_cast<unsigned char>(text[dot + 1]))) {
      return -1;
    }
    tenths = text[dot + 1] - '0';
    text = text.substr(0, dot);
  }
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(text) * 10 + tenths;
}

bool IsTileSize(int64_t n) {
  return std::find(std::begin(kTileSizes), std::end(kTileSizes), n) != std::end(kTileSizes);
}

// Deterministic start vectors in [-1, 1): a hash of the index (SplitMix64).
double StartValue(uint64_t index) {
  uint64_t z = index + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1p-52 - 1.0;
}

float HalfAt(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return F16ToF32(bits);
}
void StoreHalf(float x, uint8_t* p) {
  const uint16_t bits = F32ToF16(x);
  std::memcpy(p, &bits, 2);
}
uint16_t U16At(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Orthonormalizes the first `cols` columns of p ([rows, stride], column j at
// p[i * stride + j]) by modified Gram-Schmidt, dropping columns left with
// (almost) nothing of their own; returns the columns kept (compacted left).
int Orthonormalize(std::vector<double>& p, int64_t rows, int64_t stride, int cols) {
  int kept = 0;
  for (int j = 0; j < cols; ++j) {
    double before = 0;
    for (int64_t i = 0; i < rows; ++i) before += p[i * stride + j] * p[i * stride + j];
    for (int k = 0; k < kept; ++k) {
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i) dot += p[i * stride + j] * p[i * stride + k];
      for (int64_t i = 0; i < rows; ++i) p[i * stride + j] -= dot * p[i * stride + k];
    }
    double norm = 0;
    for (int64_t i = 0; i < rows; ++i) norm += p[i * stride + j] * p[i * stride + j];
    // A column that lost all but ~1e-12 of its energy to the others is
    // rounding noise, not a direction of the residual.
    if (!(norm > 1e-24 * before) || !(norm > 1e-280)) continue;
    const double inv = 1.0 / std::sqrt(norm);
    for (int64_t i = 0; i < rows; ++i) p[i * stride + kept] = p[i * stride + j] * inv;
    ++kept;
  }
  return kept;
}

class GearCodec final : public KvCodec {
 public:
  GearCodec(const GearFormat& format, int64_t head_dim, CodecPath path,
            std::unique_ptr<KvCodec> base, std::unique_ptr<KvCodec> base_ref,
            std::unique_ptr<KvCodec> factor_rows, std::unique_ptr<KvCodec> f32_ref)
      : KvCodec(head_dim),
        format_(format),
        base_format_(format.Base()),
        path_(path),
        base_(std::move(base)),
        base_ref_(std::move(base_ref)),
        factor_rows_(std::move(factor_rows)),
        f32_ref_(std::move(f32_ref)) {
    const int64_t tile = format.tile_tokens, dim = head_dim;
    slots_ = format.OutlierSlots(dim);
    base_bytes_ = static_cast<size_t>(tile) * base_->RowBytes();
    a_offset_ = base_bytes_;
    b_offset_ = a_offset_ + static_cast<size_t>(tile * format.rank) * 2;
    outlier_offset_ = b_offset_ + static_cast<size_t>(format.rank * dim) * 2;
    header_offset_ = outlier_offset_ + static_cast<size_t>(slots_) * 4;
    tile_bytes_ = (header_offset_ + 4 + tile - 1) / tile * tile;
    streaming_.tile_tokens = tile;
    streaming_.flush_tokens = tile;
  }

  std::string FormatName() const override { return format_.Name(); }
  size_t RowBytes() const override { return tile_bytes_ / format_.tile_tokens; }
  const GearFormat& format() const { return format_; }

  void Encode(const float* x, int64_t n, uint8_t* rows) const override {
    for (int64_t t0 = 0; t0 + format_.tile_tokens <= n; t0 += format_.tile_tokens) {
      EncodeTile(x + t0 * head_dim_, rows + static_cast<size_t>(t0) * RowBytes());
    }
  }

  void Decode(const uint8_t* rows, int64_t n, float* x) const override {
    ForEachTile(rows, n, [&](const uint8_t* tile, int64_t count, int64_t t0) {
      DecodeTile(*base_, tile, count, x + t0 * head_dim_);
    });
  }

  void Scores(const uint8_t* rows, int64_t n, const float* q, int64_t group, float scale,
              float* scores, int64_t stride) const override {
    if (path_ == CodecPath::kReference) {
      std::vector<float> x(static_cast<size_t>(n * head_dim_));  // [n, head_dim]
      Decode(rows, n, x.data());
      return ScoresByDecoding(*f32_ref_, reinterpret_cast<const uint8_t*>(x.data()), n, q, group,
                              scale, scores, stride);
    }
    const int64_t dim = head_dim_, rank = format_.rank;
    std::vector<float> u(
        static_cast<size_t>(group * std::max<int64_t>(rank, 1)));  // [group, rank]: q B^T
    std::vector<float> a(
        static_cast<size_t>(format_.tile_tokens * std::max<int64_t>(rank, 1)));  // [T, r]
    ForEachTile(rows, n, [&](const uint8_t* tile, int64_t count, int64_t t0) {
      float* out = scores + t0;
      base_->Scores(tile, count, q, group, scale, out, stride);
      const int used = UsedRank(tile);
      if (used > 0) {
        factor_rows_->Scores(tile + b_offset_, used, q, group, 1.0f, u.data(), rank);
        ReadA(tile, count, used, a.data());
        for (int64_t h = 0; h < group; ++h) {
          for (int64_t t = 0; t < count; ++t) {
            float sum = 0.0f;
            for (int j = 0; j < used; ++j) sum += a[t * rank + j] * u[h * rank + j];
            out[h * stride + t] += scale * sum;
          }
        }
      }
      ForEachOutlier(tile, count, used, a.data(), [&](int64_t t, int64_t c, float correction) {
        for (int64_t h = 0; h < group; ++h) {
          out[h * stride + t] += scale * (q[h * dim + c] * correction);
        }
      });
    });
  }

  void AccumulateV(const uint8_t* rows, int64_t n, const float* p, int64_t group, int64_t stride,
                   float* acc) const override {
    if (path_ == CodecPath::kReference) {
      std::vector<float> x(static_cast<size_t>(n * head_dim_));  // [n, head_dim]
      Decode(rows, n, x.data());
      return AccumulateVByDecoding(*f32_ref_, reinterpret_cast<const uint8_t*>(x.data()), n, p,
                                   group, stride, acc);
    }
    const int64_t dim = head_dim_, rank = format_.rank;
    std::vector<float> w(
        static_cast<size_t>(group * std::max<int64_t>(rank, 1)));  // [group, rank]: p A
    std::vector<float> a(
        static_cast<size_t>(format_.tile_tokens * std::max<int64_t>(rank, 1)));  // [T, r]
    ForEachTile(rows, n, [&](const uint8_t* tile, int64_t count, int64_t t0) {
      const float* pt = p + t0;
      base_->AccumulateV(tile, count, pt, group, stride, acc);
      const int used = UsedRank(tile);
      if (used > 0) {
        ReadA(tile, count, used, a.data());
        std::fill(w.begin(), w.end(), 0.0f);
        for (int64_t h = 0; h < group; ++h) {
          for (int64_t t = 0; t < count; ++t) {
            const float weight = pt[h * stride + t];
            for (int j = 0; j < used; ++j) w[h * rank + j] += weight * a[t * rank + j];
          }
        }
        factor_rows_->AccumulateV(tile + b_offset_, used, w.data(), group, rank, acc);
      }
      ForEachOutlier(tile, count, used, a.data(), [&](int64_t t, int64_t c, float correction) {
        for (int64_t h = 0; h < group; ++h) acc[h * dim + c] += pt[h * stride + t] * correction;
      });
    });
  }

  // GearDecodeParts (tests).
  GearParts DecodeParts(const uint8_t* rows, int64_t n) const {
    const int64_t dim = head_dim_;
    const size_t size = static_cast<size_t>(n * dim);
    GearParts parts{std::vector<float>(size), std::vector<float>(size, 0.0f),
                    std::vector<float>(size, 0.0f), std::vector<float>(size, 0.0f)};
    ForEachTile(rows, n, [&](const uint8_t* tile, int64_t count, int64_t t0) {
      base_ref_->Decode(tile, count, parts.base.data() + t0 * dim);
      AddLowRank(tile, count, parts.low_rank.data() + t0 * dim);
      const int used = UsedRank(tile);
      for (int64_t t = 0; t < count; ++t) {
        for (int64_t c = 0; c < dim; ++c) {
          float sum = 0.0f;
          for (int j = 0; j < used; ++j) {
            sum += std::fabs(HalfAt(tile + a_offset_ + 2 * (t * format_.rank + j)) *
                             HalfAt(tile + b_offset_ + 2 * (j * dim + c)));
          }
          parts.low_rank_abs[(t0 + t) * dim + c] = sum;
        }
      }
      const int64_t outliers = U16At(tile + header_offset_ + 2);
      for (int64_t k = 0; k < outliers; ++k) {
        const int64_t index = U16At(tile + outlier_offset_ + 4 * k);
        if (index / dim < count) parts.outlier_mask[t0 * dim + index] = 1.0f;
      }
    });
    return parts;
  }

 private:
  template <class F>
  void ForEachTile(const uint8_t* rows, int64_t n, const F& fn) const {
    for (int64_t t0 = 0; t0 < n; t0 += format_.tile_tokens) {
      fn(rows + static_cast<size_t>(t0) * RowBytes(), std::min(format_.tile_tokens, n - t0), t0);
    }
  }

  int UsedRank(const uint8_t* tile) const { return U16At(tile + header_offset_); }

  // a: [count, format_.rank] f32 copy of A's first `used` columns.
  void ReadA(const uint8_t* tile, int64_t count, int used, float* a) const {
    for (int64_t t = 0; t < count; ++t) {
      for (int j = 0; j < used; ++j) {
        a[t * format_.rank + j] = HalfAt(tile + a_offset_ + 2 * (t * format_.rank + j));
      }
    }
  }

  // (A B)[t, c] in the order Decode uses.
  float LowRankAt(const uint8_t* tile, int used, int64_t t, int64_t c) const {
    float sum = 0.0f;
    for (int j = 0; j < used; ++j) {
      sum += HalfAt(tile + a_offset_ + 2 * (t * format_.rank + j)) *
             HalfAt(tile + b_offset_ + 2 * (j * head_dim_ + c));
    }
    return sum;
  }

  // x[t, c] += (A B)[t, c] for t < count; x: [count, head_dim].
  void AddLowRank(const uint8_t* tile, int64_t count, float* x) const {
    const int used = UsedRank(tile);
    for (int64_t t = 0; t < count && used > 0; ++t) {
      for (int64_t c = 0; c < head_dim_; ++c) x[t * head_dim_ + c] += LowRankAt(tile, used, t, c);
    }
  }

  // The base quantizer's value at (t, c), as the base codec decodes it.
  float BaseAt(const uint8_t* tile, int64_t t, int64_t c) const {
    const IntFormat& f = base_format_;
    const int64_t dim = head_dim_;
    if (f.per_channel) {
      const uint8_t* codes = tile + 4 * dim + static_cast<size_t>(t) * f.CodeBytes(dim);
      return static_cast<float>(IntUnpackRef(f, c, codes)) * HalfAt(tile + 2 * c) +
             HalfAt(tile + 2 * (dim + c));
    }
    const uint8_t* row = tile + static_cast<size_t>(t) * f.RowBytes(dim);
    const size_t code_bytes = f.CodeBytes(dim);
    const int64_t g = c / f.group, groups = f.Groups(dim);
    return static_cast<float>(IntUnpackRef(f, c, row)) * HalfAt(row + code_bytes + 2 * g) +
           HalfAt(row + code_bytes + 2 * (groups + g));
  }

  // fn(t, c, stored - base - low_rank) for each outlier of the first `count`
  // tokens; a: A in f32 as ReadA left it (the same values, so the same sums
  // as LowRankAt, with half the conversions).
  template <class F>
  void ForEachOutlier(const uint8_t* tile, int64_t count, int used, const float* a,
                      const F& fn) const {
    const int64_t outliers = U16At(tile + header_offset_ + 2);
    for (int64_t k = 0; k < outliers; ++k) {
      const uint8_t* slot = tile + outlier_offset_ + 4 * k;
      const int64_t index = U16At(slot), t = index / head_dim_, c = index % head_dim_;
      if (t >= count) break;  // ascending index: the rest are later tokens
      float low_rank = 0.0f;
      for (int j = 0; j < used; ++j) {
        low_rank += a[t * format_.rank + j] * HalfAt(tile + b_offset_ + 2 * (j * head_dim_ + c));
      }
      fn(t, c, HalfAt(slot + 2) - BaseAt(tile, t, c) - low_rank);
    }
  }

  void DecodeTile(const KvCodec& base, const uint8_t* tile, int64_t count, float* x) const {
    base.Decode(tile, count, x);
    AddLowRank(tile, count, x);
    const int64_t outliers = U16At(tile + header_offset_ + 2);
    for (int64_t k = 0; k < outliers; ++k) {
      const uint8_t* slot = tile + outlier_offset_ + 4 * k;
      const int64_t index = U16At(slot);
      if (index / head_dim_ >= count) break;
      x[index] = HalfAt(slot + 2);
    }
  }

  struct Outliers {
    std::vector<int64_t> index;     // flat t * d + c, ascending
    std::vector<float> base_value;  // what the base quantizes there: the group's remaining min
  };

  // Greedy outlier choice (see the top of the file).
  Outliers ChooseOutliers(const float* x) const {
    const int64_t tile = format_.tile_tokens, dim = head_dim_;
    // Members of each base group as flat indices, sorted by value.
    std::vector<std::vector<int64_t>> groups;
    if (format_.per_channel) {
      for (int64_t c = 0; c < dim; ++c) {
        groups.emplace_back();
        for (int64_t t = 0; t < tile; ++t) groups.back().push_back(t * dim + c);
      }
    } else {
      for (int64_t t = 0; t < tile; ++t) {
        for (int64_t c0 = 0; c0 < dim; c0 += format_.group) {
          groups.emplace_back();
          for (int64_t c = c0; c < c0 + format_.group; ++c) groups.back().push_back(t * dim + c);
        }
      }
    }
    // NaN takes part as 0 (the base maps it to a code anyway), infinities as
    // the largest finite float, so the order is a strict weak ordering.
    auto key = [&](int64_t i) {
      const float v = x[i];
      if (std::isnan(v)) return 0.0;
      return static_cast<double>(
          std::clamp(v, -std::numeric_limits<float>::max(), std::numeric_limits<float>::max()));
    };
    for (auto& g : groups) {
      std::sort(g.begin(), g.end(), [&](int64_t a, int64_t b) {
        const double ka = key(a), kb = key(b);
        return ka < kb || (ka == kb && a < b);
      });
    }
    std::vector<size_t> lo(groups.size(), 0), hi(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) hi[g] = groups[g].size() - 1;
    std::vector<std::pair<int64_t, size_t>> chosen;  // (flat index, group)
    // An extreme repeated k times only narrows the group once all k copies
    // go: such a run is one move worth its gain per slot.
    auto run_at_max = [&](size_t g) {
      size_t k = 1;
      while (hi[g] - k > lo[g] && key(groups[g][hi[g] - k]) == key(groups[g][hi[g]])) ++k;
      return k;
    };
    auto run_at_min = [&](size_t g) {
      size_t k = 1;
      while (lo[g] + k < hi[g] && key(groups[g][lo[g] + k]) == key(groups[g][lo[g]])) ++k;
      return k;
    };
    while (static_cast<int64_t>(chosen.size()) < slots_) {
      const size_t free_slots = static_cast<size_t>(slots_) - chosen.size();
      double best_gain = 0;
      size_t best_group = 0, best_run = 0;
      bool best_is_max = false;
      for (size_t g = 0; g < groups.size(); ++g) {
        if (hi[g] <= lo[g]) continue;
        const auto& m = groups[g];
        const double range = key(m[hi[g]]) - key(m[lo[g]]);
        const size_t k_max = run_at_max(g), k_min = run_at_min(g);
        if (k_max <= free_slots && hi[g] - k_max >= lo[g]) {
          const double rest = key(m[hi[g] - k_max]) - key(m[lo[g]]);
          const double gain = (range * range - rest * rest) / static_cast<double>(k_max);
          if (gain > best_gain)
            best_gain = gain, best_group = g, best_run = k_max, best_is_max = true;
        }
        if (k_min <= free_slots && lo[g] + k_min <= hi[g]) {
          const double rest = key(m[hi[g]]) - key(m[lo[g] + k_min]);
          const double gain = (range * range - rest * rest) / static_cast<double>(k_min);
          if (gain > best_gain)
            best_gain = gain, best_group = g, best_run = k_min, best_is_max = false;
        }
      }
      if (best_run == 0) break;  // no removal narrows any group (e.g. constant data)
      const auto& m = groups[best_group];
      for (size_t k = 0; k < best_run; ++k) {
        chosen.push_back({best_is_max ? m[hi[best_group]--] : m[lo[best_group]++], best_group});
      }
    }
    std::sort(chosen.begin(), chosen.end());
    Outliers out;
    for (const auto& [index, g] : chosen) {
      out.index.push_back(index);
      out.base_value.push_back(x[groups[g][lo[g]]]);
    }
    return out;
  }

  void EncodeTile(const float* x, uint8_t* tile) const {
    const int64_t tile_tokens = format_.tile_tokens, dim = head_dim_, rank = format_.rank;
    const int64_t size = tile_tokens * dim;
    std::memset(tile, 0, tile_bytes_);
    const Outliers outliers = ChooseOutliers(x);
    std::vector<float> base_input(x, x + size);  // [T, d]
    std::vector<char> is_outlier(static_cast<size_t>(size), 0);
    for (size_t k = 0; k < outliers.index.size(); ++k) {
      const int64_t i = outliers.index[k];
      base_input[i] = outliers.base_value[k];
      is_outlier[i] = 1;
      StoreHalf(x[i], tile + outlier_offset_ + 4 * k + 2);
      const uint16_t index = static_cast<uint16_t>(i);
      std::memcpy(tile + outlier_offset_ + 4 * k, &index, 2);
    }
    // The reference base codec: encoding is the same on both paths.
    base_ref_->Encode(base_input.data(), tile_tokens, tile);
    std::vector<float> decoded(static_cast<size_t>(size));  // [T, d]
    base_ref_->Decode(tile, tile_tokens, decoded.data());
    std::vector<double> residual(static_cast<size_t>(size));  // [T, d]
    for (int64_t i = 0; i < size; ++i) {
      const double r = static_cast<double>(x[i]) - decoded[i];
      residual[i] = is_outlier[i] || !std::isfinite(r) ? 0.0 : r;
    }
    int used = 0;
    if (rank > 0) used = LowRank(residual, tile);
    const uint16_t header[2] = {static_cast<uint16_t>(used),
                                static_cast<uint16_t>(outliers.index.size())};
    std::memcpy(tile + header_offset_, header, 4);
  }

  // Fits A B to `residual` ([T, d], deflated in place), stores the factors,
  // returns the rank used.
  int LowRank(std::vector<double>& residual, uint8_t* tile) const {
    const int64_t rows = format_.tile_tokens, dim = head_dim_, rank = format_.rank;
    std::vector<double> q(static_cast<size_t>(dim * rank));   // [d, r]
    std::vector<double> p(static_cast<size_t>(rows * rank));  // [T, r]
    for (int64_t i = 0; i < dim * rank; ++i) q[i] = StartValue(static_cast<uint64_t>(i));
    int cols = static_cast<int>(rank);
    for (int it = 0; it < format_.iterations && cols > 0; ++it) {
      for (int64_t t = 0; t < rows; ++t) {
        for (int j = 0; j < cols; ++j) {
          double sum = 0;
          for (int64_t c = 0; c < dim; ++c) sum += residual[t * dim + c] * q[c * rank + j];
          p[t * rank + j] = sum;
        }
      }
      cols = Orthonormalize(p, rows, rank, cols);
      for (int64_t c = 0; c < dim; ++c) {
        for (int j = 0; j < cols; ++j) {
          double sum = 0;
          for (int64_t t = 0; t < rows; ++t) sum += residual[t * dim + c] * p[t * rank + j];
          q[c * rank + j] = sum;
        }
      }
    }
    int used = 0;
    std::vector<float> a(static_cast<size_t>(rows)), b(static_cast<size_t>(dim));
    for (int j = 0; j < cols; ++j) {
      double a_max = 0, b_max = 0;
      for (int64_t t = 0; t < rows; ++t) a_max = std::max(a_max, std::fabs(p[t * rank + j]));
      for (int64_t c = 0; c < dim; ++c) b_max = std::max(b_max, std::fabs(q[c * rank + j]));
      if (!(a_max > 0) || !(b_max > 0)) continue;
      const double balance = std::sqrt(b_max / a_max);
      double a_norm = 0;
      for (int64_t t = 0; t < rows; ++t) {
        a[t] = F16ToF32(F32ToF16(static_cast<float>(p[t * rank + j] * balance)));
        a_norm += static_cast<double>(a[t]) * a[t];
      }
      if (!std::isfinite(a_norm) || !(a_norm > 0)) continue;
      // Least squares row of B for the rounded column, on what earlier
      // columns left over.
      bool finite = true;
      for (int64_t c = 0; c < dim; ++c) {
        double dot = 0;
        for (int64_t t = 0; t < rows; ++t) dot += a[t] * residual[t * dim + c];
        b[c] = F16ToF32(F32ToF16(static_cast<float>(dot / a_norm)));
        finite = finite && std::isfinite(b[c]);
      }
      if (!finite) continue;
      for (int64_t t = 0; t < rows; ++t) {
        StoreHalf(a[t], tile + a_offset_ + 2 * (t * rank + used));
        for (int64_t c = 0; c < dim; ++c) {
          residual[t * dim + c] -= static_cast<double>(a[t]) * b[c];
        }
      }
      for (int64_t c = 0; c < dim; ++c) StoreHalf(b[c], tile + b_offset_ + 2 * (used * dim + c));
      ++used;
    }
    return used;
  }

  GearFormat format_;
  IntFormat base_format_;
  CodecPath path_;
  std::unique_ptr<KvCodec> base_;         // base tiles, on `path_`
  std::unique_ptr<KvCodec> base_ref_;     // base tiles, reference (encoding, DecodeParts)
  std::unique_ptr<KvCodec> factor_rows_;  // f16 rows of head_dim: B, on `path_`
  std::unique_ptr<KvCodec> f32_ref_;      // reference fused kernels over decoded tiles
  int64_t slots_ = 0;
  size_t base_bytes_ = 0, a_offset_ = 0, b_offset_ = 0, outlier_offset_ = 0, header_offset_ = 0;
  size_t tile_bytes_ = 0;
};

}  // namespace

IntFormat GearFormat::Base() const {
  IntFormat f;
  f.bits = bits;
  f.symmetric = false;
  f.per_channel = per_channel;
  f.group = per_channel ? tile_tokens : group;
  return f;
}

int64_t GearFormat::OutlierSlots(int64_t head_dim) const {
  return (outlier_permille * tile_tokens * head_dim + 999) / 1000;
}

std::string GearFormat::Name() const {
  std::string name = "gear" + std::to_string(bits);
  name += per_channel ? "-c" + std::to_string(tile_tokens)
                      : "-g" + std::to_string(group) + "-t" + std::to_string(tile_tokens);
  name += "-rank" + std::to_string(rank) + "-iter" + std::to_string(iterations) + "-out" +
          std::to_string(outlier_permille / 10);
  if (outlier_permille % 10 != 0) name += "." + std::to_string(outlier_permille % 10);
  return name;
}

StatusOr<GearFormat> ParseGearFormat(const std::string& name, const std::string& spelled) {
  GearFormat f;
  const std::vector<std::string> parts = SplitKvName(name);
  f.bits = KvNameBits(parts[0], "gear", {2, 4, 8});
  if (f.bits < 0) return BadGear(spelled, "unknown type '" + parts[0] + "'");
  bool have_base = false, have_tile = false, have_rank = false, have_iter = false, have_out = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& o = parts[i];
    auto twice = [&](bool& seen) {
      const bool again = seen;
      seen = true;
      return again;
    };
    if (int64_t v = Number(o, "rank"); v >= 0) {
      if (twice(have_rank)) return BadGear(spelled, "rank given twice");
      if (v > kMaxRank) return BadGear(spelled, "rank " + std::to_string(v) + " above 16");
      f.rank = static_cast<int>(v);
    } else if (int64_t v = Number(o, "iter"); v >= 0) {
      if (twice(have_iter)) return BadGear(spelled, "iter given twice");
      if (v < 1 || v > kMaxIterations) return BadGear(spelled, "iter outside 1..20");
      f.iterations = static_cast<int>(v);
    } else if (int64_t v = OutlierPermille(o); v >= 0) {
      if (twice(have_out)) return BadGear(spelled, "out given twice");
      if (v > kMaxOutlierPermille) return BadGear(spelled, "outliers above 10%");
      f.outlier_permille = static_cast<int>(v);
    } else if (int64_t v = Number(o, "c"); v >= 0) {
      if (twice(have_base)) return BadGear(spelled, "base grouping given twice");
      if (!IsTileSize(v)) return BadGear(spelled, "tile '" + o + "' is not 32, 64 or 128");
      f.per_channel = true;
      f.tile_tokens = v;
    } else if (int64_t v = Number(o, "g"); v >= 0) {
      if (twice(have_base)) return BadGear(spelled, "base grouping given twice");
      if (!IsTileSize(v)) return BadGear(spelled, "group '" + o + "' is not 32, 64 or 128");
      f.per_channel = false;
      f.group = v;
    } else if (int64_t v = Number(o, "t"); v >= 0) {
      if (twice(have_tile)) return BadGear(spelled, "tile given twice");
      if (!IsTileSize(v)) return BadGear(spelled, "tile '" + o + "' is not 32, 64 or 128");
      f.tile_tokens = v;
    } else {
      return BadGear(spelled, "unknown option '" + o + "'");
    }
  }
  if (have_tile && f.per_channel) {
    return BadGear(spelled, "-tT is for per-token bases (-gG); per channel, -cT is the tile");
  }
  return f;
}

StatusOr<std::unique_ptr<KvCodec>> MakeGearCodec(const GearFormat& format, int64_t head_dim,
                                                 CodecPath path) {
  const std::string name = format.Name();
  if (head_dim % 32 != 0) {
    return BadGear(name, "head_dim " + std::to_string(head_dim) + " is not a multiple of 32");
  }
  if (!format.per_channel && head_dim % format.group != 0) {
    return BadGear(name, "group " + std::to_string(format.group) + " does not divide head_dim " +
                             std::to_string(head_dim));
  }
  if (format.tile_tokens * head_dim > 65536) {
    return BadGear(name, "tile of " + std::to_string(format.tile_tokens * head_dim) +
                             " values exceeds the 16-bit outlier index (65536)");
  }
  if (format.rank > std::min<int64_t>(format.tile_tokens, head_dim)) {
    return BadGear(name, "rank above min(tile, head_dim)");
  }
  const IntFormat base = format.Base();
  auto make_base = [&](CodecPath p) {
    return base.per_channel ? MakeChannelCodec(base, head_dim, p) : MakeIntCodec(base, head_dim, p);
  };
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCodec> base_codec, make_base(path));
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCodec> base_ref, make_base(CodecPath::kReference));
  return std::unique_ptr<KvCodec>(std::make_unique<GearCodec>(
      format, head_dim, path, std::move(base_codec), std::move(base_ref),
      MakeFloatCodec(FloatKind::kF16, head_dim, path),
      MakeFloatCodec(FloatKind::kF32, head_dim, CodecPath::kReference)));
}

StatusOr<GearParts> GearDecodeParts(const KvCodec& codec, const uint8_t* rows, int64_t n) {
  const auto* gear = dynamic_cast<const GearCodec*>(&codec);
  if (gear == nullptr) return Status::Error(codec.Name() + " is not a GEAR codec");
  return gear->DecodeParts(rows, n);
}

}  // namespace kvq::codec

// ---- registry entry (kv/codec_registry.h) ----
namespace kvq {
namespace {

using GearFormatSpec = KvFormatOf<codec::GearFormat, codec::MakeGearCodec>;

StatusOr<std::shared_ptr<const KvFormat>> ParseGear(const std::string& base,
                                                    const std::string& spelled) {
  KVQ_ASSIGN_OR_RETURN(const codec::GearFormat format, codec::ParseGearFormat(base, spelled));
  return GearFormatSpec::Of(format);
}

std::vector<std::string> GearSamples(int64_t head_dim) {
  if (head_dim % 32 != 0) return {};
  return {"gear2-c64-rank4-iter3-out2", "gear2-g32-t64-rank4-iter3-out2",
          "gear4-c32-rank2-iter2-out1", "gear8-g32-t32-rank0-out0"};
}

}  // namespace

const KvCodecFamily& GearCodecFamily() {
  static const KvCodecFamily family{
      "gear",
      "gear2|gear4|gear8[-cT|-gG-tT][-rankR][-iterI][-outP]",
      "GEAR (arXiv:2403.05527): an asymmetric base quantizer over tiles of T tokens (per "
      "channel -cT, or per token in groups of G channels -gG-tT) plus a rank-R residual from I "
      "power iterations and P% exact outliers per tile.",
      [](const std::string& base) { return base.rfind("gear", 0) == 0; },
      ParseGear,
      [](int64_t) { return std::vector<std::string>{}; },
      GearSamples,
      {},
      {"gear4", "gear2"},
      {},
      {{"gear2", "gear2-c64-rank4-iter3-out2", "gear2-g32-t64-rank4-iter3-out2",
        "GEAR: 2-bit base over 64-token tiles, rank 4, 2% outliers"},
       {"gear4", "gear4-c64-rank4-iter3-out2", "gear4-g32-t64-rank4-iter3-out2",
        "GEAR at 4 bits"}}};
  return family;
}

}  // namespace kvq
