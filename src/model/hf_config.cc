// config.json parsing. nlohmann::json runs with exceptions disabled and every
// value's type is checked before it is read, so a malformed file produces a
// Status, never an exception.
#include "model/hf_config.h"

#include <nlohmann/json.hpp>

#include "io/mapped_file.h"

namespace kvq {
namespace {

using json = nlohmann::json;

constexpr const char* kSupported = "Qwen2ForCausalLM, LlamaForCausalLM";

class ConfigReader {
 public:
  ConfigReader(const json& root, const std::string& name) : root_(root), name_(name) {}

  Status Error(const std::string& message) const { return Status::Error(name_ + ": " + message); }

  // Absent and null both mean "not set", as in transformers.
  const json* Get(const json& obj, const char* key) const {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }

  Status Int(const char* key, bool required, int64_t* out, const json* obj = nullptr) const {
    const json* v = Get(obj ? *obj : root_, key);
    if (v == nullptr)
      return required ? Error("missing required key '" + std::string(key) + "'") : Status::Ok();
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX))
        return Error("key '" + std::string(key) + "' is too large");
      *out = static_cast<int64_t>(u);
    } else if (v->is_number_integer()) {
      *out = v->get<int64_t>();
    } else {
      return Error("key '" + std::string(key) + "' must be an integer, got " + v->type_name());
    }
    return Status::Ok();
  }

  Status Float(const char* key, bool required, double* out, const json* obj = nullptr) const {
    const json* v = Get(obj ? *obj : root_, key);
    if (v == nullptr)
      return required ? Error("missing required key '" + std::string(key) + "'") : Status::Ok();
    if (!v->is_number()) {
      return Error("key '" + std::string(key) + "' must be a number, got " + v->type_name());
    }
    *out = v->get<double>();
    return Status::Ok();
  }

  Status Bool(const char* key, bool* out) const {
    const json* v = Get(root_, key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_boolean()) {
      return Error("key '" + std::string(key) + "' must be a boolean, got " + v->type_name());
    }
    *out = v->get<bool>();
    return Status::Ok();
  }

 private:
  const json& root_;
  const std::string& name_;
};

// rope_scaling (transformers < 5) or rope_parameters (>= 5; also holds
// rope_theta). Only llama3 scaling is supported.
Status ParseRopeScaling(const ConfigReader& r, const json& root, ModelConfig* c) {
  const json* rope = r.Get(root, "rope_scaling");
  const json* params = r.Get(root, "rope_parameters");
  if (params != nullptr) {
    if (!params->is_object()) return r.Error("'rope_parameters' must be an object");
    if (r.Get(root, "rope_theta") == nullptr) {
      KVQ_RETURN_IF_ERROR(r.Float("rope_theta", false, &c->rope_theta, params));
    }
    if (rope == nullptr) rope = params;
  }
  if (rope == nullptr) return Status::Ok();
  if (!rope->is_object()) return r.Error("'rope_scaling' must be an object or null");
  const json* type = r.Get(*rope, "rope_type");
  if (type == nullptr) type = r.Get(*rope, "type");
  if (type == nullptr || (type->is_string() && type->get<std::string>() == "default")) {
    return Status::Ok();
  }
  if (!type->is_string()) return r.Error("rope_scaling type must be a string");
  const std::string name = type->get<std::string>();
  if (name != "llama3") {
    return r.Error("unsupported rope_scaling type '" + name + "' (supported: llama3)");
  }
  RopeScaling& s = c->rope_scaling;
  s.type = RopeScaling::Type::kLlama3;
  KVQ_RETURN_IF_ERROR(r.Float("factor", true, &s.factor, rope));
  KVQ_RETURN_IF_ERROR(r.Float("low_freq_factor", false, &s.low_freq_factor, rope));
  KVQ_RETURN_IF_ERROR(r.Float("high_freq_factor", false, &s.high_freq_factor, rope));
  KVQ_RETURN_IF_ERROR(
      r.Int("original_max_position_embeddings", false, &s.original_max_position_embeddings, rope));
  if (!(s.factor >= 1.0) || !(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor) ||
      s.original_max_position_embeddings <= 0) {
    return r.Error(
        "invalid llama3 rope_scaling (need factor >= 1, 0 < low_freq_factor < "
        "high_freq_factor, original_max_position_embeddings > 0)");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, const std::string& name) {
  const json root = json::parse(json_text.begin(), json_text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (root.is_discarded()) return Status::Error(name + ": malformed JSON");
  if (!root.is_object()) return Status::Error(name + ": top level is not an object");
  ConfigReader r(root, name);

  std::string arch_name;
  if (const json* archs = r.Get(root, "architectures")) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      return r.Error("'architectures' must be a non-empty array of strings");
    }
    arch_name = (*archs)[0].get<std::string>();
  } else if (const json* type = r.Get(root, "model_type"); type && type->is_string()) {
    // Some configs carry only model_type.
    const std::string t = type->get<std::string>();
    arch_name = t == "qwen2" ? "Qwen2ForCausalLM" : t == "llama" ? "LlamaForCausalLM" : t;
  } else {
    return r.Error("missing required key 'architectures'");
  }
  ModelConfig c;
  if (arch_name == "Qwen2ForCausalLM") {
    c.arch = Architecture::kQwen2;
    c.attention_bias = true;  // Qwen2's q/k/v projections always carry a bias
    c.max_position_embeddings = 32768;
  } else if (arch_name == "LlamaForCausalLM") {
    c.arch = Architecture::kLlama;
    c.attention_bias = false;
    c.max_position_embeddings = 2048;
  } else {
    return r.Error("unsupported architecture '" + arch_name + "' (supported: " + kSupported + ")");
  }
  c.rope_layout = RopeLayout::kHalves;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;

  KVQ_RETURN_IF_ERROR(r.Int("vocab_size", true, &c.vocab_size));
  KVQ_RETURN_IF_ERROR(r.Int("hidden_size", true, &c.hidden_size));
  KVQ_RETURN_IF_ERROR(r.Int("intermediate_size", true, &c.intermediate_size));
  KVQ_RETURN_IF_ERROR(r.Int("num_hidden_layers", true, &c.num_layers));
  KVQ_RETURN_IF_ERROR(r.Int("num_attention_heads", true, &c.num_heads));
  c.num_kv_heads = c.num_heads;
  KVQ_RETURN_IF_ERROR(r.Int("num_key_value_heads", false, &c.num_kv_heads));
  c.head_dim = 0;
  KVQ_RETURN_IF_ERROR(r.Int("head_dim", false, &c.head_dim));
  if (c.head_dim == 0 && c.num_heads > 0 && c.hidden_size > 0) {
    if (c.hidden_size % c.num_heads != 0) {
      return r.Error("hidden_size " + std::to_string(c.hidden_size) +
                     " is not divisible by num_attention_heads " + std::to_string(c.num_heads) +
                     " and no head_dim is given");
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  KVQ_RETURN_IF_ERROR(r.Float("rope_theta", false, &c.rope_theta));
  KVQ_RETURN_IF_ERROR(r.Float("rms_norm_eps", false, &c.rms_norm_eps));
  KVQ_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  KVQ_RETURN_IF_ERROR(r.Int("max_position_embeddings", false, &c.max_position_embeddings));
  if (c.arch == Architecture::kLlama) {
    KVQ_RETURN_IF_ERROR(r.Bool("attention_bias", &c.attention_bias));
    // Llama's attention_bias also adds an o_proj bias, and mlp_bias biases the
    // MLP; ModelConfig has no field for either, so refuse rather than ignore.
    if (c.attention_bias)
      return r.Error("attention_bias=true is not supported for LlamaForCausalLM");
    bool mlp_bias = false;
    KVQ_RETURN_IF_ERROR(r.Bool("mlp_bias", &mlp_bias));
    if (mlp_bias) return r.Error("mlp_bias=true is not supported");
  } else {
    bool sliding = false;
    KVQ_RETURN_IF_ERROR(r.Bool("use_sliding_window", &sliding));
    if (sliding) return r.Error("use_sliding_window=true is not supported");
  }
  if (const json* act = r.Get(root, "hidden_act")) {
    if (!act->is_string() || act->get<std::string>() != "silu") {
      return r.Error("hidden_act must be \"silu\"");
    }
  }
  KVQ_RETURN_IF_ERROR(ParseRopeScaling(r, root, &c));
  Status st = ValidateModelConfig(c);
  if (!st.ok()) return st.WithContext(name);
  return c;
}

StatusOr<ModelConfig> LoadHfConfig(const std::string& path) {
  KVQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  return ParseHfConfig(text, path);
}

std::string HfConfigJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  const bool qwen = c.arch == Architecture::kQwen2;
  j["architectures"] = {qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = qwen ? "qwen2" : "llama";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["max_position_embeddings"] = c.max_position_embeddings;
  if (!qwen) j["attention_bias"] = c.attention_bias;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

Status ValidateModelConfig(const ModelConfig& c) {
  // Limits far above any real model, low enough that products of two sizes
  // (and vocab x hidden) fit easily in int64.
  struct Field {
    const char* name;
    int64_t value;
    int64_t max;
  };
  const Field fields[] = {
      {"vocab_size", c.vocab_size, 1 << 24},
      {"hidden_size", c.hidden_size, 1 << 20},
      {"intermediate_size", c.intermediate_size, 1 << 22},
      {"num_layers", c.num_layers, 4096},
      {"num_heads", c.num_heads, 1 << 14},
      {"num_kv_heads", c.num_kv_heads, 1 << 14},
      {"head_dim", c.head_dim, 1 << 14},
      {"max_position_embeddings", c.max_position_embeddings, int64_t{1} << 40},
  };
  for (const Field& f : fields) {
    if (f.value <= 0 || f.value > f.max) {
      return Status::Error(std::string(f.name) + " = " + std::to_string(f.value) +
                           " is out of range (1.." + std::to_string(f.max) + ")");
    }
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return Status::Error("num_heads " + std::to_string(c.num_heads) +
                         " is not a multiple of num_kv_heads " + std::to_string(c.num_kv_heads));
  }
  if (c.head_dim % 2 != 0) {
    return Status::Error("head_dim " + std::to_string(c.head_dim) + " is odd; RoPE needs pairs");
  }
  if (!(c.rope_theta > 0)) return Status::Error("rope_theta must be positive");
  if (!(c.rms_norm_eps > 0) || !(c.rms_norm_eps < 1)) {
    return Status::Error("rms_norm_eps must be in (0, 1)");
  }
  return Status::Ok();
}

}  // namespace kvq
