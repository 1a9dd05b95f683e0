// The registry's generic half: streaming options, aliases, the family list
// and the texts derived from it. Each family's own half is in its file.
#include "kv/codec_registry.h"

#include <algorithm>
#include <cstdio>

namespace kvq {

#define KVQ_CODEC_FAMILY(F) const KvCodecFamily& F();
#include "kv/codec_families.inc"
#undef KVQ_CODEC_FAMILY

namespace {

Status BadName(const std::string& name, const std::string& why) {
  return Status::Error("KV cache type '" + name + "': " + why + " (" + KvCacheTypesSummary() +
                       "; `kvq help cache-types` lists them)");
}

// Non-negative decimal after a one-letter option ("r128"), or -1.
int64_t OptionNumber(const std::string& option, char letter) {
  if (option.size() < 2 || option.size() > 7 || option[0] != letter) return -1;
  const std::string digits = option.substr(1);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

// Removes -rN / -sN / -aN / -prerope (any position after the first part) from
// `spelled`; the rest is the base name.
StatusOr<KvStreamingOptions> SplitStreamingOptions(const std::string& spelled, std::string* base) {
  KvStreamingOptions options;
  bool have_residual = false, have_sinks = false, have_detect = false;
  const std::vector<std::string> parts = SplitKvName(spelled);
  base->clear();
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    const int64_t residual = i > 0 ? OptionNumber(part, 'r') : -1;
    const int64_t sinks = i > 0 ? OptionNumber(part, 's') : -1;
    const int64_t detect = i > 0 ? OptionNumber(part, 'a') : -1;
    if (detect >= 0) {
      if (have_detect) return BadName(spelled, "-a given twice");
      if (detect < 1 || detect > 64) return BadName(spelled, "-aN needs 1 <= N <= 64");
      have_detect = true;
      options.detect = detect;
    } else if (residual >= 0) {
      if (have_residual) return BadName(spelled, "-r given twice");
      if (residual < 1 || residual > 65536) return BadName(spelled, "-rN needs 1 <= N <= 65536");
      have_residual = true;
      options.residual = residual;
    } else if (sinks >= 0) {
      if (have_sinks) return BadName(spelled, "-s given twice");
      if (sinks < 1 || sinks > 4096) return BadName(spelled, "-sN needs 1 <= N <= 4096");
      have_sinks = true;
      options.sinks = sinks;
    } else if (i > 0 && part == "prerope") {
      options.pre_rope = true;
    } else {
      *base += (base->empty() ? "" : "-") + part;
    }
  }
  return options;
}

}  // namespace

std::vector<std::string> SplitKvName(const std::string& name) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dash = name.find('-', start);
    parts.push_back(name.substr(start, dash - start));
    if (dash == std::string::npos) return parts;
    start = dash + 1;
  }
}

int KvNameBits(const std::string& part, const std::string& prefix, std::vector<int> widths) {
  for (int bits : widths) {
    if (part == prefix + std::to_string(bits)) return bits;
  }
  return -1;
}

const std::vector<const KvCodecFamily*>& KvCodecFamilies() {
  static const std::vector<const KvCodecFamily*> families = {
#define KVQ_CODEC_FAMILY(F) &F(),
#include "kv/codec_families.inc"
#undef KVQ_CODEC_FAMILY
  };
  return families;
}

std::string KvStreamingOptions::Suffix() const {
  std::string suffix;
  if (residual > 0) suffix += "-r" + std::to_string(residual);
  if (sinks > 0) suffix += "-s" + std::to_string(sinks);
  if (detect > 0) suffix += "-a" + std::to_string(detect);
  if (pre_rope) suffix += "-prerope";
  return suffix;
}

const KvAlias* FindKvAlias(const std::string& name) {
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (const KvAlias& alias : family->aliases) {
      if (name == alias.alias) return &alias;
    }
  }
  return nullptr;
}

const KvScheme* FindKvScheme(const std::string& name) {
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (const KvScheme& scheme : family->schemes) {
      if (name == scheme.name) return &scheme;
    }
  }
  return nullptr;
}

StatusOr<KvCodecSpec> ParseKvCodecSpec(const std::string& spelled) {
  std::string base;
  KvCodecSpec spec;
  KVQ_ASSIGN_OR_RETURN(spec.streaming, SplitStreamingOptions(spelled, &base));
  if (const KvAlias* alias = FindKvAlias(base)) base = alias->canonical;
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    if (!family->claims(base)) continue;
    spec.family = family;
    KVQ_ASSIGN_OR_RETURN(spec.format, family->parse(base, spelled));
    return spec;
  }
  if (FindKvScheme(base) != nullptr) {
    return BadName(spelled, "a scheme (a K and a V codec), not one codec");
  }
  return BadName(spelled, "unknown type '" + SplitKvName(base)[0] + "'");
}

// Applies -rN / -sN / -aN / -prerope to the codec (see KvStreaming).
StatusOr<std::unique_ptr<KvCodec>> KvCodecSpec::Make(int64_t head_dim, CodecPath path) const {
  const std::string name = Name();
  if (head_dim <= 0 || head_dim > kMaxCodecHeadDim) {
    return Status::Error("KV cache type '" + name + "': head_dim " + std::to_string(head_dim) +
                         " is not supported (1 to " + std::to_string(kMaxCodecHeadDim) + ")");
  }
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCodec> codec, format->Make(head_dim, path));
  KvStreaming st = codec->streaming();
  if (streaming.residual > 0) {
    if (st.tile_tokens > 1) {
      if (streaming.residual % st.tile_tokens != 0) {
        return BadName(name, "-r" + std::to_string(streaming.residual) +
                                 " is not a multiple of the per-channel group " +
                                 std::to_string(st.tile_tokens));
      }
      st.keep_tokens = 0;
      st.flush_tokens = streaming.residual;
    } else {
      st.keep_tokens = streaming.residual;
      st.flush_tokens = 1;
    }
  }
  if (streaming.sinks > 0) st.sink_tokens = streaming.sinks;
  if (streaming.detect > 0) st.detect_sinks = streaming.detect;
  if (streaming.pre_rope) st.pre_rope = true;
  codec->SetStreaming(st, streaming.Suffix());
  return codec;
}

StatusOr<double> KvCodecSpec::ExactBits(int64_t head_dim) const {
  KVQ_ASSIGN_OR_RETURN(auto codec, format->Make(head_dim, CodecPath::kReference));
  return static_cast<double>(codec->RowBytes()) * 8.0 / static_cast<double>(head_dim);
}

StatusOr<std::unique_ptr<KvCodec>> ParseKvCodec(const std::string& name, int64_t head_dim,
                                                CodecPath path) {
  KVQ_ASSIGN_OR_RETURN(const KvCodecSpec spec, ParseKvCodecSpec(name));
  auto codec = spec.Make(head_dim, path);
  if (!codec.ok() && name != spec.Name()) return codec.status().WithContext("'" + name + "'");
  return codec;
}

std::vector<std::string> AllKvCodecNames(int64_t head_dim) {
  std::vector<std::string> names;
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (std::string& name : family->names(head_dim)) names.push_back(std::move(name));
  }
  return names;
}

std::vector<std::string> RegisteredKvCacheTypes(int64_t head_dim) {
  std::vector<std::string> types = AllKvCodecNames(head_dim);
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (std::string& name : family->samples(head_dim)) types.push_back(std::move(name));
  }
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (const KvAlias& alias : family->aliases) types.push_back(alias.alias);
    for (const KvScheme& scheme : family->schemes) types.push_back(scheme.name);
  }
  return types;
}

std::vector<std::string> DefaultKvPlanTypes() {
  std::vector<std::string> rows;
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (const char* row : family->plan_rows) rows.push_back(row);
  }
  return rows;
}

std::string DefaultKvStudySchemes() {
  std::string list;
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (const char* row : family->study_rows) list += (list.empty() ? "" : ",") + std::string(row);
  }
  return list;
}

std::string KvCacheTypesFuzzDictionary() {
  std::vector<std::string> words;
  auto add = [&](const std::string& w) {
    if (!w.empty() && std::find(words.begin(), words.end(), w) == words.end()) words.push_back(w);
  };
  const std::vector<std::string> types = RegisteredKvCacheTypes(128);
  for (const std::string& t : types) add(t);
  for (const std::string& t : types) {
    const std::vector<std::string> parts = SplitKvName(t);
    for (size_t i = 0; i < parts.size(); ++i) add(i == 0 ? parts[i] : "-" + parts[i]);
  }
  for (const char* w : {"/", ":", ";", "*", "..", "#", "-1", "0,-1: "}) add(w);
  std::string out = "# Generated by `kvq help cache-types --fuzz-dict` from the codec registry.\n";
  for (const std::string& w : words) out += "\"" + w + "\"\n";
  return out;
}

std::string KvAliasesSummary() {
  std::string s;
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (const KvAlias& a : family->aliases) {
      s += (s.empty() ? "" : ", ") + std::string(a.alias) + "=" + a.canonical;
    }
  }
  return s;
}

std::string KvCacheTypesSummary() {
  std::string s;
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    s += (s.empty() ? "" : "; ") + std::string(family->syntax);
  }
  s += "; streaming options -rN (newest N tokens in f16), -sN (first N in f16), -aN (N "
       "detected sinks in f16), -prerope (K before RoPE); schemes (SCHEME-sN / SCHEME-aN "
       "give both codecs the option)";
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (const KvScheme& scheme : family->schemes) s += " " + std::string(scheme.name);
  }
  s += "; aliases";
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (const KvAlias& alias : family->aliases) s += " " + std::string(alias.alias);
  }
  return s + "; K/V pairs like f16/int4";
}

namespace {

// Rows of a table: plain text pads columns, Markdown uses pipes.
std::string Table(const std::vector<std::vector<std::string>>& rows, bool markdown) {
  std::string out;
  if (markdown) {
    for (size_t r = 0; r < rows.size(); ++r) {
      out += "|";
      for (const std::string& cell : rows[r]) out += " " + cell + " |";
      out += "\n";
      if (r == 0) {
        out += "|";
        for (size_t c = 0; c < rows[r].size(); ++c) out += "---|";
        out += "\n";
      }
    }
    return out;
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    out += " ";
    for (size_t c = 0; c < row.size(); ++c) {
      out += " " + row[c] + (c + 1 < row.size() ? std::string(width[c] - row[c].size(), ' ') : "");
    }
    out += "\n";
  }
  return out;
}

std::string Bits(double bits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", bits);
  return buf;
}

// "4 / 5" (nominal / exact at head_dim) for a codec or scheme name.
std::string BitsCell(const std::string& k, const std::string& v, int64_t head_dim) {
  auto ks = ParseKvCodecSpec(k), vs = ParseKvCodecSpec(v);
  if (!ks.ok() || !vs.ok()) return "?";
  auto ke = ks->ExactBits(head_dim), ve = vs->ExactBits(head_dim);
  if (!ke.ok() || !ve.ok()) return "?";
  return Bits((ks->NominalBits() + vs->NominalBits()) / 2) + " / " + Bits((*ke + *ve) / 2);
}

}  // namespace

std::string KvCacheTypesHelp(bool markdown) {
  constexpr int64_t kDim = 128;  // the head_dim the bits columns are for
  const std::string h2 = markdown ? "## " : "", nl = "\n";
  std::string out;
  if (markdown) {
    out +=
        "# KV cache types\n\nGenerated by `kvq help cache-types --markdown` from the codec "
        "registry (src/kv/codec_families.inc); a test checks this file equals its output.\n\n";
  }
  out += h2 + "Codec families" + nl + nl;
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    out += (markdown ? "- **`" + std::string(family->syntax) + "`**: "
                     : "  " + std::string(family->syntax) + "\n      ") +
           family->help + nl;
  }
  out += nl + (markdown ? "" : "  ") +
         "Any codec also takes the streaming options -rN (the newest N tokens stay in f16; per "
         "channel, N is a multiple of the group), -sN (the first N tokens also kept in f16), -aN "
         "(up to N tokens per sequence and layer that drew the most attention mass in prefill "
         "kept in f16: detected sinks) and, for K, -prerope (stored before RoPE)." +
         nl + nl;
  out += h2 + "Codecs (bits per value: nominal / exact at head_dim 128)" + nl + nl;
  std::vector<std::vector<std::string>> rows{{"name", "family", "bits"}};
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (const std::string& name : family->names(kDim)) {
      rows.push_back({name, family->name, BitsCell(name, name, kDim)});
    }
  }
  out += Table(rows, markdown) + nl;
  out += h2 + "Schemes (a K and a V codec; bits averaged over K and V)" + nl + nl;
  rows = {{"scheme", "K", "V", "bits", "what"}};
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (const KvScheme& s : family->schemes) {
      rows.push_back({s.name, s.k_type, s.v_type, BitsCell(s.k_type, s.v_type, kDim), s.help});
    }
  }
  out += Table(rows, markdown) + nl;
  out += h2 + "Aliases (other projects' spellings)" + nl + nl;
  rows = {{"alias", "kvq type", "note"}};
  for (const KvCodecFamily* family : KvCodecFamilies()) {
    for (const KvAlias& a : family->aliases) rows.push_back({a.alias, a.canonical, a.note});
  }
  out += Table(rows, markdown);
  return out;
}

}  // namespace kvq
