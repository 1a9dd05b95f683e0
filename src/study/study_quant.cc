#include "study/study_quant.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/thread_pool.h"

namespace kvq {
namespace {

// 8 independent partial sums so the compiler can keep several FMAs in flight.
float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float sum = 0;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (int j = 0; j < 8; ++j) sum += acc[j];
  return sum;
}

// [T, heads, d] -> [T, d] of head h.
void ExtractHead(const float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t h,
                 float* out) {
  for (int64_t t = 0; t < tokens; ++t) {
    std::copy_n(x + (t * heads + h) * head_dim, head_dim, out + t * head_dim);
  }
}

// log-sum-exp of scores row i over j <= i, in double.
double RowLse(const float* row, int64_t i) {
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j <= i; ++j) max = std::max(max, static_cast<double>(row[j]));
  double sum = 0;
  for (int64_t j = 0; j <= i; ++j) sum += std::exp(static_cast<double>(row[j]) - max);
  return max + std::log(sum);
}

struct Sums {
  double score_err = 0, score_ref = 0, kl = 0, out_err = 0, out_ref = 0;
  int64_t rows = 0;
  void Add(const Sums& o) {
    score_err += o.score_err;
    score_ref += o.score_ref;
    kl += o.kl;
    out_err += o.out_err;
    out_ref += o.out_ref;
    rows += o.rows;
  }
  FakeQuantMetrics Metrics() const {
    FakeQuantMetrics m;
    m.score_rel_error = score_ref > 0 ? std::sqrt(score_err / score_ref) : 0;
    m.prob_kl = rows > 0 ? kl / static_cast<double>(rows) : 0;
    m.output_rel_error = out_ref > 0 ? std::sqrt(out_err / out_ref) : 0;
    return m;
  }
};

// A per-token choice ignores the group, so it is normalized to 0 there:
// rows that differ only in an unused group share one pass.
struct KChoice {
  QuantAxis axis;
  QuantFormula formula;
  bool pre_rope;
  int bits;
  int64_t group;
  bool operator==(const KChoice& o) const {
    return axis == o.axis && formula == o.formula && pre_rope == o.pre_rope && bits == o.bits &&
           group == o.group;
  }
};
struct VChoice {
  QuantAxis axis;
  QuantFormula formula;
  int bits;
  int64_t group;
  bool operator==(const VChoice& o) const {
    return axis == o.axis && formula == o.formula && bits == o.bits && group == o.group;
  }
};

// The group along the quantized axis: channels for per-token, tokens for per-channel.
int64_t GroupFor(QuantAxis axis, const FakeQuantRow& r) {
  return axis == QuantAxis::kToken ? r.channel_group : r.token_group;
}

QuantSpec SpecFor(QuantAxis axis, int bits, QuantFormula formula, int64_t group) {
  QuantSpec spec{axis, bits, formula, 32, 0};
  (axis == QuantAxis::kToken ? spec.channel_group : spec.token_group) = group;
  return spec;
}

template <typename T>
size_t IndexOf(std::vector<T>& list, const T& item) {
  auto it = std::find(list.begin(), list.end(), item);
  if (it != list.end()) return static_cast<size_t>(it - list.begin());
  list.push_back(item);
  return list.size() - 1;
}

struct HeadBuffers {
  HeadBuffers(int64_t T, int64_t d)
      : qh(T * d),
        kh(T * d),
        vh(T * d),
        s_ref(T * T),
        p_ref(T * T),
        s_hat(T * T),
        o_ref(T * d),
        o_hat(T * d),
        lse_ref(T) {}
  std::vector<float> qh, kh, vh;           // [T, d]
  std::vector<float> s_ref, p_ref, s_hat;  // [T, T]
  std::vector<float> o_ref, o_hat;         // [T, d]
  std::vector<double> lse_ref;             // [T]
};

struct HeadPassInputs {
  const LayerCapture& c;
  const std::vector<std::vector<float>>& k_q;  // [k choices][T, kvh, d]
  const std::vector<std::vector<float>>& v_q;  // [v choices][T, kvh, d]
  const std::vector<size_t>& row_k;            // [rows] -> k choice
  const std::vector<size_t>& row_v;            // [rows] -> v choice
  const KvShape& s;
  int64_t T;
};

// Every row's sums for query head h of one layer.
std::vector<Sums> HeadPass(const HeadPassInputs& in, int64_t h, HeadBuffers& b) {
  const KvShape& s = in.s;
  const int64_t T = in.T, d = s.head_dim;
  const int64_t g = h / (s.num_heads / s.num_kv_heads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<Sums> sums(in.row_k.size());
  ExtractHead(in.c.q.data(), T, s.num_heads, d, h, b.qh.data());
  ExtractHead(in.c.k.data(), T, s.num_kv_heads, d, g, b.kh.data());
  ExtractHead(in.c.v.data(), T, s.num_kv_heads, d, g, b.vh.data());
  CausalScores(b.qh.data(), b.kh.data(), T, d, scale, b.s_ref.data());
  double score_ref = 0;
  for (int64_t i = 0; i < T; ++i) {
    b.lse_ref[i] = RowLse(b.s_ref.data() + i * T, i);
    for (int64_t j = 0; j <= i; ++j) {
      const double x = b.s_ref[i * T + j];
      score_ref += x * x;
      b.p_ref[i * T + j] = static_cast<float>(std::exp(x - b.lse_ref[i]));
    }
  }
  CausalOutput(b.p_ref.data(), b.vh.data(), T, d, b.o_ref.data());
  double out_ref = 0;
  for (float x : b.o_ref) out_ref += static_cast<double>(x) * x;
  for (size_t ki = 0; ki < in.k_q.size(); ++ki) {
    ExtractHead(in.k_q[ki].data(), T, s.num_kv_heads, d, g, b.kh.data());
    CausalScores(b.qh.data(), b.kh.data(), T, d, scale, b.s_hat.data());
    double score_err = 0, kl = 0;
    for (int64_t i = 0; i < T; ++i) {
      float* row = b.s_hat.data() + i * T;
      const double lse = RowLse(row, i);
      for (int64_t j = 0; j <= i; ++j) {
        const double ref = b.s_ref[i * T + j], hat = row[j];
        score_err += (hat - ref) * (hat - ref);
        // KL from log-probabilities, so an underflowed p^ cannot blow up.
        kl += b.p_ref[i * T + j] * ((ref - b.lse_ref[i]) - (hat - lse));
        row[j] = static_cast<float>(std::exp(hat - lse));  // now P^
      }
    }
    for (size_t r = 0; r < in.row_k.size(); ++r) {
      if (in.row_k[r] != ki) continue;
      ExtractHead(in.v_q[in.row_v[r]].data(), T, s.num_kv_heads, d, g, b.vh.data());
      CausalOutput(b.s_hat.data(), b.vh.data(), T, d, b.o_hat.data());
      double out_err = 0;
      for (int64_t i = 0; i < T * d; ++i) {
        const double e = static_cast<double>(b.o_hat[i]) - b.o_ref[i];
        out_err += e * e;
      }
      sums[r] = Sums{score_err, score_ref, kl, out_err, out_ref, T};
    }
  }
  return sums;
}

}  // namespace

const char* QuantAxisName(QuantAxis axis) {
  return axis == QuantAxis::kToken ? "token" : "channel";
}

const char* FakeQuantFamilyName(FakeQuantFamily family) {
  switch (family) {
    case FakeQuantFamily::kWriteup:
      return "writeup";
    case FakeQuantFamily::kKvQuant:
      return "kvquant";
    default:
      return "corrected";
  }
}

void FakeQuantGroup(const float* x, int64_t n, int64_t stride, int bits, QuantFormula formula,
                    float* out) {
  if (formula == QuantFormula::kAsymmetric) {
    float lo = std::numeric_limits<float>::infinity(), hi = -lo;
    for (int64_t i = 0; i < n; ++i) {
      lo = std::min(lo, x[i * stride]);
      hi = std::max(hi, x[i * stride]);
    }
    if (!(hi > lo)) {  // constant group (or empty): one level reproduces it exactly
      for (int64_t i = 0; i < n; ++i) out[i * stride] = x[i * stride];
      return;
    }
    const double top = static_cast<double>((int64_t{1} << bits) - 1);  // 2^b levels: 0..top
    const double step = (static_cast<double>(hi) - lo) / top;
    for (int64_t i = 0; i < n; ++i) {
      const double q =
          std::clamp(std::nearbyint((x[i * stride] - static_cast<double>(lo)) / step), 0.0, top);
      out[i * stride] = static_cast<float>(lo + q * step);
    }
    return;
  }
  // The write-up's formula, verbatim: 2^(b+1) levels, symmetric.
  float absmax = 0;
  for (int64_t i = 0; i < n; ++i) absmax = std::max(absmax, std::fabs(x[i * stride]));
  if (absmax == 0) {
    for (int64_t i = 0; i < n; ++i) out[i * stride] = 0;
    return;
  }
  const double qmax = static_cast<double>((int64_t{1} << bits) - 1);
  const double scale = absmax / qmax;
  for (int64_t i = 0; i < n; ++i) {
    const double q = std::clamp(std::nearbyint(x[i * stride] / scale), -qmax - 1, qmax);
    out[i * stride] = static_cast<float>(q * scale);
  }
}

void FakeQuantize(const float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                  const QuantSpec& spec, float* out) {
  if (spec.axis == QuantAxis::kToken) {
    const int64_t width = spec.channel_group > 0 ? spec.channel_group : head_dim;
    for (int64_t r = 0; r < tokens * heads; ++r) {
      for (int64_t c0 = 0; c0 < head_dim; c0 += width) {
        FakeQuantGroup(x + r * head_dim + c0, std::min(width, head_dim - c0), 1, spec.bits,
                       spec.formula, out + r * head_dim + c0);
      }
    }
    return;
  }
  const int64_t stride = heads * head_dim;
  const int64_t group = spec.token_group > 0 ? spec.token_group : std::max<int64_t>(tokens, 1);
  for (int64_t t0 = 0; t0 < tokens; t0 += group) {
    const int64_t n = std::min(group, tokens - t0);
    for (int64_t c = 0; c < stride; ++c) {
      FakeQuantGroup(x + t0 * stride + c, n, stride, spec.bits, spec.formula,
                     out + t0 * stride + c);
    }
  }
}

void CausalScores(const float* q, const float* k, int64_t tokens, int64_t head_dim, float scale,
                  float* scores) {
  for (int64_t i = 0; i < tokens; ++i) {
    const float* qi = q + i * head_dim;
    float* row = scores + i * tokens;
    for (int64_t j = 0; j <= i; ++j) row[j] = scale * Dot(qi, k + j * head_dim, head_dim);
  }
}

void CausalSoftmax(int64_t tokens, float* probs) {
  for (int64_t i = 0; i < tokens; ++i) {
    float* row = probs + i * tokens;
    const double lse = RowLse(row, i);
    for (int64_t j = 0; j <= i; ++j) row[j] = static_cast<float>(std::exp(row[j] - lse));
  }
}

void CausalOutput(const float* probs, const float* v, int64_t tokens, int64_t head_dim,
                  float* out) {
  for (int64_t i = 0; i < tokens; ++i) {
    float* o = out + i * head_dim;
    std::fill_n(o, head_dim, 0.0f);
    const float* row = probs + i * tokens;
    for (int64_t j = 0; j <= i; ++j) {
      const float p = row[j];
      const float* vj = v + j * head_dim;
      for (int64_t c = 0; c < head_dim; ++c) o[c] += p * vj[c];
    }
  }
}

std::vector<FakeQuantRow> StudyFakeQuantRows(const std::vector<int>& bits, int64_t kivi_group) {
  std::vector<FakeQuantRow> rows;
  const auto tok = QuantAxis::kToken, ch = QuantAxis::kChannel;
  // The write-up's groupings, in its order (kWriteupGroupings).
  const QuantAxis axes[4][2] = {{tok, tok}, {ch, ch}, {ch, tok}, {tok, ch}};
  for (int b : bits) {
    auto add = [&](std::string name, FakeQuantFamily family, QuantAxis k, QuantAxis v,
                   QuantFormula f, bool pre, int64_t group) {
      FakeQuantRow row;
      row.name = std::move(name);
      row.family = family;
      row.k_axis = k;
      row.v_axis = v;
      row.formula = f;
      row.k_pre_rope = pre;
      row.bits = b;
      row.token_group = group;
      row.channel_group = family == FakeQuantFamily::kWriteup ? 0 : group;
      rows.push_back(std::move(row));
    };
    for (int g = 0; g < 4; ++g) {
      add(std::string(kWriteupPrefix) + kWriteupGroupings[g], FakeQuantFamily::kWriteup, axes[g][0],
          axes[g][1], QuantFormula::kLiteralWriteup, false, 0);
    }
    for (int g = 0; g < 4; ++g) {
      add(std::string(kCorrectedPrefix) + kWriteupGroupings[g], FakeQuantFamily::kCorrected,
          axes[g][0], axes[g][1], QuantFormula::kAsymmetric, false, kivi_group);
    }
    add("K per-channel pre-RoPE, V per-token (KVQuant-style)", FakeQuantFamily::kKvQuant, ch, tok,
        QuantFormula::kAsymmetric, true, kivi_group);
  }
  return rows;
}

Status RunFakeQuant(const StudyCapture& capture, const FakeQuantOptions& options,
                    std::vector<FakeQuantRow>* rows,
                    const std::function<void(int64_t, int64_t)>& on_layer) {
  const KvShape& s = capture.shape;
  const int64_t T = capture.tokens, d = s.head_dim;
  if (T < 1 || s.num_kv_heads < 1 || s.num_heads % s.num_kv_heads != 0) {
    return Status::Error("fake quant: empty capture or bad head counts");
  }
  std::vector<KChoice> k_choices;
  std::vector<VChoice> v_choices;
  std::vector<size_t> row_k, row_v;  // [rows] indices into the choices
  for (const FakeQuantRow& r : *rows) {
    if (r.bits < 1 || r.bits > 16) return Status::Error("fake quant: bits must be 1..16");
    if (r.k_pre_rope && !options.rope) {
      return Status::Error("fake quant: a pre-RoPE row needs the model's RoPE");
    }
    if (r.token_group < 0 || r.channel_group < 0) {
      return Status::Error("fake quant: groups must be >= 0");
    }
    row_k.push_back(IndexOf(
        k_choices, KChoice{r.k_axis, r.formula, r.k_pre_rope, r.bits, GroupFor(r.k_axis, r)}));
    row_v.push_back(
        IndexOf(v_choices, VChoice{r.v_axis, r.formula, r.bits, GroupFor(r.v_axis, r)}));
  }
  const int64_t kv_elems = T * s.num_kv_heads * d;
  std::vector<Sums> total(rows->size());
  std::vector<std::vector<Sums>> per_layer(rows->size(), std::vector<Sums>(s.num_layers));
  std::vector<std::vector<float>> k_q(k_choices.size()), v_q(v_choices.size());  // [T, kvh, d]
  std::vector<std::vector<Sums>> head_sums(s.num_heads);  // [heads][rows], one layer
  ThreadPool pool(options.threads);
  std::vector<HeadBuffers> buffers;  // [pool threads]
  buffers.reserve(static_cast<size_t>(pool.size()));
  for (int t = 0; t < pool.size(); ++t) buffers.emplace_back(T, d);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const LayerCapture& c = capture.layers[l];
    for (size_t i = 0; i < k_choices.size(); ++i) {
      const KChoice& kc = k_choices[i];
      const QuantSpec spec = SpecFor(kc.axis, kc.bits, kc.formula, kc.group);
      k_q[i].resize(kv_elems);
      FakeQuantize(kc.pre_rope ? c.k_pre_rope.data() : c.k.data(), T, s.num_kv_heads, d, spec,
                   k_q[i].data());
      if (kc.pre_rope) options.rope(k_q[i].data(), T, s.num_kv_heads);
    }
    for (size_t i = 0; i < v_choices.size(); ++i) {
      const VChoice& vc = v_choices[i];
      const QuantSpec spec = SpecFor(vc.axis, vc.bits, vc.formula, vc.group);
      v_q[i].resize(kv_elems);
      FakeQuantize(c.v.data(), T, s.num_kv_heads, d, spec, v_q[i].data());
    }
    const HeadPassInputs in{c, k_q, v_q, row_k, row_v, s, T};
    // Heads in parallel, each into its own sums; they are added in head
    // order below, so the result does not depend on the thread count.
    pool.ForEach(s.num_heads, Schedule::kDynamic, [&](int64_t h, int thread) {
      head_sums[h] = HeadPass(in, h, buffers[static_cast<size_t>(thread)]);
    });
    for (int64_t h = 0; h < s.num_heads; ++h) {
      for (size_t r = 0; r < rows->size(); ++r) {
        for (Sums* sums : {&total[r], &per_layer[r][l]}) sums->Add(head_sums[h][r]);
      }
    }
    if (on_layer) on_layer(l + 1, s.num_layers);
  }
  for (size_t r = 0; r < rows->size(); ++r) {
    FakeQuantRow& row = (*rows)[r];
    row.overall = total[r].Metrics();
    row.per_layer.clear();
    for (int64_t l = 0; l < s.num_layers; ++l) row.per_layer.push_back(per_layer[r][l].Metrics());
  }
  return Status::Ok();
}

}  // namespace kvq
