// Byte-level BPE tokenizer as GPT-2, Qwen2/Qwen2.5 and Llama-3 use it.
//
// Encoding runs in four steps:
//  1. Added tokens (control and user-defined) are cut out of the text whole,
//     leftmost-longest. User-defined tokens always match; control tokens
//     (<|im_start|>, <|endoftext|>) only with EncodeOptions::parse_special.
//  2. Each remaining span is split into pre-tokens by the model's split
//     regexes (PCRE2, see tokenizer.cc for why).
//  3. Each pre-token's bytes start as single-byte tokens and are merged by
//     merge rank, lowest first, leftmost on ties (exactly what Hugging Face
//     tokenizers and llama.cpp do).
//  4. Results per pre-token are cached, since natural text repeats words.
//
// Invalid UTF-8: bytes that are not part of a valid UTF-8 sequence never
// match a split regex, so each maximal run of them becomes its own pre-token
// and goes through byte-level BPE like any other bytes. Nothing is replaced
// or dropped, so Decode(Encode(x)) == x holds for every byte string, valid
// UTF-8 or not, when the vocabulary has a token for every byte (a byte
// without one is dropped, as llama.cpp does; SmolLM2's vocabulary lacks some).
//
// The Hugging Face NFC normalizer (Qwen's tokenizer.json has one) is not
// applied: llama.cpp does not apply it either, and skipping it keeps the
// round trip exact. Text already in NFC (nearly all text) is unaffected.
//
// A Tokenizer is immutable after Create except for its word cache, which is
// internally synchronized: all const methods may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/tokenizer_spec.h"

namespace kvq {

struct EncodeOptions {
  // Add BOS (and EOS) when the model's metadata asks for it (add_bos/add_eos).
  bool add_special = false;
  // Match control tokens such as <|im_start|> in the text. Off by default so
  // that untrusted text cannot inject control tokens; chat formatting turns
  // it on.
  bool parse_special = false;
};

class TokenizerImpl;

class Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> Create(const TokenizerSpec& spec);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  std::vector<int32_t> Encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Concatenated bytes of the tokens. Out-of-range ids are skipped.
  // skip_special drops control tokens (BOS, <|im_end|>, ...).
  std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The bytes a token stands for ("" when out of range).
  std::string_view TokenBytes(int32_t id) const;
  // The token as the vocabulary spells it (byte-level unicode form, e.g. "Ġthe").
  std::string_view Piece(int32_t id) const;
  // Id of a piece in vocabulary spelling, or -1.
  int32_t PieceToId(std::string_view piece) const;
  TokenType Type(int32_t id) const;
  bool IsControl(int32_t id) const { return Type(id) == kTokenControl; }

  int32_t vocab_size() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t pad_id() const;
  bool add_bos() const;
  const std::string& chat_template() const;

  // Steps 1-2 only: the pieces BPE would see (added tokens appear whole).
  // For tests, the CLI and as the benchmark's baseline.
  std::vector<std::string_view> PreTokenize(std::string_view text,
                                            bool parse_special = false) const;
  // Drops cached pre-token results (to measure the cold path).
  void ClearCache() const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

// GPT-2's reversible byte <-> unicode map, used by byte-level vocabularies so
// every byte has a printable stand-in (space -> "Ġ", newline -> "Ċ").
std::string ByteLevelEncode(std::string_view bytes);
// Inverse; characters outside the map are kept as their UTF-8 bytes.
std::string ByteLevelDecode(std::string_view piece);

// Split regexes for a GGUF tokenizer.ggml.pre name; error for unknown names.
StatusOr<std::vector<std::string>> PreTokenizerPatterns(const std::string& pre);
// True for pre-tokenizer names whose tokenizer.json sets ignore_merges (Llama-3).
bool PreTokenizerIgnoresMerges(const std::string& pre);

}  // namespace kvq
