// The one place that knows tensor names: kvq's canonical names are GGUF's
// (token_embd.weight, blk.N.attn_q.weight, ...); Hugging Face names are mapped
// to them here, and the tensors a config implies are listed here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/model_config.h"

namespace kvq {

// Canonical name of a per-layer tensor: BlockTensorName(3, "attn_q.weight")
// is "blk.3.attn_q.weight".
std::string BlockTensorName(int64_t layer, std::string_view suffix);

// Hugging Face name -> canonical name. Returns "" for tensors kvq ignores on
// purpose (rotary_emb.inv_freq, recomputed from the config) and nullopt for
// names it does not know.
std::optional<std::string> CanonicalFromHfName(std::string_view hf_name);
// Canonical -> Hugging Face name (writers); nullopt for GGUF-only tensors
// such as rope_freqs.weight.
std::optional<std::string> HfNameFromCanonical(std::string_view canonical);

struct ExpectedTensor {
  std::string name;            // canonical
  std::vector<int64_t> shape;  // outermost first
  bool required = true;
};
// Every tensor a model with `config` has, in file order (embedding, then
// layer by layer, then output). Optional entries may be absent:
// rope_freqs.weight (llama.cpp's llama3 rope factors).
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config);

}  // namespace kvq
