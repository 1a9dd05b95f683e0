// Fuzzes the tokenizer.json loader and the tokenizer itself.
//  1. The input as tokenizer.json content -> spec -> tokenizer -> encode a
//     fixed string. Whatever loads and covers every byte must round-trip
//     (Decode(Encode(x)) == x); one that drops bytes must not crash.
//  2. The input as text, encoded by a small fixed byte-level vocabulary with
//     the Qwen2 split regex and added tokens; again it must round-trip.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "model/tokenizer.h"
#include "model/tokenizer_spec.h"

namespace {

// 256 byte tokens, a few merges, one control and one user-defined token.
std::unique_ptr<kvq::Tokenizer> MakeFixedTokenizer() {
  kvq::TokenizerSpec spec;
  for (int b = 0; b < 256; ++b) {
    spec.tokens.push_back(kvq::ByteLevelEncode(std::string(1, static_cast<char>(b))));
  }
  for (const char* m : {"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġ Ġ", "ĠĠ ĠĠ"}) {
    const std::string s = m;
    spec.merges.push_back(s);
    spec.tokens.push_back(s.substr(0, s.find(' ')) + s.substr(s.find(' ') + 1));
  }
  spec.token_types.assign(spec.tokens.size(), kvq::kTokenNormal);
  spec.tokens.push_back("<|im_start|>");
  spec.token_types.push_back(kvq::kTokenControl);
  spec.tokens.push_back("<think>");
  spec.token_types.push_back(kvq::kTokenUserDefined);
  spec.pre = "qwen2";
  auto tok = kvq::Tokenizer::Create(spec);
  if (!tok.ok()) abort();
  return std::move(tok).value();
}

void CheckRoundTrip(const kvq::Tokenizer& tok, std::string_view text) {
  for (bool special : {false, true}) {
    const auto ids = tok.Encode(text, {.add_special = special, .parse_special = special});
    std::string back = tok.Decode(ids, /*skip_special=*/false);
    // add_special may prepend BOS / append EOS; strip their bytes.
    if (special && tok.add_bos() && tok.bos_id() >= 0) {
      back.erase(0, tok.TokenBytes(tok.bos_id()).size());
    }
    if (!(back.size() >= text.size() && std::string_view(back).substr(0, text.size()) == text)) {
      abort();
    }
  }
}

// Whether every single byte survives Encode then Decode. A vocabulary
// without some byte's token drops that byte (as llama.cpp does), so only a
// tokenizer covering all 256 can be held to an exact round trip.
bool CoversEveryByte(const kvq::Tokenizer& tok) {
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    if (tok.Decode(tok.Encode(one, {}), /*skip_special=*/false) != one) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<kvq::Tokenizer> fixed = MakeFixedTokenizer();
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  auto spec = kvq::TokenizerSpecFromHfJson(input, "", "fuzz/tokenizer.json");
  if (spec.ok()) {
    auto tok = kvq::Tokenizer::Create(*spec);
    if (tok.ok()) {
      const std::string text = "Hello, world! It's 2024 \xF0\x9F\xA6\x99 <|im_start|>x\xff\n\n  ";
      if (CoversEveryByte(**tok)) {
        CheckRoundTrip(**tok, text);
      } else {
        (void)(*tok)->Decode((*tok)->Encode(text, {}), /*skip_special=*/false);  // must not crash
      }
    }
  }
  CheckRoundTrip(*fixed, input);
  return 0;
}
