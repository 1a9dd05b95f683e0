// kvq tokenize MODEL TEXT: the ids and pieces a model's tokenizer gives TEXT.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "model/tokenizer_spec.h"
#include "tools/commands.h"
#include "tools/model_arg.h"

namespace kvq {
namespace {

struct TokenizeArgs {
  std::string model;
  std::string text;
  bool no_special = false;
  bool add_special = false;
  bool ids_only = false;
};

// A token's bytes made visible: whitespace and control bytes escaped, bytes
// that are not valid UTF-8 on their own (a token may hold part of a
// character) shown as \xNN.
std::string Visible(std::string_view bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<uint8_t>(bytes[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool valid = len > 0 && i + len <= bytes.size() && !(len == 2 && c < 0xC2);
    for (size_t k = 1; valid && k < len; ++k) {
      valid = (static_cast<uint8_t>(bytes[i + k]) & 0xC0) == 0x80;
    }
    if (!valid) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", c);
      out += buf;
      ++i;
      continue;
    }
    if (len == 1) {
      switch (c) {
        case '\n':
          out += "\\n";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\\':
          out += "\\\\";
          break;
        default:
          if (c < 0x20 || c == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\x%02X", c);
            out += buf;
          } else {
            out += static_cast<char>(c);
          }
      }
    } else {
      out.append(bytes.substr(i, len));
    }
    i += len;
  }
  return out;
}

Status RunTokenize(const TokenizeArgs& args) {
  KVQ_ASSIGN_OR_RETURN(TokenizerSpec spec, LoadTokenizerSpec(args.model));
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Create(spec));
  std::string text = args.text;
  if (text == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  const std::vector<int32_t> ids =
      tok->Encode(text, {.add_special = args.add_special, .parse_special = !args.no_special});
  if (args.ids_only) {
    for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
    std::printf("\n");
    return Status::Ok();
  }
  for (int32_t id : ids) {
    const char* kind = tok->IsControl(id)                   ? "  (control)"
                       : tok->Type(id) == kTokenUserDefined ? "  (added)"
                                                            : "";
    std::printf("%8d  '%s'%s\n", id, Visible(tok->TokenBytes(id)).c_str(), kind);
  }
  std::printf("%zu tokens, %zu bytes\n", ids.size(), text.size());
  return Status::Ok();
}

}  // namespace

void RegisterTokenizeCommand(CLI::App& app, CommandContext& ctx) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Show the token ids and pieces of TEXT");
  cmd->add_option("model", args->model,
                  "A .gguf file (vocab-only works), a Hugging Face folder with tokenizer.json, "
                  "or a hub id in the local Hugging Face cache")
      ->required()
      ->transform(ModelArgResolver());
  cmd->add_option("text", args->text, "Text to tokenize; '-' reads standard input")->required();
  cmd->add_flag("--no-special", args->no_special,
                "Treat control tokens such as <|im_start|> as plain text (default: off, they "
                "are matched whole)");
  cmd->add_flag("--add-special", args->add_special,
                "Add BOS/EOS when the model's metadata asks for it (default: off)");
  cmd->add_flag("--ids-only", args->ids_only,
                "Print only the ids, space-separated on one line (default: off)");
  cmd->callback([&ctx, args] {
    Status st = RunTokenize(*args);
    if (!st.ok()) {
      ctx.exit_code = CommandError("tokenize", st.message());
    }
  });
}

}  // namespace kvq
