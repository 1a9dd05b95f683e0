// The codec registry: every KV codec family kvq knows is one KvCodecFamily
// entry (its name parser, aliases, bits, help text, planner rows, named
// schemes and factory), listed once in kv/codec_families.inc. Everything
// user-facing derives from these entries: ParseKvCodec, --help, `kvq help
// cache-types` (and docs/cache-types.md), `kvq plan`'s default rows, the
// study's scheme list, the fuzzer's dictionary and the tests that walk every
// registered name. docs/ARCHITECTURE.md ("Adding a KV cache type") shows how
// a new family is one file plus one line in codec_families.inc.
//
// A name is parsed once into a KvCodecSpec (a typed format plus streaming
// options); caches and the planner make codecs from specs and never parse
// strings per layer or head.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "kv/codec.h"

namespace kvq {

// A codec's stored format as parsed from its name (no head_dim yet):
// immutable, shared by every spec and cache that names it.
class KvFormat {
 public:
  virtual ~KvFormat() = default;
  // Canonical name without streaming options ("int4-g32-asym").
  virtual std::string Name() const = 0;
  // Bits per value of the codes alone (scales, outliers and low-rank
  // factors are in the exact bits).
  virtual double NominalBits() const = 0;
  // The codec for head_dim, or an error naming the head_dim constraint or
  // the kernel this build does not implement.
  virtual StatusOr<std::unique_ptr<KvCodec>> Make(int64_t head_dim, CodecPath path) const = 0;
};

// The KvFormat of a family whose parsed options are a struct F with Name()
// and `bits`, made into codecs by kMake (which checks head_dim).
template <class F, StatusOr<std::unique_ptr<KvCodec>> (*kMake)(const F&, int64_t, CodecPath)>
class KvFormatOf final : public KvFormat {
 public:
  explicit KvFormatOf(const F& f) : f_(f) {}
  static std::shared_ptr<const KvFormat> Of(const F& f) { return std::make_shared<KvFormatOf>(f); }
  std::string Name() const override { return f_.Name(); }
  double NominalBits() const override { return f_.bits; }
  StatusOr<std::unique_ptr<KvCodec>> Make(int64_t head_dim, CodecPath path) const override {
    return kMake(f_, head_dim, path);
  }

 private:
  F f_;
};

// "int4-g32-sym" -> {"int4", "g32", "sym"} (a trailing '-' gives a last "").
std::vector<std::string> SplitKvName(const std::string& name);
// The bit width B of a name part spelled prefix + B with B one of `widths`
// ("int4", "int", {8, 4, 2} -> 4), else -1.
int KvNameBits(const std::string& part, const std::string& prefix, std::vector<int> widths);

// -rN / -sN / -prerope (KvStreaming in codec.h says what they do).
struct KvStreamingOptions {
  int64_t residual = 0;  // -rN: N newest tokens in f16 (0 = none)
  int64_t sinks = 0;     // -sN: first N tokens in f16
  int64_t detect = 0;    // -aN: up to N detected sink tokens in f16
  bool pre_rope = false;
  std::string Suffix() const;  // "-r128-s1-a4-prerope" (canonical order)
};

struct KvCodecFamily;

// A parsed codec name. Cheap to copy.
struct KvCodecSpec {
  const KvCodecFamily* family = nullptr;
  std::shared_ptr<const KvFormat> format;
  KvStreamingOptions streaming;

  bool empty() const { return format == nullptr; }
  // Canonical name: ParseKvCodecSpec(Name()) gives the same spec.
  std::string Name() const { return format->Name() + streaming.Suffix(); }
  double NominalBits() const { return format->NominalBits(); }
  // A codec instance with the streaming options applied (errors name the
  // spec, e.g. a residual that is not a multiple of the per-channel group).
  StatusOr<std::unique_ptr<KvCodec>> Make(int64_t head_dim,
                                          CodecPath path = CodecPath::kSimd) const;
  // Stored bits per value at head_dim: row bytes * 8 / head_dim.
  StatusOr<double> ExactBits(int64_t head_dim) const;
};

// Another spelling of a codec or scheme (vLLM's, llama.cpp's, HF's).
struct KvAlias {
  const char* alias;
  const char* canonical;  // a codec name or a scheme
  const char* note;       // how close it is to what the alias means elsewhere
};

// A named (K codec, V codec) pair, e.g. kivi2.
struct KvScheme {
  const char* name;
  const char* k_type;
  const char* v_type;
  const char* help;
};

struct KvCodecFamily {
  const char* name;    // "int", "float", ... (docs, messages)
  const char* syntax;  // grammar of its names, e.g. "int{8,4,2}[-gG|-cG][-sym|-asym]"
  const char* help;    // one paragraph: what it stores and where it comes from
  // Whether a base name (streaming options removed, aliases resolved) is
  // this family's; the first family that claims a name parses it.
  bool (*claims)(const std::string& base);
  // base -> format; `spelled` is the user's whole name, for messages.
  StatusOr<std::shared_ptr<const KvFormat>> (*parse)(const std::string& base,
                                                     const std::string& spelled);
  // Canonical per-token names valid at head_dim without any file (the
  // generic codec tests iterate them: AllKvCodecNames).
  std::vector<std::string> (*names)(int64_t head_dim);
  // More valid names at head_dim (per-channel, streaming, calibrated): the
  // registry walk and the bit-identity guard run them too.
  std::vector<std::string> (*samples)(int64_t head_dim);
  std::vector<const char*> plan_rows;   // `kvq plan`'s default rows
  std::vector<const char*> study_rows;  // `kvq study`'s default schemes
  std::vector<KvAlias> aliases;
  std::vector<KvScheme> schemes;
};

// Every registered family, in codec_families.inc order.
const std::vector<const KvCodecFamily*>& KvCodecFamilies();

// Codec name (aliases accepted; schemes are not codecs) -> spec. Errors list
// the registered syntax.
StatusOr<KvCodecSpec> ParseKvCodecSpec(const std::string& name);

// The registered scheme or nullptr.
const KvScheme* FindKvScheme(const std::string& name);
// The alias entry for `name` or nullptr.
const KvAlias* FindKvAlias(const std::string& name);

// Every spelling a user may type, valid at head_dim: names, samples, aliases
// and schemes (tests, the fuzzer's dictionary).
std::vector<std::string> RegisteredKvCacheTypes(int64_t head_dim);
// `kvq plan`'s and `kvq study`'s default rows.
std::vector<std::string> DefaultKvPlanTypes();
std::string DefaultKvStudySchemes();  // comma-separated

// The cache-type reference (families, schemes, aliases): plain text for
// --help, or the Markdown of docs/cache-types.md.
std::string KvCacheTypesHelp(bool markdown);
// One line for a flag's help: the families' syntax and the scheme names.
std::string KvCacheTypesSummary();
// A libFuzzer dictionary (fuzz/kv_spec.dict): every registered spelling at
// head_dim 128, each of their dash-separated parts, and the policy syntax.
std::string KvCacheTypesFuzzDictionary();
// "auto=f16, fp8=fp8_e4m3, q8_0=int8-g32-sym, ...".
std::string KvAliasesSummary();

}  // namespace kvq
