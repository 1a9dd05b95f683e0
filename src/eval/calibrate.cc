#include "eval/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "eval/perplexity.h"
#include "io/safetensors.h"
#include "kv/kv_factory.h"

namespace kvq {
namespace {

// Wraps the f32 cache the model runs on and records, per layer, what the
// cache receives (pre-RoPE K, V) and the key-channel sensitivity from q.
class CaptureCache final : public KvCache {
 public:
  CaptureCache(std::unique_ptr<KvCache> inner, const KvShape& shape, int64_t context)
      : inner_(std::move(inner)), shape_(shape) {
    const int64_t dim = shape.head_dim, half = dim / 2;
    k_.resize(static_cast<size_t>(shape.num_layers));
    v_.resize(static_cast<size_t>(shape.num_layers));
    k_amax_.assign(static_cast<size_t>(shape.num_layers), 0.0f);
    v_amax_.assign(static_cast<size_t>(shape.num_layers), 0.0f);
    k_post_.resize(static_cast<size_t>(shape.num_layers));
    qq_sum_.assign(static_cast<size_t>(shape.num_layers * shape.num_kv_heads * dim * dim), 0.0);
    weight_sum_.assign(static_cast<size_t>(shape.num_layers * shape.num_kv_heads * dim), 0.0);
    weight_count_.assign(static_cast<size_t>(shape.num_layers * shape.num_kv_heads), 0.0);
    // Means over delta = 0..i of cos^2, sin*cos of theta_p * delta: [context, half].
    mean_cos2_.resize(static_cast<size_t>(context * half));
    mean_sincos_.resize(static_cast<size_t>(context * half));
    for (int64_t p = 0; p < half; ++p) {
      double cos2 = 0, sincos = 0;
      for (int64_t i = 0; i < context; ++i) {
        const double angle = static_cast<double>(shape.rope_inv_freq[p]) * i;
        cos2 += std::cos(angle) * std::cos(angle);
        sincos += std::sin(angle) * std::cos(angle);
        mean_cos2_[i * half + p] = cos2 / (i + 1);
        mean_sincos_[i * half + p] = sincos / (i + 1);
      }
    }
  }

  Status AddSequence(SeqId seq) override { return inner_->AddSequence(seq); }
  void ReleaseSequence(SeqId seq) override { inner_->ReleaseSequence(seq); }
  Status Fork(SeqId src, SeqId dst) override { return inner_->Fork(src, dst); }
  Status Truncate(SeqId seq, int64_t length) override { return inner_->Truncate(seq, length); }
  int64_t Length(SeqId seq, int64_t layer) const override { return inner_->Length(seq, layer); }
  int64_t Capacity(SeqId seq) const override { return inner_->Capacity(seq); }
  size_t BytesUsed() const override { return inner_->BytesUsed(); }
  KvUsage Usage() const override { return inner_->Usage(); }
  const char* TypeName() const override { return inner_->TypeName(); }

  Status Append(SeqId seq, int64_t layer, int64_t n, const float* k_pre_rope, const float* k,
                const float* v) override {
    const int64_t row = shape_.num_kv_heads * shape_.head_dim;
    // vLLM's per-tensor fp8 scales see every token as the cache stores it
    // (post-RoPE K, V, position 0 included), as llm-compressor's observer does.
    float& k_amax = k_amax_[static_cast<size_t>(layer)];
    float& v_amax = v_amax_[static_cast<size_t>(layer)];
    for (int64_t i = 0; i < n * row; ++i) {
      k_amax = std::fmax(k_amax, std::fabs(k[i]));  // fmax: a NaN does not win
      v_amax = std::fmax(v_amax, std::fabs(v[i]));
    }
    const int64_t start = inner_->Length(seq, layer);
    // Position 0 stays in f16 in the schemes (sink): not calibrated.
    const int64_t skip = start == 0 ? 1 : 0;
    if (n > skip) {
      auto& ks = k_[static_cast<size_t>(layer)];
      auto& vs = v_[static_cast<size_t>(layer)];
      ks.insert(ks.end(), k_pre_rope + skip * row, k_pre_rope + n * row);
      vs.insert(vs.end(), v + skip * row, v + n * row);
      auto& kp = k_post_[static_cast<size_t>(layer)];
      kp.insert(kp.end(), k + skip * row, k + n * row);
    }
    return inner_->Append(seq, layer, n, k_pre_rope, k, v);
  }

  Status Attend(SeqId seq, int64_t layer, int64_t n, const float* q, float scale,
                float* out) const override {
    AccumulateSensitivity(seq, layer, n, q);
    AccumulateQueryCovariance(layer, n, q);
    return inner_->Attend(seq, layer, n, q, scale, out);
  }

  // Post-RoPE K as captured: [rows, kv_heads, head_dim] per layer.
  const std::vector<std::vector<float>>& k_post() const { return k_post_; }
  // OSCAR's "qqt": E[q qᵀ] over the (post-RoPE) queries of the heads of KV
  // head g in `layer`, every position: [head_dim, head_dim].
  std::vector<double> QueryCovariance(int64_t layer, int64_t g) const {
    const int64_t dim = shape_.head_dim, group = shape_.num_heads / shape_.num_kv_heads;
    const size_t size = static_cast<size_t>(dim * dim);
    const auto* sum = &qq_sum_[static_cast<size_t>(layer * shape_.num_kv_heads + g) * size];
    const double count = qq_count_[static_cast<size_t>(layer)] * static_cast<double>(group);
    std::vector<double> cov(sum, sum + size);
    for (double& c : cov) c = count > 0 ? c / count : 0.0;
    return cov;
  }

  // [num_layers][rows * kv_heads * head_dim] as captured (position 0 skipped).
  const std::vector<std::vector<float>>& k() const { return k_; }
  const std::vector<float>& k_amax() const { return k_amax_; }
  const std::vector<float>& v_amax() const { return v_amax_; }
  const std::vector<std::vector<float>>& v() const { return v_; }
  // Mean sensitivity of each (KV head, channel) of `layer`: [kv_heads, head_dim].
  std::vector<float> KeyWeights(int64_t layer) const {
    const int64_t dim = shape_.head_dim, kv_heads = shape_.num_kv_heads;
    std::vector<float> w(static_cast<size_t>(kv_heads * dim));
    for (int64_t g = 0; g < kv_heads; ++g) {
      const double count = weight_count_[layer * kv_heads + g];
      for (int64_t c = 0; c < dim; ++c) {
        const double sum = weight_sum_[(layer * kv_heads + g) * dim + c];
        w[g * dim + c] = count > 0 ? static_cast<float>(sum / count) : 1.0f;
      }
    }
    return w;
  }

 private:
  // See calibrate.h: E[(R(i - t) q_pre(i))_c^2] over heads, queries, t <= i.
  void AccumulateSensitivity(SeqId seq, int64_t layer, int64_t n, const float* q) const {
    const int64_t dim = shape_.head_dim, half = dim / 2, heads = shape_.num_heads;
    const int64_t group = heads / shape_.num_kv_heads;
    const int64_t total = inner_->Length(seq, layer);
    const int64_t context = static_cast<int64_t>(mean_cos2_.size()) / half;
    const bool pairs = shape_.rope_layout == ops::RopeLayout::kPairs;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = std::min(total - n + j, context - 1);
      for (int64_t h = 0; h < heads; ++h) {
        const float* qr = q + (j * heads + h) * dim;
        double* sum = &weight_sum_[(layer * shape_.num_kv_heads + h / group) * dim];
        for (int64_t p = 0; p < half; ++p) {
          const int64_t a = pairs ? 2 * p : p, b = pairs ? 2 * p + 1 : p + half;
          // Undo the query's own rotation: q_pre = R(-pos) q_rot.
          const double angle = static_cast<double>(shape_.rope_inv_freq[p]) * (total - n + j);
          const double cs = std::cos(angle), sn = std::sin(angle);
          const double qa = qr[a] * cs + qr[b] * sn, qb = qr[b] * cs - qr[a] * sn;
          const double c2 = mean_cos2_[pos * half + p], s2 = 1.0 - c2;
          const double x = mean_sincos_[pos * half + p];
          sum[a] += c2 * qa * qa + s2 * qb * qb - 2 * x * qa * qb;
          sum[b] += c2 * qb * qb + s2 * qa * qa + 2 * x * qa * qb;
        }
        weight_count_[layer * shape_.num_kv_heads + h / group] += 1.0;
      }
    }
  }

  void AccumulateQueryCovariance(int64_t layer, int64_t n, const float* q) const {
    const int64_t dim = shape_.head_dim, heads = shape_.num_heads;
    const int64_t group = heads / shape_.num_kv_heads;
    if (qq_count_.empty()) qq_count_.assign(static_cast<size_t>(shape_.num_layers), 0.0);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t h = 0; h < heads; ++h) {
        const float* qr = q + (j * heads + h) * dim;
        double* sum =
            &qq_sum_[static_cast<size_t>((layer * shape_.num_kv_heads + h / group) * dim * dim)];
        for (int64_t a = 0; a < dim; ++a) {
          const double qa = qr[a];
          for (int64_t b = 0; b < dim; ++b) sum[a * dim + b] += qa * qr[b];
        }
      }
    }
    qq_count_[static_cast<size_t>(layer)] += static_cast<double>(n);
  }

  std::unique_ptr<KvCache> inner_;
  KvShape shape_;
  std::vector<std::vector<float>> k_, v_, k_post_;
  std::vector<float> k_amax_, v_amax_;           // [layers] over every appended row
  mutable std::vector<double> qq_sum_;           // [layers, kv_heads, head_dim, head_dim]
  mutable std::vector<double> qq_count_;         // [layers] query tokens seen
  std::vector<double> mean_cos2_, mean_sincos_;  // [context, head_dim / 2]
  // Attend is const in the interface; the statistics are this wrapper's own.
  mutable std::vector<double> weight_sum_;    // [layers, kv_heads, head_dim]
  mutable std::vector<double> weight_count_;  // [layers, kv_heads]
};

// Squared gradients from tools/train/kvquant_fisher.py: "k.L" / "v.L"
// [rows, kv_heads, head_dim] in capture order, "tokens" the ids it ran on.
StatusOr<std::vector<std::vector<float>>> ReadFisher(const SafetensorsFile& file, const char* side,
                                                     const std::vector<std::vector<float>>& x,
                                                     const KvShape& shape) {
  std::vector<std::vector<float>> out(x.size());
  for (size_t l = 0; l < x.size(); ++l) {
    const std::string name = std::string(side) + "." + std::to_string(l);
    const TensorRef* t = file.Find(name);
    const int64_t rows = static_cast<int64_t>(x[l].size()) / (shape.num_kv_heads * shape.head_dim);
    const std::vector<int64_t> want{rows, shape.num_kv_heads, shape.head_dim};
    if (t == nullptr || t->dtype != DType::kF32 || t->shape != want) {
      return Status::Error(file.name() + ": Fisher tensor '" + name + "' missing or not F32 " +
                           ShapeString(want) + " (same --tokens and --ctx as this run?)");
    }
    out[l].resize(x[l].size());
    std::memcpy(out[l].data(), t->data, out[l].size() * sizeof(float));
  }
  return out;
}

Status CheckFisherTokens(const SafetensorsFile& file, const std::vector<int32_t>& fed) {
  const TensorRef* t = file.Find("tokens");
  const std::vector<int64_t> want{static_cast<int64_t>(fed.size())};
  if (t == nullptr || t->dtype != DType::kF32 || t->shape != want) {
    return Status::Error(file.name() + ": Fisher file has no 'tokens' F32 " + ShapeString(want) +
                         " (made for other --tokens or --ctx?)");
  }
  for (size_t i = 0; i < fed.size(); ++i) {
    float id;
    std::memcpy(&id, t->data + i * sizeof(float), sizeof(float));
    if (id != static_cast<float>(fed[i])) {
      return Status::Error(file.name() + ": Fisher file was made from other tokens (position " +
                           std::to_string(i) + ": " + std::to_string(static_cast<int64_t>(id)) +
                           ", this text " + std::to_string(fed[i]) + ")");
    }
  }
  return Status::Ok();
}

// OSCAR's covariances for one (layer, KV head) (eval/calibrate.h):
// K: "qqt" E[q qᵀ] or "ktk" E[k kᵀ]; V: "sst" E[w v vᵀ] with w = k Σ_q kᵀ
// normalized to mean 1, or "vtv" E[v vᵀ]. x: [rows, kv_heads, dim].
std::vector<double> SecondMoment(const std::vector<float>& x, int64_t kv_heads, int64_t dim,
                                 int64_t g, const std::vector<double>* weights) {
  const int64_t rows = static_cast<int64_t>(x.size()) / (kv_heads * dim);
  std::vector<double> cov(static_cast<size_t>(dim * dim), 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    const float* r = &x[static_cast<size_t>((t * kv_heads + g) * dim)];
    const double w = weights != nullptr ? (*weights)[static_cast<size_t>(t)] : 1.0;
    for (int64_t a = 0; a < dim; ++a) {
      const double ra = w * r[a];
      for (int64_t b = 0; b < dim; ++b) cov[a * dim + b] += ra * r[b];
    }
  }
  for (double& c : cov) c = rows > 0 ? c / static_cast<double>(rows) : 0.0;
  return cov;
}

Status FitRotations(const CaptureCache& cache, const KvShape& shape, const std::string& objective,
                    KvCalibration* c) {
  const int64_t kv_heads = shape.num_kv_heads, dim = shape.head_dim;
  const bool attention_aware = objective == "qqt_sst";
  const size_t size = static_cast<size_t>(dim * dim);
  c->k_rotation.assign(static_cast<size_t>(shape.num_layers * kv_heads) * size, 0.0f);
  c->v_rotation.assign(c->k_rotation.size(), 0.0f);
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    const std::vector<float>& k = cache.k_post()[static_cast<size_t>(l)];
    const std::vector<float>& v = cache.v()[static_cast<size_t>(l)];
    const int64_t rows = static_cast<int64_t>(k.size()) / (kv_heads * dim);
    for (int64_t g = 0; g < kv_heads; ++g) {
      const std::vector<double> cov_q = cache.QueryCovariance(l, g);
      std::vector<double> cov_k =
          attention_aware ? cov_q : SecondMoment(k, kv_heads, dim, g, nullptr);
      std::vector<double> weights;
      if (attention_aware) {  // w_t = k_t Σ_q k_tᵀ, mean 1
        weights.resize(static_cast<size_t>(rows));
        double total = 0;
        for (int64_t t = 0; t < rows; ++t) {
          const float* kt = &k[static_cast<size_t>((t * kv_heads + g) * dim)];
          double w = 0;
          for (int64_t a = 0; a < dim; ++a) {
            double row = 0;
            for (int64_t b = 0; b < dim; ++b) row += cov_q[a * dim + b] * kt[b];
            w += kt[a] * row;
          }
          weights[static_cast<size_t>(t)] = std::max(w, 0.0);
          total += weights[static_cast<size_t>(t)];
        }
        for (double& w : weights) w = total > 0 ? w * static_cast<double>(rows) / total : 1.0;
      }
      const std::vector<double> cov_v =
          SecondMoment(v, kv_heads, dim, g, attention_aware ? &weights : nullptr);
      const std::string where = "layer " + std::to_string(l) + ", KV head " + std::to_string(g);
      auto mk = FitOscarRotation(cov_k, dim);
      if (!mk.ok()) return mk.status().WithContext(where + " K");
      auto mv = FitOscarRotation(cov_v, dim);
      if (!mv.ok()) return mv.status().WithContext(where + " V");
      const size_t at = static_cast<size_t>(l * kv_heads + g) * size;
      std::copy(mk->begin(), mk->end(), c->k_rotation.begin() + static_cast<std::ptrdiff_t>(at));
      std::copy(mv->begin(), mv->end(), c->v_rotation.begin() + static_cast<std::ptrdiff_t>(at));
    }
  }
  c->rotation_objective = objective;
  return Status::Ok();
}

Status CheckCalibrateOptions(const CalibrateOptions& options, const KvShape& shape,
                             int64_t model_context) {
  if (options.bits.empty()) return Status::Error("calibrate: no bit widths");
  for (int bits : options.bits) {
    if (bits < 2 || bits > 4) {
      return Status::Error("calibrate: bits " + std::to_string(bits) + " not 2, 3 or 4");
    }
  }
  if (options.outlier_percent < 0 || options.outlier_percent > 10) {
    return Status::Error("calibrate: --outliers must be 0 to 10 percent");
  }
  if (options.context < 2 || options.context > model_context) {
    return Status::Error("calibrate: --ctx " + std::to_string(options.context) +
                         " outside [2, the model's context of " + std::to_string(model_context) +
                         "]");
  }
  if (options.rotation != "qqt_sst" && options.rotation != "ktk_vtv" &&
      options.rotation != "none") {
    return Status::Error("calibrate: --rotation '" + options.rotation +
                         "' is not qqt_sst, ktk_vtv or none");
  }
  if (options.weights != "q2" && options.weights != "uniform") {
    return Status::Error("calibrate: --weights '" + options.weights + "' is not q2 or uniform");
  }
  if (static_cast<int64_t>(shape.rope_inv_freq.size()) * 2 != shape.head_dim) {
    return Status::Error("calibrate: the model's RoPE parameters are unknown");
  }
  return Status::Ok();
}

// Runs `windows` windows of the tokens through the model into `cache`, each
// starting with BOS when the model uses one; returns the tokens as fed
// ([windows * context]).
StatusOr<std::vector<int32_t>> CaptureWindows(LoadedModel& model,
                                              const std::vector<int32_t>& tokens, int64_t windows,
                                              int64_t context, CaptureCache& cache) {
  std::vector<float> logits;
  const Tokenizer& tok = *model.tokenizer;
  std::vector<int32_t> fed;
  for (int64_t w = 0; w < windows; ++w) {
    std::vector<int32_t> window(tokens.begin() + w * context, tokens.begin() + (w + 1) * context);
    if (tok.add_bos() && tok.bos_id() >= 0) window[0] = tok.bos_id();
    fed.insert(fed.end(), window.begin(), window.end());
    KVQ_RETURN_IF_ERROR(cache.AddSequence(0));
    const Status forward = model.transformer->Forward({{0, window, false}}, cache, &logits);
    cache.ReleaseSequence(0);
    KVQ_RETURN_IF_ERROR(forward);
  }
  return fed;
}

// Per-element k-means weights from a --fisher file (empty without one).
struct FisherWeights {
  std::vector<std::vector<float>> k, v;  // [layer][rows * kv_heads * head_dim]
};

// Every --bits codebook of every layer's K and V, k-means weighted by the
// Fisher file, by the keys' expected squared query component (q2), or
// uniformly.
Status FitCodebooks(const CaptureCache& cache, const KvShape& shape,
                    const CalibrateOptions& options, const FisherWeights& fisher,
                    KvCalibration* c) {
  const int64_t heads = shape.num_kv_heads, dim = shape.head_dim;
  const size_t per_layer = static_cast<size_t>(heads * dim);
  for (int bits : options.bits) {
    KvCalibration::Codebooks& books = c->codebooks[bits];
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      const std::vector<float> key_weights = cache.KeyWeights(l);
      for (bool is_v : {false, true}) {
        const std::vector<float>& x = (is_v ? cache.v() : cache.k())[static_cast<size_t>(l)];
        NuqFitInput in;
        in.bits = bits;
        in.is_v = is_v;
        in.outlier_percent = options.outlier_percent;
        in.n = static_cast<int64_t>(x.size()) / (heads * dim);
        in.kv_heads = heads;
        in.head_dim = dim;
        in.x = x.data();
        in.k_offset = &c->k_offset[l * per_layer];
        in.k_scale = &c->k_scale[l * per_layer];
        if (!options.fisher_path.empty()) {
          in.element_weight = (is_v ? fisher.v : fisher.k)[static_cast<size_t>(l)].data();
        } else if (!is_v && options.weights == "q2") {
          in.channel_weight = key_weights.data();
        }
        in.qnorm = options.qnorm;
        auto levels = FitNuqLevels(in);
        if (!levels.ok()) {
          return levels.status().WithContext("layer " + std::to_string(l) + (is_v ? " V" : " K"));
        }
        std::vector<float>& dst = is_v ? books.v : books.k;
        dst.insert(dst.end(), levels->begin(), levels->end());
      }
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<CalibrateResult> CalibrateKv(LoadedModel& model, const std::string& text,
                                      const CalibrateOptions& options) {
  return CalibrateKvTokens(model, PerplexityTokens(model, text), options);
}

StatusOr<CalibrateResult> CalibrateKvTokens(LoadedModel& model, const std::vector<int32_t>& tokens,
                                            const CalibrateOptions& options) {
  const KvShape shape = model.transformer->kv_shape();
  KVQ_RETURN_IF_ERROR(
      CheckCalibrateOptions(options, shape, model.transformer->config().max_position_embeddings));
  const int64_t available = static_cast<int64_t>(tokens.size()) / options.context;
  if (available == 0) {
    return Status::Error("calibrate: the text has " + std::to_string(tokens.size()) +
                         " tokens, fewer than one window of --ctx " +
                         std::to_string(options.context));
  }
  const int64_t windows =
      std::min(available, std::max<int64_t>(1, options.tokens / options.context));

  KvCacheOptions cache_options;
  cache_options.k_type = cache_options.v_type = "f32";
  cache_options.max_tokens = options.context;
  cache_options.num_threads = 1;
  KVQ_ASSIGN_OR_RETURN(auto inner, MakeKvCache(shape, cache_options));
  CaptureCache cache(std::move(inner), shape, options.context);
  KVQ_ASSIGN_OR_RETURN(const std::vector<int32_t> fed,
                       CaptureWindows(model, tokens, windows, options.context, cache));

  CalibrateResult result;
  result.windows = windows;
  KvCalibration& c = result.calibration;
  c.num_layers = shape.num_layers;
  c.num_heads = shape.num_heads;
  c.num_kv_heads = shape.num_kv_heads;
  c.head_dim = shape.head_dim;
  c.tokens = windows * (options.context - 1);
  c.outlier_percent = options.outlier_percent;
  c.qnorm = options.qnorm;
  c.model = model.path;
  c.method = options.fisher_path.empty() ? options.weights : "fisher";
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    c.fp8_k_scale.push_back(Fp8E4M3TensorScale(cache.k_amax()[static_cast<size_t>(l)]));
    c.fp8_v_scale.push_back(Fp8E4M3TensorScale(cache.v_amax()[static_cast<size_t>(l)]));
  }
  FisherWeights fisher;
  if (!options.fisher_path.empty()) {
    KVQ_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(options.fisher_path));
    KVQ_RETURN_IF_ERROR(CheckFisherTokens(*file, fed));
    KVQ_ASSIGN_OR_RETURN(fisher.k, ReadFisher(*file, "k", cache.k(), shape));
    KVQ_ASSIGN_OR_RETURN(fisher.v, ReadFisher(*file, "v", cache.v(), shape));
  }
  const int64_t heads = shape.num_kv_heads, dim = shape.head_dim;
  const size_t per_layer = static_cast<size_t>(heads * dim);
  c.k_offset.resize(static_cast<size_t>(shape.num_layers) * per_layer);
  c.k_scale.resize(c.k_offset.size());
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    const std::vector<float>& k = cache.k()[static_cast<size_t>(l)];
    const int64_t rows = static_cast<int64_t>(k.size()) / (heads * dim);
    KeyChannelRanges(k.data(), rows, heads, dim, options.outlier_percent,
                     &c.k_offset[l * per_layer], &c.k_scale[l * per_layer]);
  }
  KVQ_RETURN_IF_ERROR(FitCodebooks(cache, shape, options, fisher, &c));
  // OSCAR's rotations need a power-of-two head_dim (the Hadamard factor);
  // other models get a file without them (the NUQ part still works).
  const bool power_of_two = dim >= 2 && dim <= 256 && (dim & (dim - 1)) == 0;
  if (options.rotation != "none" && power_of_two) {
    KVQ_RETURN_IF_ERROR(FitRotations(cache, shape, options.rotation, &c));
  }
  return result;
}

}  // namespace kvq
