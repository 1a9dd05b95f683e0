// Named schemes and per-layer policies: how user-facing cache choices turn
// into one (K codec, V codec) pair per layer.
//
// Schemes (KvSchemes() lists them with their expansion):
//   kivi2, kivi4   KIVI (arXiv:2402.02750): K per channel over 32-token
//                  groups, V per token over 32-channel groups, asymmetric,
//                  the newest 128 tokens in f16 (KiviTypes gives other knobs).
//   gear2, gear4   GEAR (arXiv:2403.05527): that base at 2/4 bits over 64-token
//                  tiles (K per channel, V per token in 32-channel groups) plus
//                  a rank-4 residual and 2% exact outliers per tile (codec_gear.cc).
//   kvquant2/3/4   KVQuant (arXiv:2401.18079): nuqB-k (pre-RoPE, calibrated
//                  per-channel scales) / nuqB-v (per token), 1% outliers
//                  exact, first token f16; needs a calibration file.
//   "K/V"          a pair of codec names, e.g. "f16/int4".
//   anything else  a codec name (codec.h) used for both K and V.
// Schemes are registered by their codec families (kv/codec_registry.h).
//
// Policy text (--kv-policy): rules separated by newlines or ';', each
//   LAYERS: SCHEME
// LAYERS is '*' or a comma list of N, -N (from the end: -1 = last layer) and
// A..B (inclusive; ends may be negative). Later rules override earlier ones;
// layers no rule names keep the cache's default types. '#' starts a comment.
// Example, Qwen2's large first/last k_proj biases kept in f16:
//   *: kivi2; 0, -1: f16
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "kv/codec_registry.h"
#include "kv/kv_factory.h"

namespace kvq {

// A scheme or codec spec -> its (K, V) codec names (not validated against a
// head_dim; ParseKvCodec does that).
StatusOr<KvLayerTypes> ExpandKvScheme(const std::string& spec);

// KIVI with explicit knobs: bits 2/4/8, group 32/64/128 (tokens for K,
// channels for V), residual a positive multiple of the group.
StatusOr<KvLayerTypes> KiviTypes(int k_bits, int v_bits, int64_t group, int64_t residual);

// (name, what it expands to) for help texts and studies.
std::vector<std::pair<std::string, KvLayerTypes>> KvSchemes();

// Policy text -> types for each of num_layers layers, starting from `defaults`.
StatusOr<std::vector<KvLayerTypes>> ParseKvPolicy(const std::string& text, int64_t num_layers,
                                                  const KvLayerTypes& defaults);

// One layer's parsed K and V codecs.
struct KvLayerSpec {
  KvCodecSpec k, v;
};

// k_type, v_type and policy parsed once into typed specs (KvCacheOptions
// holds it); caches and the planner take every layer's codecs from here and
// never parse a name per layer or head.
struct KvCacheTypes {
  std::string k_type, v_type, policy;  // the text it was parsed from
  KvLayerSpec defaults;                // k_type / v_type, schemes expanded
  struct Rule {
    std::string rule, layers;  // the rule's text and its LAYERS part
    KvLayerSpec spec;
  };
  std::vector<Rule> rules;
  // Every layer's specs (errors name a rule's layer outside the model).
  StatusOr<std::vector<KvLayerSpec>> Layers(int64_t num_layers) const;
};

StatusOr<std::shared_ptr<const KvCacheTypes>> ParseKvCacheTypes(const std::string& k_type,
                                                                const std::string& v_type,
                                                                const std::string& policy);
// options.types when it was parsed from options' current strings, else a
// fresh parse of them (callers may edit k_type after KvFlagsToOptions).
StatusOr<std::shared_ptr<const KvCacheTypes>> KvCacheTypesOf(const KvCacheOptions& options);
StatusOr<std::vector<KvLayerSpec>> ResolveKvLayerSpecs(const KvCacheOptions& options,
                                                       int64_t num_layers);

// Every layer's codec names under `options`: k_type / v_type (schemes
// expanded: K takes a scheme's K codec, V its V codec), then the policy.
StatusOr<std::vector<KvLayerTypes>> ResolveKvLayerTypes(const KvCacheOptions& options,
                                                        int64_t num_layers);

}  // namespace kvq
