#include "model/tensor_names.h"

#include <charconv>

namespace kvq {
namespace {

// Per-layer suffixes: Hugging Face (after "model.layers.N.") and canonical
// (after "blk.N.").
struct LayerName {
  const char* hf;
  const char* canonical;
};
constexpr LayerName kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};
struct GlobalName {
  const char* hf;
  const char* canonical;
};
constexpr GlobalName kGlobalNames[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

// Splits "<prefix><N>.<rest>" into N and rest.
bool SplitLayer(std::string_view name, std::string_view prefix, int64_t* layer,
                std::string_view* rest) {
  if (name.substr(0, prefix.size()) != prefix) return false;
  name.remove_prefix(prefix.size());
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0) return false;
  const auto [ptr, ec] = std::from_chars(name.data(), name.data() + dot, *layer);
  if (ec != std::errc() || ptr != name.data() + dot || *layer < 0) return false;
  *rest = name.substr(dot + 1);
  return true;
}

}  // namespace

std::string BlockTensorName(int64_t layer, std::string_view suffix) {
  return "blk." + std::to_string(layer) + "." + std::string(suffix);
}

std::optional<std::string> CanonicalFromHfName(std::string_view hf_name) {
  for (const GlobalName& g : kGlobalNames) {
    if (hf_name == g.hf) return std::string(g.canonical);
  }
  int64_t layer = 0;
  std::string_view rest;
  if (!SplitLayer(hf_name, "model.layers.", &layer, &rest)) return std::nullopt;
  for (const LayerName& l : kLayerNames) {
    if (rest == l.hf) return BlockTensorName(layer, l.canonical);
  }
  if (rest == "self_attn.rotary_emb.inv_freq") return std::string();
  return std::nullopt;
}

std::optional<std::string> HfNameFromCanonical(std::string_view canonical) {
  for (const GlobalName& g : kGlobalNames) {
    if (canonical == g.canonical) return std::string(g.hf);
  }
  int64_t layer = 0;
  std::string_view rest;
  if (!SplitLayer(canonical, "blk.", &layer, &rest)) return std::nullopt;
  for (const LayerName& l : kLayerNames) {
    if (rest == l.canonical) return "model.layers." + std::to_string(layer) + "." + l.hf;
  }
  return std::nullopt;
}

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& c) {
  const int64_t q_dim = c.num_heads * c.head_dim;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  std::vector<ExpectedTensor> out;
  out.push_back({"token_embd.weight", {c.vocab_size, c.hidden_size}});
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    out.push_back({"rope_freqs.weight", {c.head_dim / 2}, /*required=*/false});
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    out.push_back({BlockTensorName(i, "attn_norm.weight"), {c.hidden_size}});
    out.push_back({BlockTensorName(i, "attn_q.weight"), {q_dim, c.hidden_size}});
    out.push_back({BlockTensorName(i, "attn_k.weight"), {kv_dim, c.hidden_size}});
    out.push_back({BlockTensorName(i, "attn_v.weight"), {kv_dim, c.hidden_size}});
    if (c.attention_bias) {
      out.push_back({BlockTensorName(i, "attn_q.bias"), {q_dim}});
      out.push_back({BlockTensorName(i, "attn_k.bias"), {kv_dim}});
      out.push_back({BlockTensorName(i, "attn_v.bias"), {kv_dim}});
    }
    out.push_back({BlockTensorName(i, "attn_output.weight"), {c.hidden_size, q_dim}});
    out.push_back({BlockTensorName(i, "ffn_norm.weight"), {c.hidden_size}});
    out.push_back({BlockTensorName(i, "ffn_gate.weight"), {c.intermediate_size, c.hidden_size}});
    out.push_back({BlockTensorName(i, "ffn_up.weight"), {c.intermediate_size, c.hidden_size}});
    out.push_back({BlockTensorName(i, "ffn_down.weight"), {c.hidden_size, c.intermediate_size}});
  }
  out.push_back({"output_norm.weight", {c.hidden_size}});
  if (!c.tie_word_embeddings) out.push_back({"output.weight", {c.vocab_size, c.hidden_size}});
  return out;
}

}  // namespace kvq
