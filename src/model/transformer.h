// The decoder-only transformer (Qwen2 / Llama): weights bound from a loaded
// model, and one forward pass over a batch of sequences that continue from
// whatever the KV cache already holds for them.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "base/status.h"
#include "kv/kv_cache.h"
#include "model/model_config.h"
#include "model/model_files.h"
#include "ops/matmul.h"
#include "ops/rope.h"
#include "ops/weights.h"

namespace kvq {

struct LayerWeights {
  ops::WeightView attn_q;       // [num_heads * head_dim, hidden]
  ops::WeightView attn_k;       // [num_kv_heads * head_dim, hidden]
  ops::WeightView attn_v;       // [num_kv_heads * head_dim, hidden]
  ops::WeightView attn_output;  // [hidden, num_heads * head_dim]
  ops::WeightView ffn_gate;     // [intermediate, hidden]
  ops::WeightView ffn_up;       // [intermediate, hidden]
  ops::WeightView ffn_down;     // [hidden, intermediate]
  // Small vectors are decoded to f32 once at load (a few KB per layer).
  std::vector<float> attn_norm;  // [hidden]
  std::vector<float> ffn_norm;   // [hidden]
  std::vector<float> q_bias;     // [num_heads * head_dim], empty without bias
  std::vector<float> k_bias;     // [num_kv_heads * head_dim], empty without bias
  std::vector<float> v_bias;     // [num_kv_heads * head_dim], empty without bias
};

struct TransformerWeights {
  ops::WeightView token_embd;      // [vocab, hidden]
  ops::WeightView output;          // [vocab, hidden]; token_embd when tied
  std::vector<float> output_norm;  // [hidden]
  std::vector<LayerWeights> layers;
};

// One sequence's share of a forward batch.
struct BatchSequence {
  SeqId seq = 0;
  std::vector<int32_t> tokens;  // continue the sequence from its cached length
  bool all_logits = false;      // logits for every token, else only the last
};

// Called once per layer per sequence with what the cache receives, so tools
// can capture real K/V. Shapes: [n, num_kv_heads, head_dim].
struct KvObserver {
  std::function<void(SeqId seq, int64_t layer, int64_t n, const float* k_pre_rope, const float* k,
                     const float* v)>
      on_kv;
  // The queries attention uses (RoPE applied, before the 1/sqrt(head_dim)
  // scale): [n, num_heads, head_dim]. Called right after on_kv.
  std::function<void(SeqId seq, int64_t layer, int64_t n, const float* q)> on_q;
};

// Forward's activations (llm.c's ActivationTensors): kept between calls and
// only grown, so a decode step allocates nothing. Shapes for T tokens.
struct ForwardActivations {
  std::vector<int32_t> tokens, positions;  // [T]
  std::vector<int64_t> output_rows;        // rows whose logits are returned
  // Rows per sequence, in batch order: of the T tokens, and of the logit rows.
  std::vector<int64_t> segments, output_segments;
  std::vector<float> x, xn;        // [T, hidden]
  std::vector<float> q, attn;      // [T, num_heads * head_dim]
  std::vector<float> k_pre, k, v;  // [T, num_kv_heads * head_dim]
  std::vector<float> gate, up;     // [T, intermediate]
  std::vector<float> rows;         // [logit rows, hidden]
  void Resize(int64_t T, int64_t hidden, int64_t q_dim, int64_t kv_dim, int64_t ffn) {
    for (const auto& [buffer, width] :
         std::initializer_list<std::pair<std::vector<float>*, int64_t>>{{&x, hidden},
                                                                        {&xn, hidden},
                                                                        {&q, q_dim},
                                                                        {&attn, q_dim},
                                                                        {&k_pre, kv_dim},
                                                                        {&k, kv_dim},
                                                                        {&v, kv_dim},
                                                                        {&gate, ffn},
                                                                        {&up, ffn}}) {
      buffer->resize(static_cast<size_t>(T * width));
    }
  }
};

// How Forward's products treat the rows of a batch.
enum class BatchArith : uint8_t {
  // ops::Matmul's choice by the call's row count: fastest, but a sequence's
  // results depend (by rounding) on how many rows share its step.
  kFastest,
  // Every sequence's rows computed as that sequence alone computes them, so
  // its logits do not depend on which sequences share its steps (a batched
  // greedy answer equals the one decoded alone): a run of one-token
  // sequences goes through one ops::MatmulRowwise (each row as it would be
  // alone), a longer sequence through its own ops::Matmul. Slower than
  // kFastest where many one-token rows would have taken the packed GEMM
  // together, and where several prompts share a step (one call each).
  kInvariant,
};

class Transformer {
 public:
  // Takes ownership of the loaded files (weights are used in place).
  // `arith`: decode products on block-quantized weights with 8-bit
  // activations and integer dots (llama.cpp's arithmetic, the default) or
  // exactly in f32 (ops/matmul.h).
  static StatusOr<std::unique_ptr<Transformer>> Create(
      ModelFiles files, int num_threads, ops::DecodeArith arith = ops::DecodeArith::kInt8Dot);

  const ModelConfig& config() const { return files_.config; }
  const ModelFiles& files() const { return files_; }
  KvShape kv_shape() const;
  // Bytes of weights one decoded token reads (every matrix once).
  int64_t WeightBytesPerToken() const;
  // The threads Forward runs its products on. Give it to the KV cache
  // (KvCacheOptions::pool) so attention runs on the same workers.
  ThreadPool* pool() { return pool_.get(); }

  // Runs every token of `batch` through the model. For each sequence, the
  // tokens continue at position cache.Length(seq). logits: [rows, vocab],
  // rows in batch order (all tokens or the last one of each sequence).
  // batch_arith: whether a sequence's results may depend on its batchmates.
  Status Forward(const std::vector<BatchSequence>& batch, KvCache& cache,
                 std::vector<float>* logits, const KvObserver* observer = nullptr,
                 BatchArith batch_arith = BatchArith::kFastest);

 private:
  Transformer() = default;
  // Forward's steps, each on act_ (see Forward for the order).
  Status FlattenBatch(const std::vector<BatchSequence>& batch, const KvCache& cache);
  Status AttentionBlock(int64_t layer, const std::vector<BatchSequence>& batch, KvCache& cache,
                        const KvObserver* observer);
  void FeedForwardBlock(int64_t layer);
  void OutputHead(std::vector<float>* logits);
  // y[n, w.rows] = x[n, w.cols] · Wᵀ under arith_ and batch_arith_; the n
  // rows are the sequences' `segments` (act_.segments or .output_segments).
  void Product(const ops::WeightView& w, const float* x, int64_t n, float* y,
               const std::vector<int64_t>& segments);

  ModelFiles files_;
  TransformerWeights weights_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  ops::RopeLayout rope_layout_ = ops::RopeLayout::kHalves;
  std::unique_ptr<ThreadPool> pool_;
  ops::DecodeArith arith_ = ops::DecodeArith::kInt8Dot;
  BatchArith batch_arith_ = BatchArith::kFastest;  // the current Forward call's
  ops::MatmulWorkspace workspace_;
  ForwardActivations act_;
};

// The ops layer's view of a file dtype (the two enums list the same types).
ops::WeightType ToWeightType(DType dtype);

// Per layer, the L2 norm of each KV head's k_proj bias ([num_layers][num_kv_heads]); empty
// when the model has no attention bias. Qwen2-family models carry very large k_proj biases in
// their first and last layers, which is why a per-layer KV policy keeps those layers at f16.
StatusOr<std::vector<std::vector<double>>> KBiasNorms(const ModelFiles& files);

}  // namespace kvq
