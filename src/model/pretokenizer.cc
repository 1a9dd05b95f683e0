// Why PCRE2 for the split regexes: the patterns come from tokenizer.json
// verbatim (Hugging Face evaluates them with Oniguruma), so we need a real
// regex engine with Unicode properties (\p{L}, \p{N}), Unicode-aware \s,
// scoped case-insensitivity (?i:...) and negative lookahead (?!\S).
// std::regex has none of the Unicode parts and is slow; RE2 lacks lookahead;
// hand-written splitters (llama.cpp's approach) only cover known patterns.
// PCRE2 has all of it, JIT-compiles patterns to machine code (tens of MB/s),
// and with PCRE2_MATCH_INVALID_UTF it matches safely on arbitrary bytes
// (invalid sequences simply never match), which is how invalid UTF-8 input
// stays defined without a separate validation pass per match call.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/pretokenizer.h"

#include <pcre2.h>

#include <algorithm>

namespace kvq {
namespace {

// Bounds for patterns from untrusted tokenizer.json files: a pathological
// pattern must fail or give up, not hang or exhaust memory.
constexpr size_t kMaxPatternBytes = 16 * 1024;
constexpr uint32_t kMatchLimit = 10'000'000;
constexpr uint32_t kDepthLimit = 10'000;
constexpr uint32_t kHeapLimitKiB = 64 * 1024;
constexpr size_t kJitStackMax = 4 << 20;

pcre2_code* Code(void* p) { return static_cast<pcre2_code*>(p); }

std::string Pcre2ErrorText(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof(buf));
  if (n < 0) return "PCRE2 error " + std::to_string(code);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

}  // namespace

int Utf8SequenceLength(std::string_view text, size_t pos) {
  if (pos >= text.size()) return 0;
  const size_t n = text.size() - pos;
  const auto* s = reinterpret_cast<const uint8_t*>(text.data() + pos);
  const uint8_t c = s[0];
  if (c < 0x80) return 1;
  auto cont = [&](size_t i) { return i < n && (s[i] & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0;   // overlong
    if (c == 0xED && s[1] >= 0xA0) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && s[1] < 0x90) return 0;   // overlong
    if (c == 0xF4 && s[1] >= 0x90) return 0;  // > U+10FFFF
    return 4;
  }
  return 0;  // continuation byte, C0/C1, F5..FF
}

SplitRegex::Scratch::~Scratch() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(context));
  pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack));
}

StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Compile(const std::string& pattern) {
  if (pattern.size() > kMaxPatternBytes) {
    return Status::Error("split regex is " + std::to_string(pattern.size()) +
                         " bytes; the limit is " + std::to_string(kMaxPatternBytes));
  }
  // UCP makes \s, \d, \w and POSIX classes Unicode-aware, as in Oniguruma.
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &error_offset, nullptr);
  if (code == nullptr) {
    return Status::Error("invalid split regex at offset " + std::to_string(error_offset) + ": " +
                         Pcre2ErrorText(error) + " in '" + pattern + "'");
  }
  std::unique_ptr<SplitRegex> re(new SplitRegex());
  re->pattern_ = pattern;
  re->code_ = code;
  // JIT failure (unsupported platform, out of executable memory) is not an
  // error: the interpreter gives the same results, only slower.
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

SplitRegex::~SplitRegex() { pcre2_code_free(Code(code_)); }

std::unique_ptr<SplitRegex::Scratch> SplitRegex::NewScratch() const {
  auto scratch = std::make_unique<Scratch>();
  scratch->match_data = pcre2_match_data_create_from_pattern(Code(code_), nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_set_match_limit(context, kMatchLimit);
  pcre2_set_depth_limit(context, kDepthLimit);
  pcre2_set_heap_limit(context, kHeapLimitKiB);
  scratch->context = context;
  return scratch;
}

int SplitRegex::Match(std::string_view text, size_t start, Scratch& scratch) const {
  auto* md = static_cast<pcre2_match_data*>(scratch.match_data);
  auto* context = static_cast<pcre2_match_context*>(scratch.context);
  if (md == nullptr || context == nullptr) return PCRE2_ERROR_NOMEMORY;
  auto run = [&] {
    return pcre2_match(Code(code_), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                       0, md, context);
  };
  int rc = run();
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_ && scratch.jit_stack == nullptr) {
    auto* stack = pcre2_jit_stack_create(64 * 1024, kJitStackMax, nullptr);
    if (stack != nullptr) {
      scratch.jit_stack = stack;
      pcre2_jit_stack_assign(context, nullptr, stack);
      rc = run();
    }
  }
  return rc;
}

void SplitRegex::Split(std::string_view text, Scratch& scratch,
                       std::vector<std::string_view>& out) const {
  const size_t n = text.size();
  size_t pos = 0;        // where the next search starts
  size_t gap_start = 0;  // end of the last emitted piece
  while (pos < n) {
    const int rc = Match(text, pos, scratch);
    if (rc < 0) break;  // no match, or an error: the rest is one gap piece
    const PCRE2_SIZE* ov =
        pcre2_get_ovector_pointer(static_cast<pcre2_match_data*>(scratch.match_data));
    const size_t begin = ov[0], end = ov[1];
    // \K can report a start after the end; treat anything odd as "give up".
    if (begin > end || end > n || begin < pos) break;
    if (begin == end) {
      // Empty matches produce no piece; step one character so we progress.
      if (begin >= n) break;
      const int len = Utf8SequenceLength(text, begin);
      pos = begin + (len > 0 ? static_cast<size_t>(len) : 1);
      continue;
    }
    if (begin > gap_start) out.push_back(text.substr(gap_start, begin - gap_start));
    out.push_back(text.substr(begin, end - begin));
    gap_start = pos = end;
  }
  if (gap_start < n) out.push_back(text.substr(gap_start));
}

void AddedTokenMatcher::Add(std::string_view text, int32_t id, bool control) {
  if (text.empty()) return;  // an empty token can never be matched
  int32_t node = 0;
  for (char ch : text) {
    const auto byte = static_cast<uint8_t>(ch);
    auto& children = nodes_[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), byte,
                               [](const auto& child, uint8_t b) { return child.first < b; });
    if (it != children.end() && it->first == byte) {
      node = it->second;
    } else {
      const auto next = static_cast<int32_t>(nodes_.size());
      children.insert(it, {byte, next});
      nodes_.emplace_back();  // invalidates `children`; not used below
      node = next;
    }
  }
  // The first id wins when two tokens share a text (as llama.cpp does).
  if (nodes_[node].id < 0) {
    nodes_[node].id = id;
    nodes_[node].control = control;
  }
  first_byte_[static_cast<uint8_t>(text[0])] = true;
}

size_t AddedTokenMatcher::Match(std::string_view text, size_t pos, bool control,
                                int32_t* id) const {
  size_t best = 0;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto byte = static_cast<uint8_t>(text[i]);
    const auto& children = nodes_[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), byte,
                               [](const auto& child, uint8_t b) { return child.first < b; });
    if (it == children.end() || it->first != byte) break;
    node = it->second;
    const Node& n = nodes_[node];
    if (n.id >= 0 && (control || !n.control)) {
      best = i + 1 - pos;
      *id = n.id;
    }
  }
  return best;
}

}  // namespace kvq
