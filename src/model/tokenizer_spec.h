// Everything needed to build a tokenizer, read from GGUF metadata
// (tokenizer.ggml.*) or from tokenizer.json + tokenizer_config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvq {

struct TokenizerSpec {
  std::string model = "gpt2";  // byte-level BPE; other models are rejected
  // Pre-tokenizer name as GGUF spells it: "qwen2", "llama-bpe", "gpt-2", ...
  std::string pre;
  std::vector<std::string> tokens;     // id -> piece (byte-level unicode form)
  std::vector<int32_t> token_types;    // GGUF token types; 1 normal, 3 control, 4 user-defined
  std::vector<std::string> merges;     // "a b", by rank
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;
  std::string chat_template;  // Jinja source as shipped with the model
};

}  // namespace kvq
