// Loading a TokenizerSpec from GGUF metadata or from Hugging Face
// tokenizer.json + tokenizer_config.json. Every error names its source; no
// exception leaves this file (nlohmann is used with exceptions disabled and
// types are checked before every access).
#include <cctype>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "io/gguf.h"
#include "io/mapped_file.h"
#include "model/tokenizer.h"
#include "model/tokenizer_spec.h"

namespace kvq {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------
// GGUF

const char* TokenizerModelKind(const std::string& model) {
  if (model == "llama") return " (SentencePiece)";
  if (model == "bert") return " (WordPiece)";
  if (model == "t5") return " (Unigram)";
  if (model == "rwkv") return " (RWKV)";
  return "";
}

StatusOr<int32_t> OptionalId(const GgufFile& gguf, const char* key, size_t n_tokens) {
  if (gguf.Find(key) == nullptr) return -1;
  KVQ_ASSIGN_OR_RETURN(int64_t id, gguf.GetInt(key));
  if (id < 0 || id >= static_cast<int64_t>(n_tokens)) {
    // llama.cpp writes -1 / UINT32_MAX for "none"; anything else is an error.
    if (id == -1 || id == std::numeric_limits<uint32_t>::max()) return -1;
    return Status::Error(gguf.name() + ": " + key + " = " + std::to_string(id) +
                         " is outside the vocabulary of " + std::to_string(n_tokens));
  }
  return static_cast<int32_t>(id);
}

// ---------------------------------------------------------------------------
// tokenizer.json

// Reports where a JSON document is malformed (the DOM parser, run without
// exceptions, only says that it is).
struct JsonErrorSax : nlohmann::json_sax<json> {
  std::string message;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    message = ex.what();
    (void)position;
    return false;
  }
};

StatusOr<json> ParseJson(std::string_view text, const std::string& name) {
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!doc.is_discarded()) return doc;
  JsonErrorSax sax;
  json::sax_parse(text.begin(), text.end(), &sax, nlohmann::detail::input_format_t::json,
                  /*strict=*/true);
  return Status::Error(name + ": malformed JSON" +
                       (sax.message.empty() ? std::string() : " (" + sax.message + ")"));
}

std::string TypeName(const json& j) { return j.type_name(); }

// Escapes a literal for use inside a PCRE2 pattern (Split {"String": ...}).
std::string RegexQuote(const std::string& s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

// Appends the split patterns of one pre-tokenizer node.
Status ReadPreTokenizer(const json& node, const std::string& where, int depth,
                        std::vector<std::string>& patterns) {
  if (node.is_null()) return Status::Ok();
  if (!node.is_object()) return Status::Error(where + " is " + TypeName(node) + ", not an object");
  if (depth > 8) return Status::Error(where + ": pre-tokenizers nested too deeply");
  auto type_it = node.find("type");
  if (type_it == node.end() || !type_it->is_string()) {
    return Status::Error(where + ".type is missing or not a string");
  }
  const std::string type = type_it->get<std::string>();
  if (type == "Sequence") {
    auto list = node.find("pretokenizers");
    if (list == node.end() || !list->is_array()) {
      return Status::Error(where + ".pretokenizers is missing or not an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      KVQ_RETURN_IF_ERROR(ReadPreTokenizer(
          (*list)[i], where + ".pretokenizers[" + std::to_string(i) + "]", depth + 1, patterns));
    }
    return Status::Ok();
  }
  if (type == "Split") {
    auto pattern = node.find("pattern");
    if (pattern == node.end() || !pattern->is_object()) {
      return Status::Error(where + ".pattern is missing or not an object");
    }
    auto regex = pattern->find("Regex");
    auto literal = pattern->find("String");
    if (regex != pattern->end() && regex->is_string()) {
      patterns.push_back(regex->get<std::string>());
    } else if (literal != pattern->end() && literal->is_string()) {
      patterns.push_back(RegexQuote(literal->get<std::string>()));
    } else {
      return Status::Error(where + ".pattern has neither a Regex nor a String");
    }
    auto behavior = node.find("behavior");
    if (behavior != node.end() && !(behavior->is_string() && *behavior == "Isolated")) {
      return Status::Error(where + ": Split behavior " + behavior->dump() +
                           " is not supported (only \"Isolated\")");
    }
    auto invert = node.find("invert");
    if (invert != node.end() && !(invert->is_boolean() && !invert->get<bool>())) {
      return Status::Error(where + ": Split with invert=true is not supported");
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    auto prefix = node.find("add_prefix_space");
    if (prefix != node.end() && prefix->is_boolean() && prefix->get<bool>()) {
      return Status::Error(where + ": ByteLevel add_prefix_space=true is not supported");
    }
    // use_regex (default true) means ByteLevel splits with GPT-2's pattern.
    auto use_regex = node.find("use_regex");
    if (use_regex == node.end() || !use_regex->is_boolean() || use_regex->get<bool>()) {
      KVQ_ASSIGN_OR_RETURN(auto gpt2, PreTokenizerPatterns("gpt-2"));
      patterns.insert(patterns.end(), gpt2.begin(), gpt2.end());
    }
    return Status::Ok();
  }
  if (type == "Digits") {
    // Digits isolates runs of numeric characters (or single ones).
    auto individual = node.find("individual_digits");
    const bool single =
        individual != node.end() && individual->is_boolean() && individual->get<bool>();
    patterns.push_back(single ? R"(\p{N})" : R"(\p{N}+)");
    return Status::Ok();
  }
  return Status::Error(where + ": pre-tokenizer type '" + type + "' is not supported");
}

Status CheckNormalizer(const json& node, const std::string& where) {
  if (node.is_null()) return Status::Ok();
  if (!node.is_object()) return Status::Error(where + " is " + TypeName(node) + ", not an object");
  auto type = node.find("type");
  if (type == node.end() || !type->is_string()) {
    return Status::Error(where + ".type is missing or not a string");
  }
  // NFC is skipped on purpose (see tokenizer.h): it changes nothing on NFC
  // text, and llama.cpp does not apply it either.
  if (*type == "NFC") return Status::Ok();
  if (*type == "Sequence") {
    auto list = node.find("normalizers");
    if (list == node.end() || !list->is_array()) {
      return Status::Error(where + ".normalizers is missing or not an array");
    }
    for (size_t i = 0; i < list->size() && i < 64; ++i) {
      if ((*list)[i].is_object() && (*list)[i].value("type", json()).is_string() &&
          (*list)[i]["type"] == "Sequence") {
        return Status::Error(where + ": nested normalizer sequences are not supported");
      }
      KVQ_RETURN_IF_ERROR(
          CheckNormalizer((*list)[i], where + ".normalizers[" + std::to_string(i) + "]"));
    }
    return Status::Ok();
  }
  return Status::Error(where + ": normalizer '" + type->get<std::string>() +
                       "' is not supported (byte-level BPE models use none or NFC)");
}

// Llama-3 style files add BOS through the post-processor rather than
// tokenizer_config.json: TemplateProcessing whose "single" template starts
// with a special token (possibly inside a Sequence). Returns that token's
// content, or "" when the post-processor adds nothing in front.
std::string TemplateBosToken(const json& node, int depth) {
  if (!node.is_object() || depth > 4) return "";
  auto type = node.find("type");
  if (type == node.end() || !type->is_string()) return "";
  if (*type == "Sequence") {
    auto list = node.find("processors");
    if (list == node.end() || !list->is_array()) return "";
    for (const json& p : *list) {
      std::string bos = TemplateBosToken(p, depth + 1);
      if (!bos.empty()) return bos;
    }
    return "";
  }
  if (*type != "TemplateProcessing") return "";
  auto single = node.find("single");
  if (single == node.end() || !single->is_array() || single->empty()) return "";
  const json& first = (*single)[0];
  if (!first.is_object() || !first.contains("SpecialToken")) return "";
  const json& st = first["SpecialToken"];
  if (!st.is_object() || !st.contains("id") || !st["id"].is_string()) return "";
  return st["id"].get<std::string>();
}

// bos_token / eos_token / pad_token: a string, {"content": string, ...} or
// null (no such token). An absent key leaves *id unchanged.
Status ConfigTokenId(const json& config, const char* key,
                     const std::unordered_map<std::string, int32_t>& ids, const std::string& name,
                     int32_t* id) {
  auto it = config.find(key);
  if (it == config.end()) return Status::Ok();
  if (it->is_null()) {
    *id = -1;
    return Status::Ok();
  }
  std::string content;
  if (it->is_string()) {
    content = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    content = (*it)["content"].get<std::string>();
  } else {
    return Status::Error(name + ": " + key + " is " + TypeName(*it) +
                         ", expected a string, {\"content\": ...} or null");
  }
  auto found = ids.find(content);
  if (found == ids.end()) {
    return Status::Error(name + ": " + key + " '" + content + "' is not in the vocabulary");
  }
  *id = found->second;
  return Status::Ok();
}

Status ReadTokenizerConfig(std::string_view text, const std::string& name,
                           const std::unordered_map<std::string, int32_t>& ids,
                           TokenizerSpec& spec) {
  KVQ_ASSIGN_OR_RETURN(json config, ParseJson(text, name));
  if (!config.is_object()) return Status::Error(name + ": top level is not an object");
  KVQ_RETURN_IF_ERROR(ConfigTokenId(config, "bos_token", ids, name, &spec.bos_id));
  KVQ_RETURN_IF_ERROR(ConfigTokenId(config, "eos_token", ids, name, &spec.eos_id));
  KVQ_RETURN_IF_ERROR(ConfigTokenId(config, "pad_token", ids, name, &spec.pad_id));
  for (auto [key, field] :
       {std::pair{"add_bos_token", &spec.add_bos}, std::pair{"add_eos_token", &spec.add_eos}}) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_boolean()) return Status::Error(name + ": " + key + " is not a boolean");
    *field = it->get<bool>();
  }
  auto tmpl = config.find("chat_template");
  if (tmpl != config.end() && !tmpl->is_null()) {
    if (tmpl->is_string()) {
      spec.chat_template = tmpl->get<std::string>();
    } else if (tmpl->is_array()) {
      // A list of named templates: [{"name": "default", "template": "..."}, ...].
      for (const json& t : *tmpl) {
        if (t.is_object() && t.value("name", json()) == "default" && t.contains("template") &&
            t["template"].is_string()) {
          spec.chat_template = t["template"].get<std::string>();
        }
      }
      if (spec.chat_template.empty()) {
        return Status::Error(name + ": chat_template list has no template named 'default'");
      }
    } else {
      return Status::Error(name + ": chat_template is " + TypeName(*tmpl) +
                           ", expected a string or a list of named templates");
    }
  }
  return Status::Ok();
}

StatusOr<std::string> ReadWholeFile(const std::string& path) { return ReadTextFile(path); }

// Whether an optional file is there, by stat: opening it to find out would
// wait forever on a FIFO (ReadTextFile then refuses what is not a regular file).
bool PathExists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// model.vocab and added_tokens into spec.tokens and spec.token_types (added
// tokens override: they are matched as literal text before BPE). Ids may
// have holes; they are bounded by the entry count so a hostile file cannot
// make us allocate gigabytes.
Status ReadHfTokens(const json& vocab, const json* added, const std::string& name,
                    TokenizerSpec& spec) {
  const size_t n_added = added != nullptr ? added->size() : 0;
  const int64_t max_id = 2 * static_cast<int64_t>(vocab.size() + n_added) + 1024;
  auto check_id = [&](const json& id, const std::string& what) -> StatusOr<int32_t> {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > max_id) {
      return Status::Error(name + ": " + what + " has id " + id.dump() +
                           ", expected an integer in [0, " + std::to_string(max_id) + "]");
    }
    return static_cast<int32_t>(id.get<int64_t>());
  };
  std::vector<std::pair<int32_t, std::string>> entries;
  entries.reserve(vocab.size());
  int32_t top = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    KVQ_ASSIGN_OR_RETURN(int32_t id, check_id(it.value(), "vocab entry '" + it.key() + "'"));
    entries.emplace_back(id, it.key());
    top = std::max(top, id);
  }
  struct Added {
    int32_t id;
    std::string content;
    bool special;
  };
  std::vector<Added> added_tokens;
  for (size_t i = 0; i < n_added; ++i) {
    const json& t = (*added)[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("id") || !t.contains("content") ||
        !t["content"].is_string()) {
      return Status::Error(name + ": " + where + " needs an integer 'id' and a string 'content'");
    }
    KVQ_ASSIGN_OR_RETURN(int32_t id, check_id(t["id"], where));
    const json special = t.value("special", json(false));
    added_tokens.push_back(
        {id, t["content"].get<std::string>(), special.is_boolean() && special.get<bool>()});
    top = std::max(top, id);
  }
  spec.tokens.assign(static_cast<size_t>(top + 1), std::string());
  spec.token_types.assign(static_cast<size_t>(top + 1), kTokenUndefined);
  for (auto& [id, piece] : entries) {
    spec.tokens[id] = std::move(piece);
    spec.token_types[id] = kTokenNormal;
  }
  for (auto& a : added_tokens) {
    spec.tokens[a.id] = std::move(a.content);
    spec.token_types[a.id] = a.special ? kTokenControl : kTokenUserDefined;
  }
  return Status::Ok();
}

// model.merges, as "a b" strings or as ["a", "b"] pairs.
Status ReadHfMerges(const json& merges, const std::string& name, TokenizerSpec& spec) {
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {
      spec.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      // Newer tokenizers write merges as pairs; both parts are byte-level
      // spellings, which never contain a space, so "a b" is unambiguous.
      const std::string a = m[0].get<std::string>(), b = m[1].get<std::string>();
      if (a.empty() || a.find(' ') != std::string::npos || b.find(' ') != std::string::npos) {
        return Status::Error(name + ": merge " + std::to_string(i) + " " + m.dump() +
                             " contains a space or an empty part");
      }
      spec.merges.push_back(a + " " + b);
    } else {
      return Status::Error(name + ": merge " + std::to_string(i) +
                           " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  return Status::Ok();
}

// BOS from the post-processor's template and the special tokens of
// tokenizer_config.json, both named by content.
Status ReadHfSpecialTokens(const json& doc, std::string_view config_json, TokenizerSpec& spec) {
  std::unordered_map<std::string, int32_t> ids;
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    if (spec.token_types[i] != kTokenUndefined)
      ids.emplace(spec.tokens[i], static_cast<int32_t>(i));
  }
  if (auto post = doc.find("post_processor"); post != doc.end()) {
    const std::string bos = TemplateBosToken(*post, 0);
    if (auto it = ids.find(bos); !bos.empty() && it != ids.end()) {
      spec.add_bos = true;
      spec.bos_id = it->second;
    }
  }
  if (config_json.empty()) return Status::Ok();
  return ReadTokenizerConfig(config_json, "tokenizer_config.json", ids, spec);
}

}  // namespace

StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& gguf) {
  const std::string& name = gguf.name();
  TokenizerSpec spec;
  KVQ_ASSIGN_OR_RETURN(spec.model, gguf.GetString("tokenizer.ggml.model"));
  if (spec.model != "gpt2") {
    return Status::Error(name + ": unsupported tokenizer model '" + spec.model + "'" +
                         TokenizerModelKind(spec.model) + "; kvq supports byte-level BPE (gpt2)");
  }
  if (gguf.Find("tokenizer.ggml.pre") == nullptr) {
    return Status::Error(name +
                         ": tokenizer.ggml.pre is missing; kvq needs the pre-tokenizer "
                         "name to split text as the model was trained");
  }
  KVQ_ASSIGN_OR_RETURN(spec.pre, gguf.GetString("tokenizer.ggml.pre"));
  auto patterns = PreTokenizerPatterns(spec.pre);
  if (!patterns.ok()) return patterns.status().WithContext(name);
  spec.split_patterns = std::move(patterns).value();
  spec.ignore_merges = PreTokenizerIgnoresMerges(spec.pre);

  KVQ_ASSIGN_OR_RETURN(spec.tokens, gguf.GetStringArray("tokenizer.ggml.tokens"));
  const size_t n = spec.tokens.size();
  if (gguf.Find("tokenizer.ggml.token_type") != nullptr) {
    KVQ_ASSIGN_OR_RETURN(auto types, gguf.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() != n) {
      return Status::Error(name + ": tokenizer.ggml.token_type has " +
                           std::to_string(types.size()) + " entries for " + std::to_string(n) +
                           " tokens");
    }
    spec.token_types.reserve(n);
    for (int64_t t : types) {
      spec.token_types.push_back(t >= 0 && t <= kTokenByte ? static_cast<int32_t>(t)
                                                           : kTokenUndefined);
    }
  }
  KVQ_ASSIGN_OR_RETURN(spec.merges, gguf.GetStringArray("tokenizer.ggml.merges"));
  KVQ_ASSIGN_OR_RETURN(spec.bos_id, OptionalId(gguf, "tokenizer.ggml.bos_token_id", n));
  KVQ_ASSIGN_OR_RETURN(spec.eos_id, OptionalId(gguf, "tokenizer.ggml.eos_token_id", n));
  KVQ_ASSIGN_OR_RETURN(spec.pad_id, OptionalId(gguf, "tokenizer.ggml.padding_token_id", n));
  // Defaults as llama.cpp has them when the keys are absent: Llama-3 style
  // vocabularies add BOS, the others do not.
  spec.add_bos = spec.ignore_merges;
  if (gguf.Find("tokenizer.ggml.add_bos_token") != nullptr) {
    KVQ_ASSIGN_OR_RETURN(spec.add_bos, gguf.GetBool("tokenizer.ggml.add_bos_token"));
  }
  if (gguf.Find("tokenizer.ggml.add_eos_token") != nullptr) {
    KVQ_ASSIGN_OR_RETURN(spec.add_eos, gguf.GetBool("tokenizer.ggml.add_eos_token"));
  }
  if (gguf.Find("tokenizer.chat_template") != nullptr) {
    KVQ_ASSIGN_OR_RETURN(spec.chat_template, gguf.GetString("tokenizer.chat_template"));
  }
  return spec;
}

StatusOr<TokenizerSpec> TokenizerSpecFromHfJson(std::string_view tokenizer_json,
                                                std::string_view config_json,
                                                const std::string& name) {
  KVQ_ASSIGN_OR_RETURN(json doc, ParseJson(tokenizer_json, name));
  if (!doc.is_object()) return Status::Error(name + ": top level is not an object");
  auto model = doc.find("model");
  if (model == doc.end() || !model->is_object()) {
    return Status::Error(name + ": 'model' is missing or not an object");
  }
  auto type = model->find("type");
  // Older files omit model.type; the presence of merges identifies BPE.
  if (type != model->end() && !(type->is_string() && *type == "BPE")) {
    return Status::Error(name + ": unsupported tokenizer model " + type->dump() +
                         "; kvq supports byte-level BPE");
  }
  auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object()) {
    return Status::Error(name + ": model.vocab is missing or not an object");
  }
  auto merges = model->find("merges");
  if (merges == model->end() || !merges->is_array()) {
    return Status::Error(name + ": model.merges is missing or not an array");
  }
  auto added = doc.find("added_tokens");
  if (added != doc.end() && !added->is_null() && !added->is_array()) {
    return Status::Error(name + ": added_tokens is not an array");
  }

  TokenizerSpec spec;
  spec.model = "gpt2";
  if (auto im = model->find("ignore_merges"); im != model->end() && im->is_boolean()) {
    spec.ignore_merges = im->get<bool>();
  }
  const json* added_array = (added != doc.end() && added->is_array()) ? &*added : nullptr;
  KVQ_RETURN_IF_ERROR(ReadHfTokens(*vocab, added_array, name, spec));
  KVQ_RETURN_IF_ERROR(ReadHfMerges(*merges, name, spec));
  if (auto norm = doc.find("normalizer"); norm != doc.end()) {
    KVQ_RETURN_IF_ERROR(CheckNormalizer(*norm, "normalizer").WithContext(name));
  }
  if (auto pre = doc.find("pre_tokenizer"); pre != doc.end()) {
    KVQ_RETURN_IF_ERROR(
        ReadPreTokenizer(*pre, "pre_tokenizer", 0, spec.split_patterns).WithContext(name));
  }
  KVQ_RETURN_IF_ERROR(ReadHfSpecialTokens(doc, config_json, spec));
  return spec;
}

StatusOr<TokenizerSpec> TokenizerSpecFromHfFolder(const std::string& dir) {
  const std::string json_path = dir + "/tokenizer.json";
  const std::string config_path = dir + "/tokenizer_config.json";
  KVQ_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(json_path));
  std::string config;
  if (PathExists(config_path)) {
    KVQ_ASSIGN_OR_RETURN(config, ReadWholeFile(config_path));
  }
  auto spec = TokenizerSpecFromHfJson(text, config, json_path);
  if (!spec.ok()) {
    // Errors from the config part name the file only by its base name.
    const std::string& msg = spec.status().message();
    const std::string prefix = "tokenizer_config.json:";
    if (msg.compare(0, prefix.size(), prefix) == 0) {
      return Status::Error(config_path + msg.substr(prefix.size() - 1));
    }
    return spec;
  }
  // Newer Hugging Face folders keep the template in its own file.
  if (spec->chat_template.empty()) {
    const std::string jinja_path = dir + "/chat_template.jinja";
    if (PathExists(jinja_path)) {
      KVQ_ASSIGN_OR_RETURN(spec->chat_template, ReadWholeFile(jinja_path));
    }
  }
  return spec;
}

StatusOr<TokenizerSpec> LoadTokenizerSpec(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return TokenizerSpecFromHfFolder(path);
  const std::filesystem::path p(path);
  if (p.filename() == "tokenizer.json") {
    const std::string dir = p.parent_path().string();
    return TokenizerSpecFromHfFolder(dir.empty() ? "." : dir);
  }
  if (!std::filesystem::exists(p, ec)) return Status::Error(path + ": no such file or folder");
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
  return TokenizerSpecFromGguf(*gguf);
}

}  // namespace kvq
