#include "model/transformer.h"

#include <cmath>
#include <string>

#include "ops/elementwise.h"
#include "ops/matvec.h"
#include "ops/rope.h"

namespace kvq {

ops::WeightType ToWeightType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ops::WeightType::kF32;
    case DType::kF16:
      return ops::WeightType::kF16;
    case DType::kBF16:
      return ops::WeightType::kBF16;
    case DType::kQ8_0:
      return ops::WeightType::kQ8_0;
    case DType::kQ4_0:
      return ops::WeightType::kQ4_0;
    case DType::kQ4_1:
      return ops::WeightType::kQ4_1;
    case DType::kQ5_0:
      return ops::WeightType::kQ5_0;
    case DType::kQ5_1:
      return ops::WeightType::kQ5_1;
    case DType::kIQ4_NL:
      return ops::WeightType::kIQ4_NL;
    case DType::kQ2_K:
      return ops::WeightType::kQ2_K;
    case DType::kQ3_K:
      return ops::WeightType::kQ3_K;
    case DType::kQ4_K:
      return ops::WeightType::kQ4_K;
    case DType::kQ5_K:
      return ops::WeightType::kQ5_K;
    case DType::kQ6_K:
      return ops::WeightType::kQ6_K;
  }
  return ops::WeightType::kF32;
}

namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Binds a 2-D tensor [rows, cols] as a weight view, checking its shape.
StatusOr<ops::WeightView> BindMatrix(const ModelFiles& files, const std::string& name, int64_t rows,
                                     int64_t cols) {
  const TensorRef* t = files.Find(name);
  if (t == nullptr) return Status::Error("missing tensor '" + name + "'");
  if (t->shape != std::vector<int64_t>{rows, cols}) {
    return Status::Error("tensor '" + name + "' has shape " + ShapeString(t->shape) +
                         ", the config implies " + ShapeString({rows, cols}));
  }
  ops::WeightView view{ToWeightType(t->dtype), rows, cols, t->data};
  KVQ_RETURN_IF_ERROR(ops::ValidateWeightView(view).WithContext("tensor '" + name + "'"));
  return view;
}

// Decodes a 1-D tensor of `size` values to f32; absent optional tensors give
// an empty vector.
StatusOr<std::vector<float>> LoadVector(const ModelFiles& files, const std::string& name,
                                        int64_t size, bool required) {
  const TensorRef* t = files.Find(name);
  if (t == nullptr) {
    if (required) return Status::Error("missing tensor '" + name + "'");
    return std::vector<float>();
  }
  if (t->shape != std::vector<int64_t>{size}) {
    return Status::Error("tensor '" + name + "' has shape " + ShapeString(t->shape) +
                         ", the config implies " + ShapeString({size}));
  }
  ops::WeightView row{ToWeightType(t->dtype), 1, size, t->data};
  KVQ_RETURN_IF_ERROR(ops::ValidateWeightView(row).WithContext("tensor '" + name + "'"));
  std::vector<float> values(static_cast<size_t>(size));
  ops::DequantizeRows(row, 0, 1, values.data());
  return values;
}

void AddInPlace(const float* y, int64_t count, float* x) {
  for (int64_t i = 0; i < count; ++i) x[i] += y[i];
}

}  // namespace

StatusOr<std::unique_ptr<Transformer>> Transformer::Create(ModelFiles files, int num_threads,
                                                           ops::DecodeArith arith) {
  std::unique_ptr<Transformer> model(new Transformer());
  model->files_ = std::move(files);
  model->pool_ = std::make_unique<ThreadPool>(num_threads);
  model->arith_ = arith;
  const ModelConfig& c = model->files_.config;
  const ModelFiles& f = model->files_;
  if (c.num_heads <= 0 || c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    return Status::Error("num_attention_heads (" + std::to_string(c.num_heads) +
                         ") must be a positive multiple of num_key_value_heads (" +
                         std::to_string(c.num_kv_heads) + ")");
  }
  const int64_t hidden = c.hidden_size, q_dim = c.num_heads * c.head_dim,
                kv_dim = c.num_kv_heads * c.head_dim, ffn = c.intermediate_size;
  TransformerWeights& w = model->weights_;
  KVQ_ASSIGN_OR_RETURN(w.token_embd, BindMatrix(f, "token_embd.weight", c.vocab_size, hidden));
  if (f.Find("output.weight") != nullptr) {
    KVQ_ASSIGN_OR_RETURN(w.output, BindMatrix(f, "output.weight", c.vocab_size, hidden));
  } else {
    w.output = w.token_embd;  // tied embeddings
  }
  KVQ_ASSIGN_OR_RETURN(w.output_norm, LoadVector(f, "output_norm.weight", hidden, true));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights layer;
    KVQ_ASSIGN_OR_RETURN(layer.attn_q, BindMatrix(f, p + "attn_q.weight", q_dim, hidden));
    KVQ_ASSIGN_OR_RETURN(layer.attn_k, BindMatrix(f, p + "attn_k.weight", kv_dim, hidden));
    KVQ_ASSIGN_OR_RETURN(layer.attn_v, BindMatrix(f, p + "attn_v.weight", kv_dim, hidden));
    KVQ_ASSIGN_OR_RETURN(layer.attn_output, BindMatrix(f, p + "attn_output.weight", hidden, q_dim));
    KVQ_ASSIGN_OR_RETURN(layer.ffn_gate, BindMatrix(f, p + "ffn_gate.weight", ffn, hidden));
    KVQ_ASSIGN_OR_RETURN(layer.ffn_up, BindMatrix(f, p + "ffn_up.weight", ffn, hidden));
    KVQ_ASSIGN_OR_RETURN(layer.ffn_down, BindMatrix(f, p + "ffn_down.weight", hidden, ffn));
    KVQ_ASSIGN_OR_RETURN(layer.attn_norm, LoadVector(f, p + "attn_norm.weight", hidden, true));
    KVQ_ASSIGN_OR_RETURN(layer.ffn_norm, LoadVector(f, p + "ffn_norm.weight", hidden, true));
    KVQ_ASSIGN_OR_RETURN(layer.q_bias, LoadVector(f, p + "attn_q.bias", q_dim, c.attention_bias));
    KVQ_ASSIGN_OR_RETURN(layer.k_bias, LoadVector(f, p + "attn_k.bias", kv_dim, c.attention_bias));
    KVQ_ASSIGN_OR_RETURN(layer.v_bias, LoadVector(f, p + "attn_v.bias", kv_dim, c.attention_bias));
    w.layers.push_back(std::move(layer));
  }
  KVQ_ASSIGN_OR_RETURN(OpsRope rope, MakeOpsRope(c));
  model->inv_freq_ = std::move(rope.inv_freq);
  model->rope_layout_ = rope.layout;
  // One decoded token's activations, allocated once here.
  model->act_.Resize(1, c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim,
                     c.intermediate_size);
  model->act_.rows.resize(static_cast<size_t>(c.hidden_size));
  return model;
}

KvShape Transformer::kv_shape() const {
  const ModelConfig& c = config();
  KvShape shape{c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim};
  shape.rope_layout = rope_layout_;
  shape.rope_inv_freq = inv_freq_;
  return shape;
}

int64_t Transformer::WeightBytesPerToken() const {
  int64_t bytes = weights_.output.bytes();
  for (const LayerWeights& l : weights_.layers) {
    for (const ops::WeightView* w :
         {&l.attn_q, &l.attn_k, &l.attn_v, &l.attn_output, &l.ffn_gate, &l.ffn_up, &l.ffn_down}) {
      bytes += w->bytes();
    }
  }
  return bytes;
}

Status Transformer::Forward(const std::vector<BatchSequence>& batch, KvCache& cache,
                            std::vector<float>* logits, const KvObserver* observer,
                            BatchArith batch_arith) {
  const ModelConfig& c = config();
  batch_arith_ = batch_arith;
  // Run state (act_) is reused across calls: sized at Create for one decoded
  // token, grown by the first larger batch, so decoding allocates nothing.
  KVQ_RETURN_IF_ERROR(FlattenBatch(batch, cache));
  const int64_t T = static_cast<int64_t>(act_.tokens.size());
  act_.Resize(T, c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim,
              c.intermediate_size);

  ops::Embed(weights_.token_embd, act_.tokens.data(), T, act_.x.data());
  for (int64_t l = 0; l < c.num_layers; ++l) {
    KVQ_RETURN_IF_ERROR(AttentionBlock(l, batch, cache, observer));
    FeedForwardBlock(l);
  }
  OutputHead(logits);
  return Status::Ok();
}

// Flattens the batch: token t of the whole batch has id tokens[t] at
// position positions[t] of its own sequence; output_rows lists the t whose
// logits are returned.
Status Transformer::FlattenBatch(const std::vector<BatchSequence>& batch, const KvCache& cache) {
  const int64_t vocab = config().vocab_size;
  act_.tokens.clear();
  act_.positions.clear();
  act_.output_rows.clear();
  act_.segments.clear();
  act_.output_segments.clear();
  for (const BatchSequence& s : batch) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    act_.segments.push_back(n);
    act_.output_segments.push_back(s.all_logits ? n : 1);
    if (n == 0) return Status::Error("sequence " + std::to_string(s.seq) + " has no tokens");
    if (n > cache.Capacity(s.seq)) {
      return Status::Error("sequence " + std::to_string(s.seq) + ": " + std::to_string(n) +
                           " tokens do not fit in the remaining context of " +
                           std::to_string(cache.Capacity(s.seq)) + " tokens");
    }
    const int64_t start = cache.Length(s.seq, 0);
    for (int64_t j = 0; j < n; ++j) {
      const int32_t id = s.tokens[j];
      if (id < 0 || id >= vocab) {
        return Status::Error("token id " + std::to_string(id) + " outside the vocabulary [0, " +
                             std::to_string(vocab) + ")");
      }
      if (s.all_logits || j == n - 1) {
        act_.output_rows.push_back(static_cast<int64_t>(act_.tokens.size()));
      }
      act_.tokens.push_back(id);
      act_.positions.push_back(static_cast<int32_t>(start + j));
    }
  }
  return Status::Ok();
}

// x += Wo · Attention(RoPE(Wq·norm(x)), RoPE(Wk·norm(x)), Wv·norm(x)), each
// sequence attending over its own cache after appending its new K/V.
Status Transformer::AttentionBlock(int64_t layer, const std::vector<BatchSequence>& batch,
                                   KvCache& cache, const KvObserver* observer) {
  const ModelConfig& c = config();
  const LayerWeights& w = weights_.layers[layer];
  const int64_t T = static_cast<int64_t>(act_.tokens.size());
  const int64_t hidden = c.hidden_size, head_dim = c.head_dim;
  const int64_t q_dim = c.num_heads * head_dim, kv_dim = c.num_kv_heads * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float>& x = act_.x;          // [T, hidden] residual stream
  std::vector<float>& xn = act_.xn;        // [T, hidden] normed input / sublayer output
  std::vector<float>& q = act_.q;          // [T, num_heads, head_dim]
  std::vector<float>& k_pre = act_.k_pre;  // [T, num_kv_heads, head_dim] before RoPE
  std::vector<float>& k = act_.k;          // [T, num_kv_heads, head_dim] after RoPE
  std::vector<float>& v = act_.v;          // [T, num_kv_heads, head_dim]
  std::vector<float>& attn = act_.attn;    // [T, num_heads, head_dim]

  ops::RmsNorm(x.data(), w.attn_norm.data(), T, hidden, c.rms_norm_eps, xn.data());
  Product(w.attn_q, xn.data(), T, q.data(), act_.segments);
  Product(w.attn_k, xn.data(), T, k_pre.data(), act_.segments);
  Product(w.attn_v, xn.data(), T, v.data(), act_.segments);
  if (!w.q_bias.empty()) ops::AddBias(w.q_bias.data(), T, q_dim, q.data());
  if (!w.k_bias.empty()) ops::AddBias(w.k_bias.data(), T, kv_dim, k_pre.data());
  if (!w.v_bias.empty()) ops::AddBias(w.v_bias.data(), T, kv_dim, v.data());
  k = k_pre;
  const int32_t* positions = act_.positions.data();
  ops::Rope(rope_layout_, inv_freq_.data(), positions, T, c.num_heads, head_dim, q.data());
  ops::Rope(rope_layout_, inv_freq_.data(), positions, T, c.num_kv_heads, head_dim, k.data());
  int64_t offset = 0;  // first batch token of the current sequence
  for (const BatchSequence& s : batch) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    const float* ks_pre = k_pre.data() + offset * kv_dim;
    const float* ks = k.data() + offset * kv_dim;
    const float* vs = v.data() + offset * kv_dim;
    if (observer != nullptr && observer->on_kv) observer->on_kv(s.seq, layer, n, ks_pre, ks, vs);
    if (observer != nullptr && observer->on_q) {
      observer->on_q(s.seq, layer, n, q.data() + offset * q_dim);
    }
    KVQ_RETURN_IF_ERROR(cache.Append(s.seq, layer, n, ks_pre, ks, vs));
    KVQ_RETURN_IF_ERROR(cache.Attend(s.seq, layer, n, q.data() + offset * q_dim, scale,
                                     attn.data() + offset * q_dim));
    offset += n;
  }
  Product(w.attn_output, attn.data(), T, xn.data(), act_.segments);
  AddInPlace(xn.data(), T * hidden, x.data());
  return Status::Ok();
}

// x += W_down · (silu(W_gate·norm(x)) * W_up·norm(x))
void Transformer::FeedForwardBlock(int64_t layer) {
  const ModelConfig& c = config();
  const LayerWeights& w = weights_.layers[layer];
  const int64_t T = static_cast<int64_t>(act_.tokens.size());
  const int64_t hidden = c.hidden_size;
  std::vector<float>& x = act_.x;        // [T, hidden] residual stream
  std::vector<float>& xn = act_.xn;      // [T, hidden] normed input / sublayer output
  std::vector<float>& gate = act_.gate;  // [T, intermediate]
  std::vector<float>& up = act_.up;      // [T, intermediate]
  ops::RmsNorm(x.data(), w.ffn_norm.data(), T, hidden, c.rms_norm_eps, xn.data());
  Product(w.ffn_gate, xn.data(), T, gate.data(), act_.segments);
  Product(w.ffn_up, xn.data(), T, up.data(), act_.segments);
  ops::SwiGlu(gate.data(), up.data(), T * c.intermediate_size, gate.data());
  Product(w.ffn_down, gate.data(), T, xn.data(), act_.segments);
  AddInPlace(xn.data(), T * hidden, x.data());
}

// logits = W_out · norm(x), only for the rows whose logits are wanted.
void Transformer::OutputHead(std::vector<float>* logits) {
  const ModelConfig& c = config();
  const int64_t hidden = c.hidden_size;
  const std::vector<int64_t>& output_rows = act_.output_rows;
  const int64_t R = static_cast<int64_t>(output_rows.size());
  std::vector<float>& rows = act_.rows;  // [R, hidden]
  rows.resize(static_cast<size_t>(R * hidden));
  for (int64_t r = 0; r < R; ++r) {
    std::copy_n(act_.x.data() + output_rows[r] * hidden, hidden, rows.data() + r * hidden);
  }
  ops::RmsNorm(rows.data(), weights_.output_norm.data(), R, hidden, c.rms_norm_eps, rows.data());
  logits->resize(static_cast<size_t>(R * c.vocab_size));
  Product(weights_.output, rows.data(), R, logits->data(), act_.output_segments);
}

void Transformer::Product(const ops::WeightView& w, const float* x, int64_t n, float* y,
                          const std::vector<int64_t>& segments) {
  if (batch_arith_ == BatchArith::kFastest) {
    return ops::Matmul(w, x, n, y, *pool_, &workspace_, arith_);
  }
  int64_t row = 0;  // first row of the current call
  for (size_t i = 0; i < segments.size();) {
    const float* xr = x + row * w.cols;
    float* yr = y + row * w.rows;
    if (segments[i] == 1) {  // a run of one-token sequences: rowwise together
      int64_t run = 0;
      for (; i < segments.size() && segments[i] == 1; ++i) ++run;
      ops::MatmulRowwise(w, xr, run, yr, *pool_, &workspace_, arith_);
      row += run;
    } else {  // a longer sequence: its own product, as it alone would run it
      ops::Matmul(w, xr, segments[i], yr, *pool_, &workspace_, arith_);
      row += segments[i++];
    }
  }
}

StatusOr<std::vector<std::vector<double>>> KBiasNorms(const ModelFiles& files) {
  const ModelConfig& c = files.config;
  std::vector<std::vector<double>> norms;  // [num_layers][num_kv_heads]
  if (!c.attention_bias) return norms;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    KVQ_ASSIGN_OR_RETURN(std::vector<float> bias,  // [num_kv_heads * head_dim]
                         LoadVector(files, "blk." + std::to_string(l) + ".attn_k.bias",
                                    c.num_kv_heads * c.head_dim, true));
    std::vector<double>& layer = norms.emplace_back(static_cast<size_t>(c.num_kv_heads), 0.0);
    for (int64_t i = 0; i < c.num_kv_heads * c.head_dim; ++i) {
      layer[i / c.head_dim] += static_cast<double>(bias[i]) * bias[i];
    }
    for (double& n : layer) n = std::sqrt(n);
  }
  return norms;
}

}  // namespace kvq
