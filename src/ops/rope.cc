// RoPE: inverse-frequency setup (scalar, once per model) and the rotation
// kernel (Highway, compiled once per SIMD target).
#include "ops/rope.h"

#include <cmath>
#include <numbers>
#include <string>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/rope.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#ifndef KVQ_OPS_ROPE_ONCE
#define KVQ_OPS_ROPE_ONCE
namespace kvq::ops {
namespace {
struct CosSin {
  float c, s;
};
// Rope's cos and sin for one channel pair at `pos`: of the f32 angle
// pos * inv_freq (HF's product), evaluated in double and rounded to f32.
// RopeTable's rows come from here too, so they equal Rope's values.
inline CosSin RopeCosSin(float pos, float inv_freq) {
  const double angle = static_cast<double>(pos * inv_freq);
  return {static_cast<float>(std::cos(angle)), static_cast<float>(std::sin(angle))};
}
}  // namespace
}  // namespace kvq::ops
#endif  // KVQ_OPS_ROPE_ONCE

HWY_BEFORE_NAMESPACE();
namespace kvq::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Rotates one row v[head_dim] by per-pair cos_t/sin_t (kHalves: [half];
// kPairs: expanded to [head_dim], cos duplicated, sin as (-s, +s)).
HWY_INLINE void RotateRow(RopeLayout layout, const float* HWY_RESTRICT cos_t,
                          const float* HWY_RESTRICT sin_t, int64_t head_dim,
                          float* HWY_RESTRICT v) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t half = head_dim / 2;
  int64_t i = 0;
  if (layout == RopeLayout::kHalves) {
    // (x1, x2) -> (x1 c - x2 s, x2 c + x1 s) for x1 = v[i], x2 = v[i + half].
    for (; i + lanes <= half; i += lanes) {
      const VF x1 = hn::LoadU(df, v + i);
      const VF x2 = hn::LoadU(df, v + half + i);
      const VF c = hn::Load(df, cos_t + i);
      const VF s = hn::Load(df, sin_t + i);
      hn::StoreU(hn::NegMulAdd(x2, s, hn::Mul(x1, c)), df, v + i);
      hn::StoreU(hn::MulAdd(x1, s, hn::Mul(x2, c)), df, v + half + i);
    }
    for (; i < half; ++i) {
      const float x1 = v[i], x2 = v[i + half];
      v[i] = x1 * cos_t[i] - x2 * sin_t[i];
      v[i + half] = x2 * cos_t[i] + x1 * sin_t[i];
    }
    return;
  }
#if HWY_TARGET != HWY_SCALAR
  // out = v * cos + swap_pairs(v) * (-s, +s); pairs never straddle a
  // 128-bit block, so Shuffle2301 (per-block swap) is exact.
  for (; i + lanes <= head_dim; i += lanes) {
    const VF xv = hn::LoadU(df, v + i);
    const VF c = hn::Load(df, cos_t + i);
    const VF s = hn::Load(df, sin_t + i);
    hn::StoreU(hn::MulAdd(hn::Shuffle2301(xv), s, hn::Mul(xv, c)), df, v + i);
  }
#endif
  for (; i < head_dim; i += 2) {
    const float x0 = v[i], x1 = v[i + 1];
    v[i] = x0 * cos_t[i] + x1 * sin_t[i];
    v[i + 1] = x1 * cos_t[i + 1] + x0 * sin_t[i + 1];
  }
}

// Stores pair i's (c, s) where RotateRow reads it for `layout`.
HWY_INLINE void PutPair(RopeLayout layout, int64_t i, float c, float s, float* cos_t,
                        float* sin_t) {
  if (layout == RopeLayout::kHalves) {
    cos_t[i] = c;
    sin_t[i] = s;
  } else {
    cos_t[2 * i] = cos_t[2 * i + 1] = c;
    sin_t[2 * i] = -s;
    sin_t[2 * i + 1] = s;
  }
}

void RopeImpl(RopeLayout layout, const float* HWY_RESTRICT inv_freq,
              const int32_t* HWY_RESTRICT positions, int64_t n_tokens, int64_t n_heads,
              int64_t head_dim, float* HWY_RESTRICT x) {
  const int64_t half = head_dim / 2;
  // Per token, shared by all heads.
  HWY_ALIGN float cos_t[kMaxRopeHeadDim];
  HWY_ALIGN float sin_t[kMaxRopeHeadDim];
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const CosSin cs = RopeCosSin(pos, inv_freq[i]);
      PutPair(layout, i, cs.c, cs.s, cos_t, sin_t);
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      RotateRow(layout, cos_t, sin_t, head_dim, x + (t * n_heads + h) * head_dim);
    }
  }
}

// coarse/fine rows: [2, half] (cos, then sin); see RopeTable.
void RopeTableApplyImpl(RopeLayout layout, const float* HWY_RESTRICT coarse,
                        const float* HWY_RESTRICT fine, int64_t half, int64_t step, int64_t first,
                        int64_t n, float* HWY_RESTRICT x) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t head_dim = 2 * half;
  HWY_ALIGN float cos_t[kMaxRopeHeadDim];
  HWY_ALIGN float sin_t[kMaxRopeHeadDim];
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = first + t;
    const float* cc = coarse + (p / step) * 2 * half;  // cos, sin of the coarse angle
    const float* ff = fine + (p % step) * 2 * half;    // cos, sin of the fine angle
    int64_t i = 0;
    if (layout == RopeLayout::kHalves) {
      // cos(a + b) = ca cb - sa sb; sin(a + b) = sa cb + ca sb.
      for (; i + lanes <= half; i += lanes) {
        const VF ca = hn::LoadU(df, cc + i), sa = hn::LoadU(df, cc + half + i);
        const VF cb = hn::LoadU(df, ff + i), sb = hn::LoadU(df, ff + half + i);
        hn::Store(hn::NegMulAdd(sa, sb, hn::Mul(ca, cb)), df, cos_t + i);
        hn::Store(hn::MulAdd(ca, sb, hn::Mul(sa, cb)), df, sin_t + i);
      }
    }
    for (; i < half; ++i) {
      const float ca = cc[i], sa = cc[half + i], cb = ff[i], sb = ff[half + i];
      PutPair(layout, i, ca * cb - sa * sb, sa * cb + ca * sb, cos_t, sin_t);
    }
    RotateRow(layout, cos_t, sin_t, head_dim, x + t * head_dim);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::ops {

HWY_EXPORT(RopeImpl);
HWY_EXPORT(RopeTableApplyImpl);

StatusOr<std::vector<float>> RopeInvFreq(int64_t head_dim, float theta,
                                         const RopeScaling& scaling) {
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxRopeHeadDim) {
    return Status::Error("rope: head_dim " + std::to_string(head_dim) +
                         " must be even and in [2, 1024]");
  }
  if (!(theta > 0.0f)) return Status::Error("rope: rope_theta must be > 0");
  if (scaling.kind != RopeScaling::Kind::kNone && !(scaling.factor > 0.0f)) {
    return Status::Error("rope: rope_scaling.factor must be > 0");
  }
  const int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  // HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all f32 tensors.
  // torch's f32 pow is within an ulp; we round the exact double pow once.
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float p = static_cast<float>(std::pow(static_cast<double>(theta), exponent));
    inv[static_cast<size_t>(i)] = 1.0f / p;
  }
  if (scaling.kind == RopeScaling::Kind::kLinear) {
    for (float& f : inv) f /= scaling.factor;
  } else if (scaling.kind == RopeScaling::Kind::kLlama3) {
    if (!(scaling.high_freq_factor > scaling.low_freq_factor)) {
      return Status::Error("rope: llama3 high_freq_factor must exceed low_freq_factor");
    }
    // Mirrors transformers' _compute_llama3_parameters op by op. Python
    // scalars meet f32 tensors, so each op rounds to f32; `scalar / tensor`
    // is torch's __rdiv__, i.e. reciprocal(tensor) * scalar.
    const float old_ctx = static_cast<float>(scaling.original_max_position_embeddings);
    const float low_wavelen = static_cast<float>(
        static_cast<double>(scaling.original_max_position_embeddings) / scaling.low_freq_factor);
    const float high_wavelen = static_cast<float>(
        static_cast<double>(scaling.original_max_position_embeddings) / scaling.high_freq_factor);
    const float band = static_cast<float>(static_cast<double>(scaling.high_freq_factor) -
                                          static_cast<double>(scaling.low_freq_factor));
    const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
    for (float& f : inv) {
      const float wavelen = (1.0f / f) * two_pi;
      float llama = wavelen > low_wavelen ? f / scaling.factor : f;
      const float smooth = ((1.0f / wavelen) * old_ctx - scaling.low_freq_factor) / band;
      const float smoothed = (1.0f - smooth) * llama / scaling.factor + smooth * llama;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) llama = smoothed;
      f = llama;
    }
  }
  return inv;
}

std::vector<double> RopeInvFreqRef(int64_t head_dim, double theta, const RopeScaling& scaling) {
  const int64_t half = head_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv[static_cast<size_t>(i)] = std::pow(theta, -static_cast<double>(2 * i) / head_dim);
  }
  if (scaling.kind == RopeScaling::Kind::kLinear) {
    for (double& f : inv) f /= scaling.factor;
  } else if (scaling.kind == RopeScaling::Kind::kLlama3) {
    // Meta's reference: wavelengths longer than old_ctx / low_freq_factor
    // are divided by factor, shorter than old_ctx / high_freq_factor kept,
    // and the band between interpolated linearly in old_ctx / wavelen.
    const double old_ctx = static_cast<double>(scaling.original_max_position_embeddings);
    const double lo = scaling.low_freq_factor, hi = scaling.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen < old_ctx / hi) continue;
      if (wavelen > old_ctx / lo) {
        f /= scaling.factor;
        continue;
      }
      const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
      f = (1.0 - smooth) * f / scaling.factor + smooth * f;
    }
  }
  return inv;
}

void Rope(RopeLayout layout, const float* inv_freq, const int32_t* positions, int64_t n_tokens,
          int64_t n_heads, int64_t head_dim, float* x) {
  HWY_DYNAMIC_DISPATCH(RopeImpl)(layout, inv_freq, positions, n_tokens, n_heads, head_dim, x);
}

void RopeRef(RopeLayout layout, const float* inv_freq, const int32_t* positions, int64_t n_tokens,
             int64_t n_heads, int64_t head_dim, float* x) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        // Same f32 angle as the fast path (the HF convention), rest in double.
        const float angle = static_cast<float>(positions[t]) * inv_freq[i];
        const double c = std::cos(static_cast<double>(angle));
        const double s = std::sin(static_cast<double>(angle));
        const int64_t a = layout == RopeLayout::kHalves ? i : 2 * i;
        const int64_t b = layout == RopeLayout::kHalves ? i + half : 2 * i + 1;
        const double xa = v[a], xb = v[b];
        v[a] = static_cast<float>(xa * c - xb * s);
        v[b] = static_cast<float>(xb * c + xa * s);
      }
    }
  }
}

size_t RopeTable::Bytes(int64_t head_dim, int64_t max_positions, int64_t step) {
  const int64_t rows = (max_positions + step - 1) / step + step;
  return static_cast<size_t>(rows * head_dim) * sizeof(float);
}

StatusOr<RopeTable> RopeTable::Make(RopeLayout layout, const std::vector<float>& inv_freq,
                                    int64_t max_positions, int64_t step) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  if (half <= 0 || 2 * half > kMaxRopeHeadDim) {
    return Status::Error("rope table: " + std::to_string(half) +
                         " inverse frequencies (head_dim / 2) outside [1, 512]");
  }
  if (max_positions <= 0 || step <= 0) {
    return Status::Error("rope table: max_positions and step must be positive");
  }
  RopeTable table;
  table.layout_ = layout;
  table.half_ = half;
  table.step_ = step;
  auto fill = [&](std::vector<float>& rows, int64_t count, int64_t stride) {
    rows.resize(static_cast<size_t>(count * 2 * half));
    for (int64_t r = 0; r < count; ++r) {
      const float pos = static_cast<float>(r * stride);
      for (int64_t i = 0; i < half; ++i) {
        const CosSin cs = RopeCosSin(pos, inv_freq[static_cast<size_t>(i)]);
        rows[static_cast<size_t>((2 * r) * half + i)] = cs.c;
        rows[static_cast<size_t>((2 * r + 1) * half + i)] = cs.s;
      }
    }
  };
  fill(table.coarse_, (max_positions + step - 1) / step, step);
  fill(table.fine_, step, 1);
  return table;
}

void RopeTable::Apply(int64_t first, int64_t n, float* x) const {
  HWY_DYNAMIC_DISPATCH(RopeTableApplyImpl)
  (layout_, coarse_.data(), fine_.data(), half_, step_, first, n, x);
}

}  // namespace kvq::ops
#endif  // HWY_ONCE
