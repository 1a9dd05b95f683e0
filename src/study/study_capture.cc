#include "study/study_capture.h"

#include <algorithm>
#include <memory>

#include "io/safetensors.h"
#include "kv/dense_cache.h"
#include "ops/rope.h"

namespace kvq {

StatusOr<StudyCapture> CaptureKv(LoadedModel& model, const std::vector<int32_t>& tokens,
                                 int64_t batch,
                                 const std::function<void(int64_t, int64_t)>& on_chunk) {
  Transformer& transformer = *model.transformer;
  const KvShape shape = transformer.kv_shape();
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 1) return Status::Error("capture: no tokens to run");
  if (batch < 1) return Status::Error("capture: batch must be at least 1");
  const int64_t model_context = transformer.config().max_position_embeddings;
  if (n > model_context) {
    return Status::Error("capture: " + std::to_string(n) +
                         " tokens exceed the model's context of " + std::to_string(model_context));
  }
  StudyCapture capture;
  capture.shape = shape;
  capture.tokens = n;
  capture.token_ids = tokens;
  capture.layers.resize(shape.num_layers);
  const int64_t q_dim = shape.num_heads * shape.head_dim;
  const int64_t kv_dim = shape.num_kv_heads * shape.head_dim;
  for (LayerCapture& layer : capture.layers) {
    layer.q.resize(n * q_dim);
    layer.k_pre_rope.resize(n * kv_dim);
    layer.k.resize(n * kv_dim);
    layer.v.resize(n * kv_dim);
  }
  // f32 storage: the capture is the truth every fake-quant row is compared
  // with, so later layers must not see f16-rounded attention.
  std::unique_ptr<KvCache> cache = MakeDenseKvCache(shape, DenseKvType::kF32, n, 1);
  const SeqId seq = 0;
  KVQ_RETURN_IF_ERROR(cache->AddSequence(seq));
  int64_t start = 0;  // first token of the current forward call
  KvObserver observer;
  observer.on_kv = [&](SeqId, int64_t layer, int64_t count, const float* k_pre, const float* k,
                       const float* v) {
    LayerCapture& c = capture.layers[layer];
    std::copy(k_pre, k_pre + count * kv_dim, c.k_pre_rope.begin() + start * kv_dim);
    std::copy(k, k + count * kv_dim, c.k.begin() + start * kv_dim);
    std::copy(v, v + count * kv_dim, c.v.begin() + start * kv_dim);
  };
  observer.on_q = [&](SeqId, int64_t layer, int64_t count, const float* q) {
    std::copy(q, q + count * q_dim, capture.layers[layer].q.begin() + start * q_dim);
  };
  std::vector<float> logits;
  for (; start < n; start += batch) {
    const int64_t count = std::min(batch, n - start);
    const std::vector<int32_t> chunk(tokens.begin() + start, tokens.begin() + start + count);
    KVQ_RETURN_IF_ERROR(transformer.Forward({{seq, chunk, false}}, *cache, &logits, &observer));
    if (on_chunk) on_chunk(start + count, n);
  }
  cache->ReleaseSequence(seq);
  return capture;
}

StatusOr<RopeApplier> MakeRopeApplier(const ModelConfig& c) {
  KVQ_ASSIGN_OR_RETURN(OpsRope rope, MakeOpsRope(c));
  const int64_t head_dim = c.head_dim;
  return RopeApplier([rope = std::move(rope), head_dim](float* x, int64_t tokens, int64_t heads) {
    std::vector<int32_t> positions(tokens);  // [tokens]
    for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>(t);
    ops::Rope(rope.layout, rope.inv_freq.data(), positions.data(), tokens, heads, head_dim, x);
  });
}

Status WriteCaptureSafetensors(const StudyCapture& capture, const ModelConfig& config,
                               const std::string& model_name, const std::string& path) {
  const KvShape& s = capture.shape;
  const int64_t n = capture.tokens;
  SafetensorsWriter writer;
  auto add = [&](const std::string& name, int64_t heads, const std::vector<float>& data) {
    return writer.AddTensor(name, DType::kF32, {n, heads, s.head_dim}, data.data(),
                            data.size() * sizeof(float));
  };
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const LayerCapture& c = capture.layers[l];
    const std::string prefix = "layers." + std::to_string(l) + ".";
    KVQ_RETURN_IF_ERROR(add(prefix + "q", s.num_heads, c.q));
    KVQ_RETURN_IF_ERROR(add(prefix + "k_pre_rope", s.num_kv_heads, c.k_pre_rope));
    KVQ_RETURN_IF_ERROR(add(prefix + "k_post_rope", s.num_kv_heads, c.k));
    KVQ_RETURN_IF_ERROR(add(prefix + "v", s.num_kv_heads, c.v));
  }
  std::vector<float> ids(capture.token_ids.begin(), capture.token_ids.end());  // [tokens]
  KVQ_RETURN_IF_ERROR(
      writer.AddTensor("token_ids", DType::kF32, {n}, ids.data(), ids.size() * sizeof(float)));
  writer.SetMetadata("format", "kvq-study-capture-v1");
  writer.SetMetadata("num_layers", std::to_string(s.num_layers));
  writer.SetMetadata("num_heads", std::to_string(s.num_heads));
  writer.SetMetadata("num_kv_heads", std::to_string(s.num_kv_heads));
  writer.SetMetadata("head_dim", std::to_string(s.head_dim));
  writer.SetMetadata("tokens", std::to_string(n));
  writer.SetMetadata("rope_theta", std::to_string(config.rope_theta));
  writer.SetMetadata("rope_layout", config.rope_layout == RopeLayout::kPairs ? "pairs" : "halves");
  writer.SetMetadata("model", model_name);
  return writer.Write(path);
}

}  // namespace kvq
