// Pre-tokenization pieces of the byte-level BPE tokenizer (internal to the
// model layer): the PCRE2 split regexes and the added-token matcher.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kvq {

// Length of the valid UTF-8 sequence starting at text[pos] (1..4), or 0 when
// the bytes there are not valid UTF-8 (stray continuation, overlong form,
// surrogate, > U+10FFFF, truncated).
int Utf8SequenceLength(std::string_view text, size_t pos);

// One compiled split regex. Owns its PCRE2 code; thread-safe to use (each
// call brings its own match data through a Scratch).
class SplitRegex {
 public:
  static StatusOr<std::unique_ptr<SplitRegex>> Compile(const std::string& pattern);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Per-call matching state (match data, lazily a larger JIT stack).
  class Scratch;
  std::unique_ptr<Scratch> NewScratch() const;

  // Appends the pieces of `text` to `out`: every non-empty match, and every
  // non-empty gap between matches (Hugging Face "Isolated" split). Pieces
  // tile `text` exactly. Never fails: if PCRE2 reports an error (match limit
  // on a pathological pattern), the rest of `text` becomes one piece.
  void Split(std::string_view text, Scratch& scratch, std::vector<std::string_view>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  SplitRegex() = default;
  int Match(std::string_view text, size_t start, Scratch& scratch) const;

  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*, kept opaque to keep pcre2.h out of headers
  bool jit_ = false;
};

// Per-call PCRE2 state; opaque pointers keep pcre2.h out of this header.
class SplitRegex::Scratch {
 public:
  Scratch() = default;
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

 private:
  friend class SplitRegex;
  void* match_data = nullptr;  // pcre2_match_data_8*
  void* context = nullptr;     // pcre2_match_context_8*: match/heap limits
  // Created on first need: PCRE2's JIT defaults to a 32 KiB stack on the
  // machine stack, which deep backtracking in a hostile pattern can exceed.
  void* jit_stack = nullptr;  // pcre2_jit_stack_8*
};

// Finds added tokens (control / user-defined) in text: a byte trie, so the
// match at a position is the longest token starting there.
class AddedTokenMatcher {
 public:
  void Add(std::string_view text, int32_t id, bool control);
  bool empty() const { return nodes_.size() <= 1; }
  // Longest token starting at text[pos]; returns its length (0: none) and
  // sets *id. Control tokens are considered only when `control` is true.
  size_t Match(std::string_view text, size_t pos, bool control, int32_t* id) const;
  // Quick filter: can any token start with this byte?
  bool MayStartWith(uint8_t byte) const { return first_byte_[byte]; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t id = -1;
    bool control = false;
  };
  std::vector<Node> nodes_{1};
  bool first_byte_[256] = {};
};

}  // namespace kvq
