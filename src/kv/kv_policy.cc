#include "kv/kv_policy.h"

#include <cctype>
#include <sstream>

namespace kvq {
namespace {

struct Scheme {
  const char* name;
  const char* k_type;
  const char* v_type;
};
// KIVI's repository defaults (SCHEMES.md): asymmetric, group 32, residual 128.
constexpr Scheme kSchemes[] = {
    {"kivi2", "int2-c32-asym-r128", "int2-g32-asym-r128"},
    {"kivi4", "int4-c32-asym-r128", "int4-g32-asym-r128"},
    // GEAR (codec_gear.cc): KIVI-style base over 64-token tiles (the GEAR
    // buffer; the newest < 64 tokens wait in f16), rank-4 residual from 3
    // power iterations, 2% sparse outliers.
    {"gear2", "gear2-c64-rank4-iter3-out2", "gear2-g32-t64-rank4-iter3-out2"},
    {"gear4", "gear4-c64-rank4-iter3-out2", "gear4-g32-t64-rank4-iter3-out2"},
    // KVQuant (SCHEMES.md): non-uniform calibrated codebooks, K before RoPE
    // with per-channel scales, V per token, 1% of each row exact, the first
    // token in f16. Need a `kvq calibrate` file (--kv-calibration).
    {"kvquant2", "nuq2-k-o1-s1-prerope", "nuq2-v-o1-s1"},
    {"kvquant3", "nuq3-k-o1-s1-prerope", "nuq3-v-o1-s1"},
    {"kvquant4", "nuq4-k-o1-s1-prerope", "nuq4-v-o1-s1"},
};

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
  for (const Scheme& scheme : kSchemes) {
    if (s == scheme.name) return KvLayerTypes{scheme.k_type, scheme.v_type};
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
  for (const Scheme& s : kSchemes) schemes.push_back({s.name, {s.k_type, s.v_type}});
  return schemes;
}

StatusOr<std::vector<KvLayerTypes>> ParseKvPolicy(const std::string& text, int64_t num_layers,
                                                  const KvLayerTypes& defaults) {
  std::vector<KvLayerTypes> layers(static_cast<size_t>(num_layers), defaults);
  std::string normalized = text;
  for (char& c : normalized) {
    if (c == ';') c = '\n';
  }
  std::istringstream lines(normalized);
  std::string line;
  int rules = 0;
  while (std::getline(lines, line)) {
    const std::string rule = Trim(line.substr(0, line.find('#')));
    if (rule.empty()) continue;
    const size_t colon = rule.find(':');
    if (colon == std::string::npos) {
      return Status::Error("--kv-policy rule '" + rule +
                           "': expected LAYERS: TYPE, e.g. 0,-1: f16");
    }
    KVQ_ASSIGN_OR_RETURN(const KvLayerTypes types, ExpandKvScheme(rule.substr(colon + 1)));
    std::vector<char> selected(static_cast<size_t>(num_layers), 0);
    std::istringstream items(rule.substr(0, colon));
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
    for (int64_t l = 0; l < num_layers; ++l) {
      if (selected[static_cast<size_t>(l)]) layers[static_cast<size_t>(l)] = types;
    }
    ++rules;
  }
  if (rules == 0)
    return Status::Error("--kv-policy: no rules (expected e.g. '*: int4; 0,-1: f16')");
  return layers;
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

}  // namespace kvq
