// Activation quantizers and the scalar twin of the integer-dot matvec.
#include <cmath>
#include <cstring>
#include <vector>

#include "base/fp16.h"
#include "ops/matvec_int8.h"

namespace kvq::ops {

void QuantizeRowQ8_1(const float* x, int64_t n, BlockQ8_1* out) {
  for (int64_t b = 0; b < n / kQBlock; ++b) {
    const float d = QuantizeBlockQ8(x + b * kQBlock, out[b].qs);
    int sum = 0;
    for (int64_t j = 0; j < kQBlock; ++j) sum += out[b].qs[j];
    out[b].d = F32ToF16(d);
    out[b].s = F32ToF16(static_cast<float>(sum) * d);
  }
}

void QuantizeRowQ8_K(const float* x, int64_t n, BlockQ8_K* out) {
  for (int64_t b = 0; b < n / kQKBlock; ++b) {
    const float* xb = x + b * kQKBlock;
    BlockQ8_K& o = out[b];
    // The signed value of largest magnitude (the first one on ties).
    float amax = 0.0f, max = 0.0f;
    for (int64_t j = 0; j < kQKBlock; ++j) {
      if (std::fabs(xb[j]) > amax) amax = std::fabs(xb[j]), max = xb[j];
    }
    if (amax == 0.0f) {
      std::memset(&o, 0, sizeof(o));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int64_t j = 0; j < kQKBlock; ++j) {
      // nearbyint: ties to even, as ggml's nearest_int. |iscale * x| <= 127
      // up to a rounding, so ggml's clamp to 127 never acts on finite x.
      o.qs[j] = RoundToQ8(std::nearbyint(iscale * xb[j]));
    }
    for (int i = 0; i < kQKBlock / 16; ++i) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += o.qs[16 * i + j];
      o.bsums[i] = static_cast<int16_t>(sum);
    }
    o.d = 1.0f / iscale;
  }
}

ActQuant Int8ActQuant(WeightType type) {
  switch (type) {
    case WeightType::kQ8_0:
    case WeightType::kQ4_0:
    case WeightType::kQ5_0:
    case WeightType::kIQ4_NL:
      return ActQuant::kQ8_0;
    case WeightType::kQ4_1:
    case WeightType::kQ5_1:
      return ActQuant::kQ8_1;
    case WeightType::kQ2_K:
    case WeightType::kQ3_K:
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
    case WeightType::kQ6_K:
      return ActQuant::kQ8_K;
    default:
      return ActQuant::kNone;
  }
}

int64_t Int8ActRowBytes(WeightType type, int64_t cols) {
  switch (Int8ActQuant(type)) {
    case ActQuant::kQ8_0:
      return cols / kQBlock * static_cast<int64_t>(sizeof(BlockQ8_0));
    case ActQuant::kQ8_1:
      return cols / kQBlock * static_cast<int64_t>(sizeof(BlockQ8_1));
    case ActQuant::kQ8_K:
      return cols / kQKBlock * static_cast<int64_t>(sizeof(BlockQ8_K));
    default:
      return 0;
  }
}

void QuantizeActs(WeightType type, const float* x, int64_t n, int64_t cols, uint8_t* acts) {
  const int64_t row_bytes = Int8ActRowBytes(type, cols);
  for (int64_t t = 0; t < n; ++t) {
    uint8_t* out = acts + t * row_bytes;
    const float* xt = x + t * cols;
    switch (Int8ActQuant(type)) {
      case ActQuant::kQ8_0:
        QuantizeRowQ8_0(xt, cols, reinterpret_cast<BlockQ8_0*>(out));
        break;
      case ActQuant::kQ8_1:
        QuantizeRowQ8_1(xt, cols, reinterpret_cast<BlockQ8_1*>(out));
        break;
      case ActQuant::kQ8_K:
        QuantizeRowQ8_K(xt, cols, reinterpret_cast<BlockQ8_K*>(out));
        break;
      default:
        break;
    }
  }
}

namespace {

// One weight block as integers: value j = scale(j / 16) * q[j] (K-quants)
// or d * q[j] (+ m), q already minus the type's offset (Q4_0's 8, Q6_K's
// 32 ...), so that sum_j q[j] * x[j] is the block's exact integer dot.
struct IntBlock {
  int q[kQKBlock];
  int sc[16], mn[16];  // K-quants: scale and min of each 16 values
  float d = 0, m = 0;  // small blocks: d and m (0 without); K: d and dmin
};

int Nibble(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4; }

int Q5Bit(const uint8_t* qh, int j) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  return static_cast<int>((bits >> j) & 1) << 4;
}

void SmallBlockInts(WeightType type, const uint8_t* row, int64_t b, IntBlock* o) {
  for (int j = 0; j < kQBlock; ++j) {
    switch (type) {
      case WeightType::kQ8_0: {
        const BlockQ8_0& k = reinterpret_cast<const BlockQ8_0*>(row)[b];
        o->d = F16ToF32(k.d), o->q[j] = k.q[j];
        break;
      }
      case WeightType::kQ4_0: {
        const BlockQ4_0& k = reinterpret_cast<const BlockQ4_0*>(row)[b];
        o->d = F16ToF32(k.d), o->q[j] = Nibble(k.qs, j) - 8;
        break;
      }
      case WeightType::kQ4_1: {
        const BlockQ4_1& k = reinterpret_cast<const BlockQ4_1*>(row)[b];
        o->d = F16ToF32(k.d), o->m = F16ToF32(k.m), o->q[j] = Nibble(k.qs, j);
        break;
      }
      case WeightType::kQ5_0: {
        const BlockQ5_0& k = reinterpret_cast<const BlockQ5_0*>(row)[b];
        o->d = F16ToF32(k.d), o->q[j] = (Nibble(k.qs, j) | Q5Bit(k.qh, j)) - 16;
        break;
      }
      case WeightType::kQ5_1: {
        const BlockQ5_1& k = reinterpret_cast<const BlockQ5_1*>(row)[b];
        o->d = F16ToF32(k.d), o->m = F16ToF32(k.m), o->q[j] = Nibble(k.qs, j) | Q5Bit(k.qh, j);
        break;
      }
      default: {  // IQ4_NL
        const BlockIQ4_NL& k = reinterpret_cast<const BlockIQ4_NL*>(row)[b];
        o->d = F16ToF32(k.d), o->q[j] = kIQ4NLValues[Nibble(k.qs, j)];
        break;
      }
    }
  }
}

void Q2Q3Ints(WeightType type, const uint8_t* row, int64_t b, IntBlock* o) {
  for (int v = 0; v < kQKBlock; ++v) {
    const int h = v / 128, pl = (v % 128) / 32, l = v % 32;
    if (type == WeightType::kQ2_K) {
      const BlockQ2_K& k = reinterpret_cast<const BlockQ2_K*>(row)[b];
      o->q[v] = (k.qs[h * 32 + l] >> (2 * pl)) & 3;
    } else {
      const BlockQ3_K& k = reinterpret_cast<const BlockQ3_K*>(row)[b];
      const int low = (k.qs[h * 32 + l] >> (2 * pl)) & 3;
      o->q[v] = low + 4 * ((k.hmask[l] >> (4 * h + pl)) & 1) - 4;
    }
  }
  for (int i = 0; i < 16; ++i) {
    if (type == WeightType::kQ2_K) {
      const BlockQ2_K& k = reinterpret_cast<const BlockQ2_K*>(row)[b];
      o->sc[i] = k.scales[i] & 0xF, o->mn[i] = k.scales[i] >> 4;
      o->d = F16ToF32(k.d), o->m = F16ToF32(k.dmin);
    } else {
      const BlockQ3_K& k = reinterpret_cast<const BlockQ3_K*>(row)[b];
      o->sc[i] = Q3KScale(k.scales, i), o->mn[i] = 0;
      o->d = F16ToF32(k.d), o->m = 0.0f;
    }
  }
}

// Q4_K and Q5_K (qh: the fifth bits, null for Q4_K).
void Q45KInts(uint16_t d, uint16_t dmin, const uint8_t* scales, const uint8_t* qs,
              const uint8_t* qh, IntBlock* o) {
  o->d = F16ToF32(d), o->m = F16ToF32(dmin);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, mn;
    KScaleMin(scales, j, &sc, &mn);
    o->sc[2 * j] = o->sc[2 * j + 1] = sc;
    o->mn[2 * j] = o->mn[2 * j + 1] = mn;
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = qs[j / 2 * 32 + l];
      const int fifth = qh != nullptr ? ((qh[l] >> j) & 1) << 4 : 0;
      o->q[32 * j + l] = (j % 2 == 0 ? byte & 0xF : byte >> 4) | fifth;
    }
  }
}

void Q6KInts(const uint8_t* row, int64_t b, IntBlock* o) {
  const BlockQ6_K& k = reinterpret_cast<const BlockQ6_K*>(row)[b];
  o->d = F16ToF32(k.d), o->m = 0.0f;
  for (int i = 0; i < 16; ++i) o->sc[i] = k.scales[i], o->mn[i] = 0;
  for (int v = 0; v < kQKBlock; ++v) {
    const int h = v / 128, pl = (v % 128) / 32, l = v % 32;
    const uint8_t lo = k.ql[h * 64 + (pl & 1) * 32 + l];
    const int low = pl < 2 ? lo & 0xF : lo >> 4;
    const int high = (k.qh[h * 32 + l] >> (2 * pl)) & 3;
    o->q[v] = (low | (high << 4)) - 32;
  }
}

void KBlockInts(WeightType type, const uint8_t* row, int64_t b, IntBlock* o) {
  switch (type) {
    case WeightType::kQ2_K:
    case WeightType::kQ3_K:
      return Q2Q3Ints(type, row, b, o);
    case WeightType::kQ4_K: {
      const BlockQ4_K& k = reinterpret_cast<const BlockQ4_K*>(row)[b];
      return Q45KInts(k.d, k.dmin, k.scales, k.qs, nullptr, o);
    }
    case WeightType::kQ5_K: {
      const BlockQ5_K& k = reinterpret_cast<const BlockQ5_K*>(row)[b];
      return Q45KInts(k.d, k.dmin, k.scales, k.qs, k.qh, o);
    }
    default:
      return Q6KInts(row, b, o);
  }
}

// One row against Q8_0 / Q8_1 activations: per block d_w * d_x (f32) times
// the exact integer dot, plus m_w * s_x (f32) for the *_1 types.
double SmallRowDot(const WeightView& w, int64_t r, const uint8_t* acts, double* abs_sum) {
  const bool q81 = Int8ActQuant(w.type) == ActQuant::kQ8_1;
  double sum = 0.0;
  IntBlock blk;
  for (int64_t b = 0; b < w.cols / kQBlock; ++b) {
    SmallBlockInts(w.type, w.row(r), b, &blk);
    const int8_t* xq;
    float dx, sx = 0.0f;
    if (q81) {
      const BlockQ8_1& a = reinterpret_cast<const BlockQ8_1*>(acts)[b];
      xq = a.qs, dx = F16ToF32(a.d), sx = F16ToF32(a.s);
    } else {
      const BlockQ8_0& a = reinterpret_cast<const BlockQ8_0*>(acts)[b];
      xq = a.q, dx = F16ToF32(a.d);
    }
    int32_t isum = 0, iabs = 0;
    for (int j = 0; j < kQBlock; ++j) isum += blk.q[j] * xq[j], iabs += std::abs(blk.q[j] * xq[j]);
    const float dd = blk.d * dx;
    const float mterm = blk.m * sx;
    sum += static_cast<double>(dd) * isum + mterm;
    *abs_sum += std::fabs(static_cast<double>(dd)) * iabs + std::fabs(mterm);
  }
  return sum;
}

// One row against Q8_K activations: per super-block the exact integer
// sum_i sc_i * dot_i (dot_i over 16 values) times d_x * d_w, minus
// d_x * dmin_w times sum_i mn_i * bsums_i.
double KRowDot(const WeightView& w, int64_t r, const uint8_t* acts, double* abs_sum) {
  double sum = 0.0;
  IntBlock blk;
  for (int64_t b = 0; b < w.cols / kQKBlock; ++b) {
    KBlockInts(w.type, w.row(r), b, &blk);
    const BlockQ8_K& a = reinterpret_cast<const BlockQ8_K*>(acts)[b];
    int32_t isum = 0, imin = 0;
    int64_t iabs = 0;
    for (int i = 0; i < 16; ++i) {
      int32_t dot = 0, dabs = 0;
      for (int j = 16 * i; j < 16 * i + 16; ++j) {
        dot += blk.q[j] * a.qs[j], dabs += std::abs(blk.q[j] * a.qs[j]);
      }
      isum += blk.sc[i] * dot;
      iabs += static_cast<int64_t>(std::abs(blk.sc[i])) * dabs;
      imin += blk.mn[i] * a.bsums[i];
    }
    const float dd = a.d * blk.d, dm = a.d * blk.m;
    sum += static_cast<double>(dd) * isum - static_cast<double>(dm) * imin;
    *abs_sum += std::fabs(static_cast<double>(dd)) * static_cast<double>(iabs) +
                std::fabs(static_cast<double>(dm) * imin);
  }
  return sum;
}

}  // namespace

void MatvecInt8Ref(const WeightView& w, const uint8_t* acts, float* y, double* abs_terms) {
  const bool k = Int8ActQuant(w.type) == ActQuant::kQ8_K;
  for (int64_t r = 0; r < w.rows; ++r) {
    double abs_sum = 0.0;
    const double v = k ? KRowDot(w, r, acts, &abs_sum) : SmallRowDot(w, r, acts, &abs_sum);
    y[r] = static_cast<float>(v);
    if (abs_terms != nullptr) abs_terms[r] = abs_sum;
  }
}

}  // namespace kvq::ops
