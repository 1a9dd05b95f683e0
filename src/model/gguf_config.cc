#include "model/gguf_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "model/hf_config.h"

namespace kvq {
namespace {

constexpr double kPi = 3.14159265358979323846;

// The llama3 factor for one RoPE frequency (as in transformers and llama.cpp).
double Llama3Factor(double freq, const RopeScaling& s) {
  const double orig = static_cast<double>(s.original_max_position_embeddings);
  const double wavelen = 2 * kPi / freq;
  const double low_freq_wavelen = orig / s.low_freq_factor;
  const double high_freq_wavelen = orig / s.high_freq_factor;
  if (wavelen < high_freq_wavelen) return 1.0;
  if (wavelen > low_freq_wavelen) return s.factor;
  const double smooth =
      (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return 1.0 / ((1 - smooth) / s.factor + smooth);
}

std::vector<float> FactorsFor(const ModelConfig& c, const RopeScaling& s) {
  std::vector<float> out;
  for (int64_t i = 0; i < c.head_dim / 2; ++i) {
    const double freq = 1.0 / std::pow(c.rope_theta, 2.0 * i / c.head_dim);
    out.push_back(static_cast<float>(Llama3Factor(freq, s)));
  }
  return out;
}

// llama.cpp stores llama3 scaling only as per-frequency factors. Every Llama
// 3.x model uses low 1, high 4 and an original context of 8192, varying only
// the factor, so try those and confirm by recomputing all factors.
Status RopeScalingFromFactors(const GgufFile& gguf, const TensorRef& t, ModelConfig* c) {
  const std::string where = gguf.name() + ": tensor 'rope_freqs.weight'";
  if (t.dtype != DType::kF32 || t.shape.size() != 1 || t.shape[0] != c->head_dim / 2) {
    return Status::Error(where + " must be F32 of shape [" + std::to_string(c->head_dim / 2) + "]");
  }
  std::vector<float> f(static_cast<size_t>(t.shape[0]));
  std::memcpy(f.data(), t.data, f.size() * sizeof(float));
  const float max_factor = *std::max_element(f.begin(), f.end());
  if (max_factor == 1.0f && std::all_of(f.begin(), f.end(), [](float x) { return x == 1.0f; })) {
    return Status::Ok();  // no scaling at all
  }
  RopeScaling s;
  s.type = RopeScaling::Type::kLlama3;
  s.factor = max_factor;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 8192;
  if (auto orig = gguf.GetInt(std::string(ArchitectureName(c->arch)) +
                              ".rope.scaling.original_context_length");
      orig.ok() && *orig > 0) {
    s.original_max_position_embeddings = *orig;
  }
  const std::vector<float> expect = FactorsFor(*c, s);
  for (size_t i = 0; i < f.size(); ++i) {
    if (!(std::fabs(f[i] - expect[i]) <= 1e-4f * std::max(1.0f, std::fabs(expect[i])))) {
      return Status::Error(
          where + " is not llama3 scaling with factor " + std::to_string(s.factor) +
          ", low_freq_factor 1, high_freq_factor 4, " + "original context " +
          std::to_string(s.original_max_position_embeddings) + " (entry " + std::to_string(i) +
          " is " + std::to_string(f[i]) + ", expected " + std::to_string(expect[i]) + ")");
    }
  }
  c->rope_scaling = s;
  return Status::Ok();
}

// GGUF stores eps and rope theta as float32; config.json has the decimal the
// author meant (1e-6, not 9.99999997e-07). The shortest decimal that
// round-trips the float32 recovers it, so both formats give equal configs.
StatusOr<double> GetDecimalFloat(const GgufFile& gguf, const std::string& key) {
  KVQ_ASSIGN_OR_RETURN(double v, gguf.GetFloat(key));
  if (gguf.Find(key)->type != GgufType::kFloat32) return v;
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), static_cast<float>(v));
  if (ec != std::errc()) return v;
  double d = v;
  std::from_chars(buf, end, d);
  return d;
}

}  // namespace

StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& gguf) {
  KVQ_ASSIGN_OR_RETURN(std::string arch, gguf.GetString("general.architecture"));
  ModelConfig c;
  if (arch == "qwen2") {
    c.arch = Architecture::kQwen2;
    c.rope_layout = RopeLayout::kHalves;
  } else if (arch == "llama") {
    c.arch = Architecture::kLlama;
    c.rope_layout = RopeLayout::kPairs;
  } else {
    return Status::Error(gguf.name() + ": unsupported architecture '" + arch +
                         "' (supported: qwen2, llama)");
  }
  const std::string p = arch + ".";
  KVQ_ASSIGN_OR_RETURN(c.num_layers, gguf.GetInt(p + "block_count"));
  KVQ_ASSIGN_OR_RETURN(c.hidden_size, gguf.GetInt(p + "embedding_length"));
  KVQ_ASSIGN_OR_RETURN(c.intermediate_size, gguf.GetInt(p + "feed_forward_length"));
  KVQ_ASSIGN_OR_RETURN(c.num_heads, gguf.GetInt(p + "attention.head_count"));
  c.num_kv_heads = c.num_heads;
  if (gguf.Find(p + "attention.head_count_kv")) {
    KVQ_ASSIGN_OR_RETURN(c.num_kv_heads, gguf.GetInt(p + "attention.head_count_kv"));
  }
  KVQ_ASSIGN_OR_RETURN(c.max_position_embeddings, gguf.GetInt(p + "context_length"));
  KVQ_ASSIGN_OR_RETURN(c.rms_norm_eps,
                       GetDecimalFloat(gguf, p + "attention.layer_norm_rms_epsilon"));
  c.rope_theta = 10000.0;  // llama.cpp's default when the key is absent
  if (gguf.Find(p + "rope.freq_base")) {
    KVQ_ASSIGN_OR_RETURN(c.rope_theta, GetDecimalFloat(gguf, p + "rope.freq_base"));
  }
  c.head_dim =
      c.num_heads > 0 && c.hidden_size % c.num_heads == 0 ? c.hidden_size / c.num_heads : 0;
  if (gguf.Find(p + "attention.key_length")) {
    KVQ_ASSIGN_OR_RETURN(c.head_dim, gguf.GetInt(p + "attention.key_length"));
  }
  if (gguf.Find(p + "attention.value_length")) {
    KVQ_ASSIGN_OR_RETURN(int64_t v, gguf.GetInt(p + "attention.value_length"));
    if (v != c.head_dim) {
      return Status::Error(gguf.name() + ": value_length " + std::to_string(v) +
                           " differs from key_length " + std::to_string(c.head_dim) +
                           " (unsupported)");
    }
  }
  if (gguf.Find(p + "rope.dimension_count")) {
    KVQ_ASSIGN_OR_RETURN(int64_t rot, gguf.GetInt(p + "rope.dimension_count"));
    if (rot != c.head_dim) {
      return Status::Error(gguf.name() + ": rope.dimension_count " + std::to_string(rot) +
                           " differs from head_dim " + std::to_string(c.head_dim) +
                           " (partial rotary embeddings are unsupported)");
    }
  }
  if (const GgufValue* type = gguf.Find(p + "rope.scaling.type")) {
    if (type->type != GgufType::kString || type->as_string != "none") {
      return Status::Error(gguf.name() + ": rope scaling type '" + type->as_string +
                           "' is not supported (supported: none, or llama3 via rope_freqs.weight)");
    }
  }
  if (gguf.Find(p + "vocab_size")) {
    KVQ_ASSIGN_OR_RETURN(c.vocab_size, gguf.GetInt(p + "vocab_size"));
  } else if (const TensorRef* embd = gguf.FindTensor("token_embd.weight");
             embd && embd->shape.size() == 2) {
    c.vocab_size = embd->shape[0];
  } else if (const GgufValue* tokens = gguf.Find("tokenizer.ggml.tokens");
             tokens && tokens->type == GgufType::kArray) {
    c.vocab_size = static_cast<int64_t>(tokens->elements.size());
  } else {
    return Status::Error(gguf.name() + ": cannot tell the vocabulary size (no " + p +
                         "vocab_size, token_embd.weight or tokenizer.ggml.tokens)");
  }
  c.tie_word_embeddings = gguf.FindTensor("output.weight") == nullptr;
  c.attention_bias = gguf.FindTensor("blk.0.attn_q.bias") != nullptr;
  Status st = ValidateModelConfig(c);
  if (!st.ok()) return st.WithContext(gguf.name());
  if (const TensorRef* freqs = gguf.FindTensor("rope_freqs.weight")) {
    KVQ_RETURN_IF_ERROR(RopeScalingFromFactors(gguf, *freqs, &c));
  }
  return c;
}

void WriteGgufModelConfig(const ModelConfig& c, GgufWriter& w) {
  const std::string arch = ArchitectureName(c.arch);
  const std::string p = arch + ".";
  // llama.cpp reads these as uint32 / float32 and rejects other types.
  w.SetString("general.architecture", arch);
  w.SetUint32(p + "vocab_size", static_cast<uint32_t>(c.vocab_size));
  w.SetUint32(p + "context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.SetUint32(p + "embedding_length", static_cast<uint32_t>(c.hidden_size));
  w.SetUint32(p + "block_count", static_cast<uint32_t>(c.num_layers));
  w.SetUint32(p + "feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w.SetUint32(p + "attention.head_count", static_cast<uint32_t>(c.num_heads));
  w.SetUint32(p + "attention.head_count_kv", static_cast<uint32_t>(c.num_kv_heads));
  w.SetUint32(p + "attention.key_length", static_cast<uint32_t>(c.head_dim));
  w.SetUint32(p + "attention.value_length", static_cast<uint32_t>(c.head_dim));
  w.SetUint32(p + "rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  w.SetFloat32(p + "rope.freq_base", static_cast<float>(c.rope_theta));
  w.SetFloat32(p + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
}

std::vector<float> Llama3RopeFactors(const ModelConfig& c) {
  if (c.rope_scaling.type != RopeScaling::Type::kLlama3) return {};
  return FactorsFor(c, c.rope_scaling);
}

}  // namespace kvq
