// Highway kernels for the elementwise ops, compiled once per SIMD target.
#include "ops/elementwise.h"

#include <cmath>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/elementwise.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h: per-target code (kept in its own include block so
// clang-format does not sort it above foreach_target.h).
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

void RmsNormImpl(const float* HWY_RESTRICT x, const float* HWY_RESTRICT weight, int64_t n,
                 int64_t dim, float eps, float* y) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * dim;
    float* yt = y + t * dim;
    VF acc = hn::Zero(df);
    int64_t i = 0;
    for (; i + lanes <= dim; i += lanes) {
      const VF v = hn::LoadU(df, xt + i);
      acc = hn::MulAdd(v, v, acc);
    }
    float sum = hn::GetLane(hn::SumOfLanes(df, acc));
    for (; i < dim; ++i) sum += xt[i] * xt[i];
    // 1/sqrt rather than an approximate rsqrt: one division per row is free.
    const float scale = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
    const VF vs = hn::Set(df, scale);
    for (i = 0; i + lanes <= dim; i += lanes) {
      hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(df, xt + i), vs), hn::LoadU(df, weight + i)), df,
                 yt + i);
    }
    for (; i < dim; ++i) yt[i] = xt[i] * scale * weight[i];
  }
}

void AddBiasImpl(const float* HWY_RESTRICT bias, int64_t n, int64_t dim, float* HWY_RESTRICT y) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t t = 0; t < n; ++t) {
    float* yt = y + t * dim;
    int64_t i = 0;
    for (; i + lanes <= dim; i += lanes) {
      hn::StoreU(hn::Add(hn::LoadU(df, yt + i), hn::LoadU(df, bias + i)), df, yt + i);
    }
    for (; i < dim; ++i) yt[i] += bias[i];
  }
}

// silu(g) = g * sigmoid(g) with sigmoid from e = exp(-|g|) in (0, 1]:
// sigmoid = 1/(1+e) for g >= 0 and e/(1+e) for g < 0. exp never overflows
// this way, so huge |g| needs no clamping.
HWY_INLINE VF SiluTimes(DF df, VF g, VF u) {
  const VF e = hn::CallExp(df, hn::Neg(hn::Abs(g)));
  const VF one = hn::Set(df, 1.0f);
  const VF inv = hn::Div(one, hn::Add(one, e));
  const VF sig = hn::IfThenElse(hn::Lt(g, hn::Zero(df)), hn::Mul(e, inv), inv);
  return hn::Mul(hn::Mul(g, sig), u);
}

void SwiGluImpl(const float* gate, const float* up, int64_t count, float* out) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    hn::StoreU(SiluTimes(df, hn::LoadU(df, gate + i), hn::LoadU(df, up + i)), df, out + i);
  }
  if (i < count) {
    // Tail through the same vector math on a padded copy, so every element
    // sees identical arithmetic whatever its index.
    HWY_ALIGN float g[hn::MaxLanes(df)] = {};
    HWY_ALIGN float u[hn::MaxLanes(df)] = {};
    for (int64_t j = i; j < count; ++j) {
      g[j - i] = gate[j];
      u[j - i] = up[j];
    }
    HWY_ALIGN float o[hn::MaxLanes(df)];
    hn::Store(SiluTimes(df, hn::Load(df, g), hn::Load(df, u)), df, o);
    for (int64_t j = i; j < count; ++j) out[j] = o[j - i];
  }
}

void SoftmaxImpl(float* HWY_RESTRICT x, int64_t count) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  float max = -std::numeric_limits<float>::infinity();
  {
    VF vmax = hn::Set(df, max);
    int64_t i = 0;
    for (; i + lanes <= count; i += lanes) vmax = hn::Max(vmax, hn::LoadU(df, x + i));
    max = hn::GetLane(hn::MaxOfLanes(df, vmax));
    for (; i < count; ++i) max = std::fmax(max, x[i]);
  }
  // exp(x - max) <= 1; Highway's Exp returns 0 below -104 and for -inf.
  const VF vmax = hn::Set(df, max);
  VF vsum = hn::Zero(df);
  int64_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    const VF e = hn::CallExp(df, hn::Sub(hn::LoadU(df, x + i), vmax));
    hn::StoreU(e, df, x + i);
    vsum = hn::Add(vsum, e);
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, vsum));
  if (i < count) {
    HWY_ALIGN float tail[hn::MaxLanes(df)];
    for (int64_t j = 0; j < lanes; ++j) {
      tail[j] = i + j < count ? x[i + j] : -std::numeric_limits<float>::infinity();
    }
    hn::Store(hn::CallExp(df, hn::Sub(hn::Load(df, tail), vmax)), df, tail);
    for (int64_t j = i; j < count; ++j) {
      x[j] = tail[j - i];
      sum += x[j];
    }
  }
  const VF inv = hn::Set(df, 1.0f / sum);
  for (i = 0; i + lanes <= count; i += lanes)
    hn::StoreU(hn::Mul(hn::LoadU(df, x + i), inv), df, x + i);
  for (; i < count; ++i) x[i] *= 1.0f / sum;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::ops {

HWY_EXPORT(RmsNormImpl);
HWY_EXPORT(AddBiasImpl);
HWY_EXPORT(SwiGluImpl);
HWY_EXPORT(SoftmaxImpl);

void RmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y) {
  HWY_DYNAMIC_DISPATCH(RmsNormImpl)(x, weight, n, dim, eps, y);
}
void AddBias(const float* bias, int64_t n, int64_t dim, float* y) {
  HWY_DYNAMIC_DISPATCH(AddBiasImpl)(bias, n, dim, y);
}
void SwiGlu(const float* gate, const float* up, int64_t count, float* out) {
  HWY_DYNAMIC_DISPATCH(SwiGluImpl)(gate, up, count, out);
}
void Softmax(float* x, int64_t count) { HWY_DYNAMIC_DISPATCH(SoftmaxImpl)(x, count); }

void RmsNormRef(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y) {
  for (int64_t t = 0; t < n; ++t) {
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(x[t * dim + i]) * x[t * dim + i];
    const double scale = 1.0 / std::sqrt(sum / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) {
      y[t * dim + i] = static_cast<float>(x[t * dim + i] * scale * weight[i]);
    }
  }
}

void AddBiasRef(const float* bias, int64_t n, int64_t dim, float* y) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < dim; ++i) y[t * dim + i] += bias[i];
  }
}

void SwiGluRef(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void SoftmaxRef(float* x, int64_t count) {
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < count; ++i) max = std::fmax(max, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < count; ++i) sum += std::exp(x[i] - max);
  for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(std::exp(x[i] - max) / sum);
}

}  // namespace kvq::ops
#endif  // HWY_ONCE
