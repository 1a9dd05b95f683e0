// Export of kvq's KV cache settings for other stacks (docs/export.md):
//   vLLM: the per-layer fp8 k_scale/v_scale of a calibration, as a
//         safetensors file of checkpoint tensors (SaveVllmKvScales in
//         kv/kv_calibration.h), and the --kv-cache-dtype a policy maps to;
//   Hugging Face transformers: the QuantizedCacheConfig arguments (backend,
//         nbits, axis_key, axis_value, q_group_size, residual_length) a
//         policy maps to, so `QuantizedCacheConfig(**j["cache_config"])`
//         (or generate(..., cache_implementation="quantized",
//         cache_config=j["cache_config"])) loads it.
// Each export also carries the kvq --kv-policy it came from, one entry per
// layer (kvq's K and V types and what they map to) and `exact`: whether
// every layer uses the kvq types defined as that very configuration (the
// quanto* names, vLLM's names); the small numeric differences those names
// keep are listed where they are defined (kv/codec_quanto.cc, codec_vllm.cc). transformers and vLLM
// take one cache type for every layer; a per-layer policy that is not
// uniform is exported as its most frequent layer's types, with exact false
// and a note saying so.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace kvq {

struct KvExportInput {
  std::string k_type = "f16", v_type = "f16";  // defaults (schemes accepted)
  std::string policy;                          // --kv-policy text, may be empty
  int64_t num_layers = 0;
  std::string model;    // for the record
  std::string command;  // the kvq command that produced it
};

// The JSON text (pretty-printed) of the transformers export: {"cache_config":
// {...} or null when no layer maps to a quanto cache, "exact", "note",
// "kv_policy", "layers": [{"layer", "k", "v", "hf"}], "source"}.
StatusOr<std::string> HfCacheExportJson(const KvExportInput& input);

// The JSON text of the vLLM export: {"kv_cache_dtype", "calculate_kv_scales"
// false, "exact", "note", "kv_policy", "layers", "scales_file" (may be
// empty), "source"}.
StatusOr<std::string> VllmCacheExportJson(const KvExportInput& input,
                                          const std::string& scales_file);

}  // namespace kvq
