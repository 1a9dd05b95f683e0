#include "model/tokenizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "model/pretokenizer.h"

namespace kvq {
namespace {

// ---------------------------------------------------------------------------
// GPT-2 byte <-> unicode map: printable Latin-1 bytes stand for themselves,
// the other 68 bytes (controls, space, 0x7F-0xA0, 0xAD) get U+0100.. in order.

struct ByteLevelTables {
  std::array<uint16_t, 256> byte_to_cp{};
  std::array<int16_t, 324> cp_to_byte{};  // 256 + 68 code points in use
};

constexpr ByteLevelTables MakeByteLevelTables() {
  ByteLevelTables t;
  for (auto& v : t.cp_to_byte) v = -1;
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : 256 + extra++;
    t.byte_to_cp[b] = static_cast<uint16_t>(cp);
    t.cp_to_byte[cp] = static_cast<int16_t>(b);
  }
  return t;
}

constexpr ByteLevelTables kByteLevel = MakeByteLevelTables();

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ---------------------------------------------------------------------------
// Split regexes per GGUF pre-tokenizer name. These are the patterns of each
// model's Hugging Face tokenizer.json (which produced llama.cpp's test
// vectors), so a GGUF and its tokenizer.json split text identically. Names
// and aliases as mapped in llama.cpp's src/llama-vocab.cpp.

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Same as Qwen2 except digits group in runs of up to three.
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Llama.cpp's "\p{N}" split that runs first for SmolLM (its tokenizer.json:
// Digits(individual_digits) before ByteLevel).
constexpr const char* kDigitsPattern = R"(\p{N})";

struct PreTokenizerEntry {
  const char* name;
  const char* pattern;
  bool ignore_merges;
  const char* first = nullptr;  // a split applied before `pattern`, if any
};

constexpr PreTokenizerEntry kPreTokenizers[] = {
    {"gpt-2", kGpt2Pattern, false},
    {"phi-2", kGpt2Pattern, false},
    {"mpt", kGpt2Pattern, false},
    {"olmo", kGpt2Pattern, false},
    {"qwen2", kQwen2Pattern, false},
    {"deepseek-r1-qwen", kQwen2Pattern, false},
    {"megrez", kQwen2Pattern, false},
    {"stablelm2", kQwen2Pattern, false},
    {"llama-bpe", kLlama3Pattern, true},
    {"llama3", kLlama3Pattern, true},
    {"llama-v3", kLlama3Pattern, true},
    {"falcon3", kLlama3Pattern, true},
    {"dbrx", kLlama3Pattern, false},
    {"smaug-bpe", kLlama3Pattern, false},
    {"smollm", kGpt2Pattern, false, kDigitsPattern},
};

const PreTokenizerEntry* FindPreTokenizer(const std::string& pre) {
  for (const auto& e : kPreTokenizers) {
    if (pre == e.name) return &e;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------
// Merge lookup: (left id, right id) -> (rank, merged id). Open addressing
// with linear probing over one flat array: this lookup is the inner loop of
// BPE, and a node-based std::unordered_map costs a cache miss per probe.

// byte_token entry of a byte the vocabulary has no token for.
constexpr int32_t kNoByteToken = -1;

class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t result = 0;
  };

  void Reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Entry{});
    mask_ = cap - 1;
  }
  // Keeps the first (lowest-rank) entry for a pair that appears twice.
  void Insert(int32_t left, int32_t right, int32_t rank, int32_t result) {
    const uint64_t key = Key(left, right);
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return;
      if (slots_[i].key == kEmpty) {
        slots_[i] = Entry{key, rank, result};
        return;
      }
    }
  }
  const Entry* Find(int32_t left, int32_t right) const {
    if (left < 0 || right < 0) return nullptr;  // kNoByteToken never merges
    const uint64_t key = Key(left, right);
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i];
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t Key(int32_t l, int32_t r) {
    return (uint64_t{static_cast<uint32_t>(l)} << 32) | static_cast<uint32_t>(r);
  }
  size_t Hash(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
};

// Heterogeneous lookup so a string_view finds a std::string key without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Pre-token bytes -> token ids, stored as ranges of one flat id array.
struct WordCache {
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> map;
  std::vector<int32_t> ids;
  void Clear() {
    map.clear();
    ids.clear();
  }
};

// Bounds on the shared cache; when exceeded it starts over, which keeps
// memory flat on endless streams of new words (e.g. random bytes).
constexpr size_t kCacheMaxWords = 1 << 18;
constexpr size_t kCacheMaxIds = 1 << 22;
constexpr size_t kCacheMaxWordBytes = 256;  // longer pre-tokens rarely repeat
constexpr size_t kLinearBpeMax = 48;        // quadratic scan beats a heap below this

}  // namespace

// ---------------------------------------------------------------------------

class TokenizerImpl {
 public:
  Status Init(const TokenizerSpec& spec);
  // Init's steps, in order: the spec's sizes and ids, the token tables, the
  // merges that can apply, the pre-tokenizer's split patterns.
  Status CheckSpec();
  void IndexTokens();
  Status BuildMerges();
  Status CompileSplitRegexes();
  void Encode(std::string_view text, const EncodeOptions& options, std::vector<int32_t>& out) const;
  void PreTokenize(std::string_view text, bool parse_special,
                   std::vector<std::string_view>& out) const;

  // Per-call state: regex scratch and reusable buffers.
  struct CallState {
    std::vector<std::unique_ptr<SplitRegex::Scratch>> scratch;
    std::vector<std::string_view> pieces, tmp;
    std::vector<int32_t> syms, ranks, prev, next;
    struct Candidate {
      int32_t rank, left, right;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : left > o.left;
      }
    };
    std::vector<Candidate> heap;
  };
  CallState NewCallState() const;
  template <typename OnSpan, typename OnToken>
  void ForEachSegment(std::string_view text, bool parse_special, OnSpan&& on_span,
                      OnToken&& on_token) const;
  void SplitSpan(std::string_view span, CallState& st, std::vector<std::string_view>& out) const;
  void EncodeSpan(std::string_view span, CallState& st, WordCache& cache,
                  std::vector<int32_t>& out) const;
  void Bpe(std::string_view word, CallState& st, std::vector<int32_t>& out) const;
  void BpeLinear(CallState& st) const;
  void BpeHeap(CallState& st) const;

  TokenizerSpec spec;  // tokens, types, ids, template (merges dropped after Init)
  std::vector<std::string> token_bytes;
  StringIdMap piece_to_id;  // every token, vocabulary spelling
  StringIdMap bytes_to_id;  // normal tokens, raw bytes (for ignore_merges)
  std::array<int32_t, 256> byte_token{};
  MergeTable merges;
  std::vector<std::unique_ptr<SplitRegex>> regexes;
  AddedTokenMatcher added;

  mutable std::mutex cache_mu;
  mutable WordCache cache;
};

Status TokenizerImpl::Init(const TokenizerSpec& in) {
  spec = in;
  KVQ_RETURN_IF_ERROR(CheckSpec());
  IndexTokens();
  KVQ_RETURN_IF_ERROR(BuildMerges());
  return CompileSplitRegexes();
}

Status TokenizerImpl::CheckSpec() {
  if (spec.model != "gpt2") {
    return Status::Error("unsupported tokenizer model '" + spec.model +
                         "'; kvq supports byte-level BPE (gpt2)");
  }
  const size_t n = spec.tokens.size();
  if (n == 0) return Status::Error("empty vocabulary");
  if (n > static_cast<size_t>(INT32_MAX)) return Status::Error("vocabulary too large");
  if (spec.token_types.empty()) spec.token_types.assign(n, kTokenNormal);
  if (spec.token_types.size() != n) {
    return Status::Error("token_type has " + std::to_string(spec.token_types.size()) +
                         " entries but there are " + std::to_string(n) + " tokens");
  }
  for (int32_t* id : {&spec.bos_id, &spec.eos_id, &spec.pad_id}) {
    if (*id < -1 || *id >= static_cast<int64_t>(n)) {
      return Status::Error("special token id " + std::to_string(*id) +
                           " is outside the vocabulary of " + std::to_string(n));
    }
  }
  return Status::Ok();
}

void TokenizerImpl::IndexTokens() {
  const size_t n = spec.tokens.size();
  token_bytes.resize(n);
  piece_to_id.reserve(n);
  bytes_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& piece = spec.tokens[i];
    const int32_t type = spec.token_types[i];
    piece_to_id.emplace(piece, id);  // first id wins on duplicates
    if (type == kTokenNormal) {
      token_bytes[i] = ByteLevelDecode(piece);
      bytes_to_id.emplace(token_bytes[i], id);
    } else {
      // Added tokens are stored as literal text in both GGUF and tokenizer.json.
      token_bytes[i] = piece;
      if (type == kTokenControl || type == kTokenUserDefined) {
        added.Add(piece, id, type == kTokenControl);
      }
    }
  }
  // A byte without a token (SmolLM's vocabulary lacks some control bytes)
  // can take part in no merge and is dropped from the output, as llama.cpp
  // drops a leftover symbol's bytes that have no token.
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_to_id.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    byte_token[b] = it == bytes_to_id.end() ? kNoByteToken : it->second;
  }
}

Status TokenizerImpl::BuildMerges() {
  // Merges whose parts or result are not normal tokens can never apply.
  merges.Reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const std::string& m = spec.merges[rank];
    const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (space == std::string::npos) {
      return Status::Error("merge " + std::to_string(rank) + " '" + m +
                           "' is not two tokens separated by a space");
    }
    const std::string_view left(m.data(), space);
    const std::string_view right(m.data() + space + 1, m.size() - space - 1);
    auto l = piece_to_id.find(left), r = piece_to_id.find(right);
    if (l == piece_to_id.end() || r == piece_to_id.end()) continue;
    auto res = piece_to_id.find(std::string(left) + std::string(right));
    if (res == piece_to_id.end()) continue;
    if (spec.token_types[l->second] != kTokenNormal ||
        spec.token_types[r->second] != kTokenNormal ||
        spec.token_types[res->second] != kTokenNormal) {
      continue;
    }
    merges.Insert(l->second, r->second, static_cast<int32_t>(rank), res->second);
  }
  spec.merges.clear();
  spec.merges.shrink_to_fit();
  return Status::Ok();
}

Status TokenizerImpl::CompileSplitRegexes() {
  std::vector<std::string> patterns = spec.split_patterns;
  if (patterns.empty() && !spec.pre.empty()) {
    KVQ_ASSIGN_OR_RETURN(patterns, PreTokenizerPatterns(spec.pre));
    if (!spec.ignore_merges) spec.ignore_merges = PreTokenizerIgnoresMerges(spec.pre);
  }
  for (const std::string& p : patterns) {
    KVQ_ASSIGN_OR_RETURN(auto re, SplitRegex::Compile(p));
    regexes.push_back(std::move(re));
  }
  return Status::Ok();
}

TokenizerImpl::CallState TokenizerImpl::NewCallState() const {
  CallState st;
  for (const auto& re : regexes) st.scratch.push_back(re->NewScratch());
  return st;
}

void TokenizerImpl::SplitSpan(std::string_view span, CallState& st,
                              std::vector<std::string_view>& out) const {
  if (span.empty()) return;
  if (regexes.empty()) {
    out.push_back(span);
    return;
  }
  if (regexes.size() == 1) {
    regexes[0]->Split(span, *st.scratch[0], out);
    return;
  }
  // Several patterns: each splits the pieces the previous one produced.
  std::vector<std::string_view> cur{span}, next;
  for (size_t r = 0; r < regexes.size(); ++r) {
    next.clear();
    for (std::string_view piece : cur) regexes[r]->Split(piece, *st.scratch[r], next);
    cur.swap(next);
  }
  out.insert(out.end(), cur.begin(), cur.end());
}

// Step 1: cuts added tokens out of `text` (leftmost-longest), calling
// on_span(text between tokens) and on_token(id, token text) in order.
template <typename OnSpan, typename OnToken>
void TokenizerImpl::ForEachSegment(std::string_view text, bool parse_special, OnSpan&& on_span,
                                   OnToken&& on_token) const {
  size_t seg = 0;
  if (!added.empty()) {
    for (size_t i = 0; i < text.size();) {
      int32_t id = -1;
      size_t len = 0;
      if (added.MayStartWith(static_cast<uint8_t>(text[i]))) {
        len = added.Match(text, i, parse_special, &id);
      }
      if (len == 0) {
        ++i;
        continue;
      }
      on_span(text.substr(seg, i - seg));
      on_token(id, text.substr(i, len));
      i += len;
      seg = i;
    }
  }
  on_span(text.substr(seg));
}

void TokenizerImpl::PreTokenize(std::string_view text, bool parse_special,
                                std::vector<std::string_view>& out) const {
  CallState st = NewCallState();
  ForEachSegment(
      text, parse_special, [&](std::string_view span) { SplitSpan(span, st, out); },
      [&](int32_t, std::string_view token) { out.push_back(token); });
}

void TokenizerImpl::Encode(std::string_view text, const EncodeOptions& options,
                           std::vector<int32_t>& out) const {
  if (options.add_special && spec.add_bos && spec.bos_id >= 0) out.push_back(spec.bos_id);
  // Use the shared cache when no other thread holds it; otherwise a private
  // one, so concurrent callers never wait on each other.
  std::unique_lock<std::mutex> lock(cache_mu, std::try_to_lock);
  WordCache local;
  WordCache& wc = lock.owns_lock() ? cache : local;
  CallState st = NewCallState();
  ForEachSegment(
      text, options.parse_special, [&](std::string_view span) { EncodeSpan(span, st, wc, out); },
      [&](int32_t id, std::string_view) { out.push_back(id); });
  if (options.add_special && spec.add_eos && spec.eos_id >= 0) out.push_back(spec.eos_id);
}

void TokenizerImpl::EncodeSpan(std::string_view span, CallState& st, WordCache& wc,
                               std::vector<int32_t>& out) const {
  st.pieces.clear();
  SplitSpan(span, st, st.pieces);
  for (std::string_view word : st.pieces) {
    if (word.size() <= kCacheMaxWordBytes) {
      auto it = wc.map.find(word);
      if (it != wc.map.end()) {
        const auto [begin, count] = it->second;
        out.insert(out.end(), wc.ids.begin() + begin, wc.ids.begin() + begin + count);
        continue;
      }
    }
    const size_t first = out.size();
    if (spec.ignore_merges) {
      auto it = bytes_to_id.find(word);
      if (it != bytes_to_id.end()) {
        out.push_back(it->second);
      } else {
        Bpe(word, st, out);
      }
    } else {
      Bpe(word, st, out);
    }
    if (word.size() <= kCacheMaxWordBytes) {
      if (wc.map.size() >= kCacheMaxWords || wc.ids.size() >= kCacheMaxIds) wc.Clear();
      const auto begin = static_cast<uint32_t>(wc.ids.size());
      wc.ids.insert(wc.ids.end(), out.begin() + first, out.end());
      wc.map.emplace(std::string(word),
                     std::make_pair(begin, static_cast<uint32_t>(out.size() - first)));
    }
  }
}

void TokenizerImpl::Bpe(std::string_view word, CallState& st, std::vector<int32_t>& out) const {
  st.syms.resize(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    st.syms[i] = byte_token[static_cast<uint8_t>(word[i])];
  }
  if (word.size() <= kLinearBpeMax) {
    BpeLinear(st);
    for (int32_t id : st.syms) {
      if (id != kNoByteToken) out.push_back(id);
    }
    return;
  }
  BpeHeap(st);
  for (int32_t i = 0; i >= 0; i = st.next[i]) {
    if (st.syms[i] != kNoByteToken) out.push_back(st.syms[i]);
  }
}

// Short words: keep the symbols compact and scan for the lowest-ranked pair.
// ranks[i] caches the rank of pair (i, i+1) so each merge recomputes two.
void TokenizerImpl::BpeLinear(CallState& st) const {
  auto& syms = st.syms;
  auto& ranks = st.ranks;
  auto rank_of = [&](size_t i) {
    const MergeTable::Entry* e = merges.Find(syms[i], syms[i + 1]);
    return e ? e->rank : INT32_MAX;
  };
  ranks.resize(syms.size());
  for (size_t i = 0; i + 1 < syms.size(); ++i) ranks[i] = rank_of(i);
  while (syms.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < syms.size(); ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == INT32_MAX) break;
    syms[best] = merges.Find(syms[best], syms[best + 1])->result;
    syms.erase(syms.begin() + static_cast<ptrdiff_t>(best) + 1);
    ranks.erase(ranks.begin() + static_cast<ptrdiff_t>(best) + 1);
    if (best + 1 < syms.size()) ranks[best] = rank_of(best);
    if (best > 0) ranks[best - 1] = rank_of(best - 1);
  }
}

// Long words (long runs of punctuation or whitespace): a doubly linked list
// of symbols and a min-heap of candidate pairs ordered by (rank, position),
// O(n log n). Stale heap entries are detected and skipped when popped.
void TokenizerImpl::BpeHeap(CallState& st) const {
  auto& syms = st.syms;
  auto& prev = st.prev;
  auto& next = st.next;
  auto& heap = st.heap;
  const auto n = static_cast<int32_t>(syms.size());
  prev.resize(n);
  next.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  heap.clear();
  const auto cmp = std::greater<CallState::Candidate>();
  auto push = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    if (const MergeTable::Entry* e = merges.Find(syms[left], syms[right])) {
      heap.push_back({e->rank, left, right});
      std::push_heap(heap.begin(), heap.end(), cmp);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i, i + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const CallState::Candidate c = heap.back();
    heap.pop_back();
    // Valid only if both symbols are still adjacent and still form this merge.
    if (syms[c.left] < 0 || syms[c.right] < 0 || next[c.left] != c.right) continue;
    const MergeTable::Entry* e = merges.Find(syms[c.left], syms[c.right]);
    if (e == nullptr || e->rank != c.rank) continue;
    syms[c.left] = e->result;
    syms[c.right] = -1;
    next[c.left] = next[c.right];
    if (next[c.left] >= 0) prev[next[c.left]] = c.left;
    push(prev[c.left], c.left);
    push(c.left, next[c.left]);
  }
}

// ---------------------------------------------------------------------------

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(const TokenizerSpec& spec) {
  auto impl = std::make_unique<TokenizerImpl>();
  KVQ_RETURN_IF_ERROR(impl->Init(spec).WithContext("tokenizer"));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  impl_->Encode(text, options, out);
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && impl_->spec.token_types[id] == kTokenControl) continue;
    out += impl_->token_bytes[id];
  }
  return out;
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->token_bytes[id];
}

std::string_view Tokenizer::Piece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->spec.tokens[id];
}

int32_t Tokenizer::PieceToId(std::string_view piece) const {
  auto it = impl_->piece_to_id.find(piece);
  return it == impl_->piece_to_id.end() ? -1 : it->second;
}

TokenType Tokenizer::Type(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return kTokenUndefined;
  return static_cast<TokenType>(impl_->spec.token_types[id]);
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->spec.tokens.size()); }
int32_t Tokenizer::bos_id() const { return impl_->spec.bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->spec.eos_id; }
int32_t Tokenizer::pad_id() const { return impl_->spec.pad_id; }
bool Tokenizer::add_bos() const { return impl_->spec.add_bos; }
const std::string& Tokenizer::chat_template() const { return impl_->spec.chat_template; }

std::vector<std::string_view> Tokenizer::PreTokenize(std::string_view text,
                                                     bool parse_special) const {
  std::vector<std::string_view> out;
  impl_->PreTokenize(text, parse_special, out);
  return out;
}

void Tokenizer::ClearCache() const {
  std::lock_guard<std::mutex> lock(impl_->cache_mu);
  impl_->cache.Clear();
}

std::string ByteLevelEncode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(kByteLevel.byte_to_cp[static_cast<uint8_t>(c)], out);
  return out;
}

std::string ByteLevelDecode(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  for (size_t i = 0; i < piece.size();) {
    const int len = Utf8SequenceLength(piece, i);
    if (len == 0) {  // not UTF-8: keep the byte as is
      out += piece[i++];
      continue;
    }
    const auto* s = reinterpret_cast<const uint8_t*>(piece.data() + i);
    uint32_t cp = len == 1   ? s[0]
                  : len == 2 ? ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu)
                  : len == 3 ? ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu)
                             : ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) |
                                   ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
    if (cp < kByteLevel.cp_to_byte.size() && kByteLevel.cp_to_byte[cp] >= 0) {
      out += static_cast<char>(kByteLevel.cp_to_byte[cp]);
    } else {
      out.append(piece.data() + i, static_cast<size_t>(len));
    }
    i += static_cast<size_t>(len);
  }
  return out;
}

StatusOr<std::vector<std::string>> PreTokenizerPatterns(const std::string& pre) {
  if (const PreTokenizerEntry* e = FindPreTokenizer(pre)) {
    if (e->first != nullptr) return std::vector<std::string>{e->first, e->pattern};
    return std::vector<std::string>{e->pattern};
  }
  std::string names;
  for (const auto& e : kPreTokenizers) names += std::string(names.empty() ? "" : ", ") + e.name;
  return Status::Error("unsupported pre-tokenizer '" + pre + "' (supported: " + names + ")");
}

bool PreTokenizerIgnoresMerges(const std::string& pre) {
  const PreTokenizerEntry* e = FindPreTokenizer(pre);
  return e != nullptr && e->ignore_merges;
}

}  // namespace kvq
