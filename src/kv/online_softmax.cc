// Highway kernel for the online softmax step, compiled once per SIMD target.
#include "kv/online_softmax.h"

#include <cmath>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/online_softmax.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h: per-target code (kept in its own include block so
// clang-format does not sort it above foreach_target.h).
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void OnlineSoftmaxStepImpl(float* HWY_RESTRICT p, int64_t count, float* max, float* sum,
                           float* HWY_RESTRICT acc, int64_t dim) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float block_max = kNegInf;
  {
    auto vmax = hn::Set(df, kNegInf);
    int64_t i = 0;
    for (; i + lanes <= count; i += lanes) vmax = hn::Max(vmax, hn::LoadU(df, p + i));
    block_max = hn::GetLane(hn::MaxOfLanes(df, vmax));
    for (; i < count; ++i) block_max = std::fmax(block_max, p[i]);
  }
  if (block_max > *max) {
    if (*max != kNegInf) {  // at -inf nothing has been accumulated yet
      const float correction = std::exp(*max - block_max);
      *sum *= correction;
      const auto vc = hn::Set(df, correction);
      int64_t d = 0;
      for (; d + lanes <= dim; d += lanes)
        hn::StoreU(hn::Mul(hn::LoadU(df, acc + d), vc), df, acc + d);
      for (; d < dim; ++d) acc[d] *= correction;
    }
    *max = block_max;
  }
  const auto vmax = hn::Set(df, *max);
  auto vsum = hn::Zero(df);
  int64_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    const auto e = hn::CallExp(df, hn::Sub(hn::LoadU(df, p + i), vmax));
    hn::StoreU(e, df, p + i);
    vsum = hn::Add(vsum, e);
  }
  float block_sum = hn::GetLane(hn::SumOfLanes(df, vsum));
  if (i < count) {
    // Highway 1.0.3 has no partial loads on x86: pad the tail with -inf,
    // whose exp is 0.
    HWY_ALIGN float tail[hn::MaxLanes(df)];
    for (int64_t j = 0; j < lanes; ++j) tail[j] = i + j < count ? p[i + j] : kNegInf;
    hn::Store(hn::CallExp(df, hn::Sub(hn::Load(df, tail), vmax)), df, tail);
    for (int64_t j = i; j < count; ++j) {
      p[j] = tail[j - i];
      block_sum += p[j];
    }
  }
  *sum += block_sum;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq {

HWY_EXPORT(OnlineSoftmaxStepImpl);

void OnlineSoftmaxStep(float* p, int64_t count, float* max, float* sum, float* acc, int64_t dim) {
  HWY_DYNAMIC_DISPATCH(OnlineSoftmaxStepImpl)(p, count, max, sum, acc, dim);
}

void OnlineSoftmaxStepRef(float* p, int64_t count, float* max, float* sum, float* acc,
                          int64_t dim) {
  float block_max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < count; ++i) block_max = std::fmax(block_max, p[i]);
  if (block_max > *max) {
    if (*max != -std::numeric_limits<float>::infinity()) {
      const float correction = std::exp(*max - block_max);
      *sum *= correction;
      for (int64_t d = 0; d < dim; ++d) acc[d] *= correction;
    }
    *max = block_max;
  }
  for (int64_t i = 0; i < count; ++i) {
    p[i] = std::exp(p[i] - *max);
    *sum += p[i];
  }
}

}  // namespace kvq
#endif  // HWY_ONCE
