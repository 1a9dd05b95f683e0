#include "model/model_presets.h"

#include <cctype>

namespace kvq {
namespace {

ModelConfig Shape(Architecture arch, int64_t layers, int64_t hidden, int64_t heads,
                  int64_t kv_heads, int64_t head_dim, int64_t vocab, int64_t intermediate,
                  bool tied, int64_t context, bool bias) {
  ModelConfig c;
  c.arch = arch;
  c.num_layers = layers;
  c.hidden_size = hidden;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.vocab_size = vocab;
  c.intermediate_size = intermediate;
  c.tie_word_embeddings = tied;
  c.max_position_embeddings = context;
  c.attention_bias = bias;
  return c;
}

std::vector<ModelPreset> BuildModelPresets() {
  constexpr auto kLlama = Architecture::kLlama;
  constexpr auto kQwen2 = Architecture::kQwen2;
  std::vector<ModelPreset> p;
  // RMSNorm models: attention norm + MLP norm per layer, one final norm.
  auto rms = [&p](const char* name, const char* source, ModelConfig c) {
    p.push_back({name, source, c, true, 2 * c.hidden_size, c.hidden_size});
  };
  rms("Llama-3-8B", "meta-llama/Meta-Llama-3-8B config.json",
      Shape(kLlama, 32, 4096, 32, 8, 128, 128256, 14336, false, 8192, false));
  rms("Llama-2-7B", "meta-llama/Llama-2-7b-hf config.json",
      Shape(kLlama, 32, 4096, 32, 32, 128, 32000, 11008, false, 4096, false));
  rms("Mistral-7B", "mistralai/Mistral-7B-v0.1 config.json",
      Shape(kLlama, 32, 4096, 32, 8, 128, 32000, 14336, false, 32768, false));
  rms("Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B config.json",
      Shape(kQwen2, 24, 896, 14, 2, 64, 151936, 4864, true, 32768, true));
  rms("Qwen2.5-7B", "Qwen/Qwen2.5-7B config.json",
      Shape(kQwen2, 28, 3584, 28, 4, 128, 152064, 18944, false, 131072, true));
  rms("Qwen2.5-72B", "Qwen/Qwen2.5-72B config.json",
      Shape(kQwen2, 80, 8192, 64, 8, 128, 152064, 29568, false, 131072, true));
  // Falcon-7B: multi-query (one KV head), fused QKV without bias, GELU MLP of
  // 4 * hidden, parallel attention with one LayerNorm (weight + bias) per
  // layer, ln_f, lm_head tied to word_embeddings (FalconForCausalLM).
  ModelConfig falcon = Shape(kLlama, 32, 4544, 71, 1, 64, 65024, 18176, true, 2048, false);
  p.push_back({"Falcon-7B", "tiiuae/falcon-7b config.json", falcon, false, 2 * 4544, 2 * 4544});
  return p;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

const std::vector<ModelPreset>& ModelPresets() {
  static const std::vector<ModelPreset> presets = BuildModelPresets();  // immutable after init
  return presets;
}

StatusOr<ModelPreset> FindModelPreset(std::string_view name) {
  std::string names;
  for (const ModelPreset& p : ModelPresets()) {
    if (EqualsIgnoreCase(p.name, name)) return p;
    names += (names.empty() ? "" : ", ") + std::string(p.name);
  }
  return Status::Error("unknown model preset '" + std::string(name) + "' (available: " + names +
                       ")");
}

int64_t PresetParameterCount(const ModelPreset& preset) {
  const ModelConfig& c = preset.config;
  const int64_t h = c.hidden_size;
  const int64_t q_out = c.num_heads * c.head_dim;
  const int64_t kv_out = c.num_kv_heads * c.head_dim;
  int64_t layer = h * q_out + 2 * h * kv_out + q_out * h;  // q, k, v, o
  if (c.attention_bias) layer += q_out + 2 * kv_out;
  layer += (preset.gated_ffn ? 3 : 2) * h * c.intermediate_size;
  layer += preset.norm_params_per_layer;
  const int64_t embeddings = c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2);
  return embeddings + c.num_layers * layer + preset.final_norm_params;
}

}  // namespace kvq
