#include "eval/kv_export.h"

#include <map>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "kv/codec_registry.h"
#include "kv/kv_policy.h"

namespace kvq {
namespace {

using Json = nlohmann::ordered_json;

// What one kvq codec is in the other stack: null when it has no equivalent.
struct Mapped {
  Json value;  // HF: {nbits, axis, q_group_size, residual_length}; vLLM: the dtype string
  bool exact = false;
};

int64_t Number(const std::string& text) {
  if (text.empty() || text.size() > 7 || text.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stoll(text);
}

// quanto{b}-{g|c}{G}-res{R}: HF's own semantics (exact); intB-gG-asym and
// intB-cG-asym[-rN] are the same quantizer with kvq's residual rule (close).
Mapped MapHf(const std::string& name) {
  const std::vector<std::string> parts = SplitKvName(name);
  Mapped m;
  const bool quanto = parts[0] == "quanto2" || parts[0] == "quanto4";
  const bool integer = parts[0] == "int2" || parts[0] == "int4";
  if (!quanto && !integer) return m;
  int64_t group = -1, residual = quanto ? -1 : 0;
  int axis = 0;
  bool asym = quanto, other = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& o = parts[i];
    if (o.size() > 1 && (o[0] == 'g' || o[0] == 'c') && Number(o.substr(1)) > 0) {
      group = Number(o.substr(1));
      axis = o[0] == 'c' ? -1 : 0;
    } else if (quanto && o.compare(0, 3, "res") == 0) {
      residual = Number(o.substr(3));
    } else if (!quanto && o.size() > 1 && o[0] == 'r') {
      residual = Number(o.substr(1));
    } else if (o == "asym") {
      asym = true;
    } else {
      other = true;  // sym, sinks, pre-RoPE: not what quanto stores
    }
  }
  if (!asym || other || group < 0 || residual < 0) return m;
  m.value = Json{{"nbits", parts[0].back() - '0'},
                 {"axis", axis},
                 {"q_group_size", group},
                 {"residual_length", residual}};
  m.exact = quanto;
  return m;
}

Mapped MapVllm(const std::string& name) {
  static const std::map<std::string, std::pair<const char*, bool>> kTable = {
      {"fp8_e4m3-t1", {"fp8_e4m3", true}},
      {"fp8_e4m3-tcal", {"fp8_e4m3", true}},
      {"fp8_e5m2-t1", {"fp8_e5m2", true}},
      {"int8_per_token_head", {"int8_per_token_head", true}},
      {"fp8_per_token_head", {"fp8_per_token_head", true}},
      {"int4_per_token_head", {"int4_per_token_head", true}},
      {"f16", {"auto", true}},
      {"bf16", {"auto", true}},
      {"fp8_e4m3", {"fp8_e4m3", false}},  // kvq's per-head first-prefill scale
      {"fp8_e5m2", {"fp8_e5m2", false}},
  };
  Mapped m;
  const auto it = kTable.find(name);
  if (it == kTable.end()) return m;
  m.value = it->second.first;
  m.exact = it->second.second;
  return m;
}

struct LayerNames {
  std::vector<std::pair<std::string, std::string>> layers;  // (K, V) canonical names
  std::pair<std::string, std::string> common;               // the most frequent pair
  bool uniform = true;
};

StatusOr<LayerNames> Layers(const KvExportInput& in) {
  if (in.num_layers <= 0) return Status::Error("export: the model's layer count is unknown");
  KVQ_ASSIGN_OR_RETURN(auto types, ParseKvCacheTypes(in.k_type, in.v_type, in.policy));
  KVQ_ASSIGN_OR_RETURN(const std::vector<KvLayerSpec> specs, types->Layers(in.num_layers));
  LayerNames out;
  std::map<std::pair<std::string, std::string>, int64_t> count;
  int64_t best = 0;
  for (const KvLayerSpec& s : specs) {
    out.layers.emplace_back(s.k.Name(), s.v.Name());
    const int64_t c = ++count[out.layers.back()];
    if (c > best) {
      best = c;
      out.common = out.layers.back();
    }
  }
  out.uniform = count.size() == 1;
  return out;
}

// One entry per layer: kvq's K and V names and the other stack's equivalents
// (STACK_k, STACK_v). Clears *exact when a layer has no exact equivalent, or
// (same_kv: vLLM stores K and V alike) when K's and V's differ.
Json LayerTable(const LayerNames& names, Mapped (*map)(const std::string&),
                const std::string& stack, bool same_kv, bool* exact) {
  Json layers = Json::array();
  for (size_t l = 0; l < names.layers.size(); ++l) {
    const Mapped k = map(names.layers[l].first), v = map(names.layers[l].second);
    *exact = *exact && k.exact && v.exact && (!same_kv || k.value == v.value);
    layers.push_back(Json{{"layer", l},
                          {"k", names.layers[l].first},
                          {"v", names.layers[l].second},
                          {stack + "_k", k.value},
                          {stack + "_v", v.value}});
  }
  return layers;
}

Json Header(const KvExportInput& in) { return Json{{"model", in.model}, {"command", in.command}}; }

}  // namespace

StatusOr<std::string> HfCacheExportJson(const KvExportInput& in) {
  KVQ_ASSIGN_OR_RETURN(const LayerNames names, Layers(in));
  bool exact = names.uniform;
  const Json layers = LayerTable(names, MapHf, "hf", /*same_kv=*/false, &exact);
  const Mapped k = MapHf(names.common.first), v = MapHf(names.common.second);
  Json config = nullptr;
  std::string note;
  if (k.value.is_null() || v.value.is_null()) {
    note = "the most frequent layer types (" + names.common.first + ", " + names.common.second +
           ") have no quanto equivalent (quanto stores 2 or 4 bits, asymmetric, per group)";
    exact = false;
  } else if (k.value["nbits"] != v.value["nbits"] ||
             k.value["q_group_size"] != v.value["q_group_size"] ||
             k.value["residual_length"] != v.value["residual_length"]) {
    note =
        "K and V differ in nbits, q_group_size or residual_length, which QuantizedCacheConfig "
        "shares between them";
    exact = false;
  } else {
    config = Json{{"backend", "quanto"},
                  {"nbits", k.value["nbits"]},
                  {"axis_key", k.value["axis"]},
                  {"axis_value", v.value["axis"]},
                  {"q_group_size", k.value["q_group_size"]},
                  {"residual_length", k.value["residual_length"]}};
    if (!names.uniform) {
      note =
          "transformers applies one cache config to every layer; the policy is per layer, so "
          "this is its most frequent layer types";
    } else if (!exact) {
      note =
          "close, not exact: kvq's int codecs keep the newest tokens by their own residual "
          "rule (quanto* names are HF's rule; kv/codec_quanto.cc lists the differences)";
    } else {
      note =
          "HF's quanto grouping, rounding and residual rule (kv/codec_quanto.cc lists what "
          "differs in storage precision and prompt handling)";
    }
  }
  Json j{{"cache_config", config}, {"exact", exact},      {"note", note},
         {"kv_policy", in.policy}, {"k_type", in.k_type}, {"v_type", in.v_type},
         {"layers", layers},       {"source", Header(in)}};
  return j.dump(2) + "\n";
}

StatusOr<std::string> VllmCacheExportJson(const KvExportInput& in, const std::string& scales_file) {
  KVQ_ASSIGN_OR_RETURN(const LayerNames names, Layers(in));
  bool exact = names.uniform;
  const Json layers = LayerTable(names, MapVllm, "vllm", /*same_kv=*/true, &exact);
  const Mapped k = MapVllm(names.common.first), v = MapVllm(names.common.second);
  Json dtype = nullptr;
  std::string note;
  if (k.value.is_null() || v.value.is_null() || k.value != v.value) {
    note = "the most frequent layer types (" + names.common.first + ", " + names.common.second +
           ") are not one vLLM --kv-cache-dtype (vLLM stores K and V alike)";
    exact = false;
  } else {
    dtype = k.value;
    note = names.uniform ? ""
                         : "vLLM applies one --kv-cache-dtype to every layer; the policy "
                           "is per layer, so this is its most frequent layer types";
    if (names.common.first == "fp8_e4m3-tcal" || names.common.second == "fp8_e4m3-tcal") {
      if (scales_file.empty()) {
        exact = false;
        note += std::string(note.empty() ? "" : "; ") +
                "fp8_e4m3-tcal needs the scales: export them with kvq calibrate --export vllm";
      }
    }
  }
  Json j{{"kv_cache_dtype", dtype}, {"calculate_kv_scales", false},
         {"exact", exact},          {"note", note},
         {"kv_policy", in.policy},  {"k_type", in.k_type},
         {"v_type", in.v_type},     {"scales_file", scales_file},
         {"layers", layers},        {"source", Header(in)}};
  return j.dump(2) + "\n";
}

}  // namespace kvq
