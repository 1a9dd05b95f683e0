// Everything needed to build a tokenizer, read from GGUF metadata
// (tokenizer.ggml.*) or from tokenizer.json + tokenizer_config.json.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kvq {

class GgufFile;

// GGUF token types (llama.cpp's llama_token_type).
enum TokenType : int32_t {
  kTokenUndefined = 0,
  kTokenNormal = 1,
  kTokenUnknown = 2,
  kTokenControl = 3,      // special: matched only when parsing special tokens
  kTokenUserDefined = 4,  // added token: always matched whole
  kTokenUnused = 5,
  kTokenByte = 6,
};

struct TokenizerSpec {
  std::string model = "gpt2";  // byte-level BPE; other models are rejected
  // Pre-tokenizer name as GGUF spells it: "qwen2", "llama-bpe", "gpt-2", ...
  // Used to pick the split regexes when `split_patterns` is empty.
  std::string pre;
  // Pre-tokenizer split regexes (PCRE2 syntax, as in tokenizer.json), applied
  // in order, each splitting the pieces of the previous one ("Isolated"
  // behaviour: matches and the gaps between them both become pieces).
  std::vector<std::string> split_patterns;
  std::vector<std::string> tokens;   // id -> piece (byte-level unicode form)
  std::vector<int32_t> token_types;  // TokenType per id; empty means all normal
  std::vector<std::string> merges;   // "a b", by rank
  // A pre-token that is itself in the vocabulary is emitted whole without
  // running merges (Llama-3's tokenizer.json sets model.ignore_merges).
  bool ignore_merges = false;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;
  bool add_eos = false;
  std::string chat_template;  // Jinja source as shipped with the model
};

// Reads tokenizer.ggml.* from a GGUF (vocab-only files work). Only
// tokenizer.ggml.model == "gpt2" (byte-level BPE) is accepted.
StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& gguf);

// Reads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json.
StatusOr<TokenizerSpec> TokenizerSpecFromHfFolder(const std::string& dir);

// Same from file contents; `config_json` may be empty (no tokenizer_config.json).
// `name` prefixes error messages (normally the tokenizer.json path).
StatusOr<TokenizerSpec> TokenizerSpecFromHfJson(std::string_view tokenizer_json,
                                                std::string_view config_json,
                                                const std::string& name);

// `path` is a .gguf file (vocab-only files work), a Hugging Face folder, or
// a tokenizer.json inside one: only the tokenizer parts are read.
StatusOr<TokenizerSpec> LoadTokenizerSpec(const std::string& path);

}  // namespace kvq
