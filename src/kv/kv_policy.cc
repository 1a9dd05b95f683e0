#include "kv/kv_policy.h"

#include <cctype>
#include <map>
#include <sstream>

#include "kv/codec_registry.h"

namespace kvq {
namespace {

std::string Trim(const std::string& s) {
  size_t begin = 0, end = s.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(s[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return s.substr(begin, end - begin);
}

// "-3" / "12" -> a layer index in [0, num_layers), or an error.
StatusOr<int64_t> ParseLayer(const std::string& text, int64_t num_layers, const std::string& rule) {
  const std::string t = Trim(text);
  const bool negative = !t.empty() && t[0] == '-';
  const std::string digits = negative ? t.substr(1) : t;
  if (digits.empty() || digits.size() > 6 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return Status::Error("--kv-policy rule '" + rule + "': '" + t + "' is not a layer number");
  }
  const int64_t value = std::stoll(digits);
  const int64_t layer = negative ? num_layers - value : value;
  if (layer < 0 || layer >= num_layers || (negative && value == 0)) {
    return Status::Error("--kv-policy rule '" + rule + "': layer " + t + " outside the model's " +
                         std::to_string(num_layers) + " layers");
  }
  return layer;
}

}  // namespace

StatusOr<KvLayerTypes> ExpandKvScheme(const std::string& spec) {
  const std::string s = Trim(spec);
  if (s.empty()) return Status::Error("empty KV cache type");
  if (const KvScheme* scheme = FindKvScheme(s)) return KvLayerTypes{scheme->k_type, scheme->v_type};
  // SCHEME-sN / SCHEME-aN (first N tokens / N detected sinks in f16): the
  // streaming option goes to both of the scheme's codecs, which validate it.
  const size_t dash = s.rfind('-');
  if (dash != std::string::npos && dash + 2 < s.size() &&
      (s[dash + 1] == 's' || s[dash + 1] == 'a') &&
      s.find_first_not_of("0123456789", dash + 2) == std::string::npos) {
    if (const KvScheme* scheme = FindKvScheme(s.substr(0, dash))) {
      const std::string option = s.substr(dash);
      return KvLayerTypes{scheme->k_type + option, scheme->v_type + option};
    }
  }
  const size_t slash = s.find('/');
  if (slash != std::string::npos) {
    const std::string k = Trim(s.substr(0, slash)), v = Trim(s.substr(slash + 1));
    if (k.empty() || v.empty() || v.find('/') != std::string::npos) {
      return Status::Error("KV cache type '" + s + "': expected K/V, e.g. f16/int4");
    }
    KVQ_ASSIGN_OR_RETURN(const KvLayerTypes k_types, ExpandKvScheme(k));
    KVQ_ASSIGN_OR_RETURN(const KvLayerTypes v_types, ExpandKvScheme(v));
    return KvLayerTypes{k_types.k_type, v_types.v_type};
  }
  return KvLayerTypes{s, s};
}

StatusOr<KvLayerTypes> KiviTypes(int k_bits, int v_bits, int64_t group, int64_t residual) {
  for (int bits : {k_bits, v_bits}) {
    if (bits != 2 && bits != 4 && bits != 8) {
      return Status::Error("KIVI: bits " + std::to_string(bits) + " not 2, 4 or 8");
    }
  }
  if (group != 32 && group != 64 && group != 128) {
    return Status::Error("KIVI: group size " + std::to_string(group) + " not 32, 64 or 128");
  }
  if (residual <= 0 || residual % group != 0) {
    return Status::Error("KIVI: residual length " + std::to_string(residual) +
                         " is not a positive multiple of the group size " + std::to_string(group));
  }
  const std::string g = std::to_string(group), r = std::to_string(residual);
  return KvLayerTypes{"int" + std::to_string(k_bits) + "-c" + g + "-asym-r" + r,
                      "int" + std::to_string(v_bits) + "-g" + g + "-asym-r" + r};
}

std::vector<std::pair<std::string, KvLayerTypes>> KvSchemes() {
  std::vector<std::pair<std::string, KvLayerTypes>> schemes;
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (const KvScheme& s : family->schemes) schemes.push_back({s.name, {s.k_type, s.v_type}});
  }
  return schemes;
}

namespace {

// One rule of a policy: its text, its LAYERS part and what it sets.
struct PolicyRule {
  std::string rule, layers;
  KvLayerTypes types;
};

// Policy text -> rules (syntax and scheme expansion; layer numbers are
// checked against the model in SelectLayers).
StatusOr<std::vector<PolicyRule>> SplitPolicy(const std::string& text) {
  std::string normalized = text;
  for (char& c : normalized) {
    if (c == ';') c = '\n';
  }
  std::istringstream lines(normalized);
  std::string line;
  std::vector<PolicyRule> rules;
  while (std::getline(lines, line)) {
    const std::string rule = Trim(line.substr(0, line.find('#')));
    if (rule.empty()) continue;
    const size_t colon = rule.find(':');
    if (colon == std::string::npos) {
      return Status::Error("--kv-policy rule '" + rule +
                           "': expected LAYERS: TYPE, e.g. 0,-1: f16");
    }
    KVQ_ASSIGN_OR_RETURN(const KvLayerTypes types, ExpandKvScheme(rule.substr(colon + 1)));
    rules.push_back({rule, rule.substr(0, colon), types});
  }
  if (rules.empty()) {
    return Status::Error("--kv-policy: no rules (expected e.g. '*: int4; 0,-1: f16')");
  }
  return rules;
}

// The layers a rule names: [num_layers] 0/1.
StatusOr<std::vector<char>> SelectLayers(const std::string& rule, const std::string& layers,
                                         int64_t num_layers) {
  std::vector<char> selected(static_cast<size_t>(num_layers), 0);
  std::istringstream items(layers);
  std::string item;
  bool any = false;
  while (std::getline(items, item, ',')) {
    item = Trim(item);
    any = true;
    if (item == "*") {
      std::fill(selected.begin(), selected.end(), 1);
      continue;
    }
    const size_t dots = item.find("..");
    int64_t first, last;
    if (dots == std::string::npos) {
      KVQ_ASSIGN_OR_RETURN(first, ParseLayer(item, num_layers, rule));
      last = first;
    } else {
      KVQ_ASSIGN_OR_RETURN(first, ParseLayer(item.substr(0, dots), num_layers, rule));
      KVQ_ASSIGN_OR_RETURN(last, ParseLayer(item.substr(dots + 2), num_layers, rule));
      if (last < first) {
        return Status::Error("--kv-policy rule '" + rule + "': range " + item + " is empty");
      }
    }
    for (int64_t l = first; l <= last; ++l) selected[static_cast<size_t>(l)] = 1;
  }
  if (!any) return Status::Error("--kv-policy rule '" + rule + "': no layers");
  return selected;
}

// `defaults` in every layer, then each rule's value_of(rule) on the layers
// it names (later rules win).
template <class T, class Rule, class ValueOf>
StatusOr<std::vector<T>> ApplyRules(const std::vector<Rule>& rules, int64_t num_layers,
                                    const T& defaults, const ValueOf& value_of) {
  std::vector<T> layers(static_cast<size_t>(num_layers), defaults);
  for (const Rule& rule : rules) {
    KVQ_ASSIGN_OR_RETURN(const std::vector<char> selected,
                         SelectLayers(rule.rule, rule.layers, num_layers));
    for (int64_t l = 0; l < num_layers; ++l) {
      if (selected[static_cast<size_t>(l)]) layers[static_cast<size_t>(l)] = value_of(rule);
    }
  }
  return layers;
}

// Parses a K (or V) codec name once, naming the side in errors.
StatusOr<KvCodecSpec> ParseSide(const std::string& name, const char* side,
                                const std::string& where) {
  auto spec = ParseKvCodecSpec(name);
  if (!spec.ok()) return spec.status().WithContext(side + where);
  if (std::string(side) == "V" && spec->streaming.pre_rope) {
    return Status::Error("KV cache type '" + name + "': -prerope is for K");
  }
  return spec;
}

}  // namespace

StatusOr<std::vector<KvLayerTypes>> ParseKvPolicy(const std::string& text, int64_t num_layers,
                                                  const KvLayerTypes& defaults) {
  KVQ_ASSIGN_OR_RETURN(const std::vector<PolicyRule> rules, SplitPolicy(text));
  return ApplyRules(rules, num_layers, defaults, [](const PolicyRule& r) { return r.types; });
}

StatusOr<std::vector<KvLayerTypes>> ResolveKvLayerTypes(const KvCacheOptions& options,
                                                        int64_t num_layers) {
  KVQ_ASSIGN_OR_RETURN(const KvLayerTypes k_types, ExpandKvScheme(options.k_type));
  KVQ_ASSIGN_OR_RETURN(const KvLayerTypes v_types, ExpandKvScheme(options.v_type));
  const KvLayerTypes defaults{k_types.k_type, v_types.v_type};
  if (options.policy.empty()) {
    return std::vector<KvLayerTypes>(static_cast<size_t>(num_layers), defaults);
  }
  return ParseKvPolicy(options.policy, num_layers, defaults);
}

StatusOr<std::shared_ptr<const KvCacheTypes>> ParseKvCacheTypes(const std::string& k_type,
                                                                const std::string& v_type,
                                                                const std::string& policy) {
  auto types = std::make_shared<KvCacheTypes>();
  types->k_type = k_type;
  types->v_type = v_type;
  types->policy = policy;
  // Each distinct name is parsed once (a policy repeats a few names).
  std::map<std::string, KvCodecSpec> parsed;
  auto side = [&](const std::string& name, const char* which,
                  const std::string& where) -> StatusOr<KvCodecSpec> {
    const std::string key = std::string(which) + name;
    auto it = parsed.find(key);
    if (it != parsed.end()) return it->second;
    KVQ_ASSIGN_OR_RETURN(KvCodecSpec spec, ParseSide(name, which, where));
    return parsed[key] = spec;
  };
  KVQ_ASSIGN_OR_RETURN(const KvLayerTypes k_types, ExpandKvScheme(k_type));
  KVQ_ASSIGN_OR_RETURN(const KvLayerTypes v_types, ExpandKvScheme(v_type));
  KVQ_ASSIGN_OR_RETURN(types->defaults.k, side(k_types.k_type, "K", ""));
  KVQ_ASSIGN_OR_RETURN(types->defaults.v, side(v_types.v_type, "V", ""));
  if (!policy.empty()) {
    KVQ_ASSIGN_OR_RETURN(const std::vector<PolicyRule> rules, SplitPolicy(policy));
    for (const PolicyRule& rule : rules) {
      KvCacheTypes::Rule typed{rule.rule, rule.layers, {}};
      const std::string where = " (--kv-policy rule '" + rule.rule + "')";
      KVQ_ASSIGN_OR_RETURN(typed.spec.k, side(rule.types.k_type, "K", where));
      KVQ_ASSIGN_OR_RETURN(typed.spec.v, side(rule.types.v_type, "V", where));
      types->rules.push_back(std::move(typed));
    }
  }
  return std::shared_ptr<const KvCacheTypes>(std::move(types));
}

StatusOr<std::vector<KvLayerSpec>> KvCacheTypes::Layers(int64_t num_layers) const {
  return ApplyRules(rules, num_layers, defaults, [](const Rule& r) { return r.spec; });
}

StatusOr<std::shared_ptr<const KvCacheTypes>> KvCacheTypesOf(const KvCacheOptions& options) {
  const KvCacheTypes* t = options.types.get();
  if (t != nullptr && t->k_type == options.k_type && t->v_type == options.v_type &&
      t->policy == options.policy) {
    return options.types;
  }
  return ParseKvCacheTypes(options.k_type, options.v_type, options.policy);
}

StatusOr<std::vector<KvLayerSpec>> ResolveKvLayerSpecs(const KvCacheOptions& options,
                                                       int64_t num_layers) {
  KVQ_ASSIGN_OR_RETURN(const std::shared_ptr<const KvCacheTypes> types, KvCacheTypesOf(options));
  return types->Layers(num_layers);
}

}  // namespace kvq
