// GGUF metadata (<arch>.* keys, as llama.cpp writes and reads them) <->
// ModelConfig.
#pragma once

#include <vector>

#include "base/status.h"
#include "io/gguf.h"
#include "model/model_config.h"

namespace kvq {

// Reads the config of a llama or qwen2 GGUF. Facts llama.cpp keeps outside
// the metadata come from the tensors: tie_word_embeddings is "no
// output.weight", attention_bias is "blk.0.attn_q.bias exists", and llama3
// rope scaling is recovered from rope_freqs.weight. rope_layout is kPairs for
// llama (llama.cpp's converter permutes Llama's q/k rows) and kHalves for qwen2.
StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& gguf);

// Writes general.architecture and the <arch>.* keys llama.cpp needs.
void WriteGgufModelConfig(const ModelConfig& config, GgufWriter& writer);

// llama.cpp's per-frequency llama3 RoPE factors (the rope_freqs.weight
// tensor, head_dim / 2 values); empty unless rope_scaling is llama3.
std::vector<float> Llama3RopeFactors(const ModelConfig& config);

}  // namespace kvq
