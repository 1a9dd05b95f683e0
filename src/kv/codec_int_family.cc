// Registry entry of the integer codecs (kv/codec_registry.h): per-token
// groups (codec_int.cc) and per-channel tiles (codec_channel.cc) share one
// grammar, int{8,4,2}[-gG|-cG][-sym|-asym]; KIVI is their scheme.
// llama.cpp's cache types (q4_0 ...) are their own family, codec_ggml_family.cc.
#include <string>
#include <vector>

#include "kv/codec_formats.h"
#include "kv/codec_registry.h"

namespace kvq {
namespace {

constexpr int64_t kGroupSizes[] = {32, 64, 128};
constexpr int kIntBits[] = {8, 4, 2};

Status BadInt(const std::string& spelled, const std::string& why) {
  return Status::Error("KV cache type '" + spelled + "': " + why +
                       " (integer codecs: int8/int4/int2 with -g32/-g64/-g128 per token or "
                       "-c32/-c64/-c128 per channel, and -sym or -asym)");
}

// The registry's factory: head_dim checks, then the per-channel or
// per-token codec.
StatusOr<std::unique_ptr<KvCodec>> MakeIntFamilyCodec(const codec::IntFormat& f, int64_t head_dim,
                                                      CodecPath path) {
  const std::string name = f.Name();
  if (f.per_channel) {
    if (head_dim % 32 != 0 || static_cast<size_t>(head_dim) * f.ParamBytes() % f.group != 0) {
      return BadInt(name, "per-channel codecs need head_dim a multiple of 32 with its " +
                              std::to_string(head_dim) +
                              " parameters filling whole rows (head_dim " +
                              std::to_string(head_dim) + ")");
    }
    return codec::MakeChannelCodec(f, head_dim, path);
  }
  if (head_dim % f.group != 0) {
    return BadInt(name, "group size " + std::to_string(f.group) + " does not divide head_dim " +
                            std::to_string(head_dim));
  }
  return codec::MakeIntCodec(f, head_dim, path);
}
using IntFormatSpec = KvFormatOf<codec::IntFormat, MakeIntFamilyCodec>;

bool ClaimsInt(const std::string& base) { return base.rfind("int", 0) == 0; }

StatusOr<std::shared_ptr<const KvFormat>> ParseInt(const std::string& base,
                                                   const std::string& spelled) {
  const std::vector<std::string> parts = SplitKvName(base);
  codec::IntFormat format;
  format.bits = KvNameBits(parts[0], "int", {8, 4, 2});
  if (format.bits < 0) return BadInt(spelled, "unknown type '" + parts[0] + "'");
  bool have_group = false, have_symmetry = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& option = parts[i];
    if (option == "sym" || option == "asym") {
      if (have_symmetry) return BadInt(spelled, "sym/asym given twice");
      have_symmetry = true;
      format.symmetric = option == "sym";
    } else if (option.size() > 1 && (option[0] == 'g' || option[0] == 'c')) {
      if (have_group) return BadInt(spelled, "group size given twice");
      have_group = true;
      format.per_channel = option[0] == 'c';
      const std::string digits = option.substr(1);
      bool valid = digits.find_first_not_of("0123456789") == std::string::npos;
      format.group = valid && digits.size() <= 4 ? std::stoll(digits) : 0;
      valid = false;
      for (int64_t g : kGroupSizes) valid = valid || format.group == g;
      if (!valid) {
        return BadInt(spelled, "group size '" + option + "' is not 32, 64 or 128 (-g or -c)");
      }
    } else {
      return BadInt(spelled, "unknown option '" + option + "'");
    }
  }
  return IntFormatSpec::Of(format);
}

std::vector<std::string> IntNames(int64_t head_dim) {
  std::vector<std::string> names;
  for (int bits : kIntBits) {
    for (int64_t group : kGroupSizes) {
      if (head_dim % group != 0) continue;
      for (bool symmetric : {true, false}) {
        names.push_back(codec::IntFormat{bits, group, symmetric}.Name());
      }
    }
  }
  return names;
}

}  // namespace

const KvCodecFamily& IntCodecFamily() {
  static const KvCodecFamily family{
      "int",
      "int8|int4|int2[-g32|-g64|-g128|-c32|-c64|-c128][-sym|-asym]",
      "Uniform integer codes with f16 scales (and mins, -asym): per token over groups of G "
      "channels (-gG, default -g32 -asym; -sym takes llama.cpp's q4_0 scale rule), or per channel "
      "over "
      "tiles of G tokens (-cG, KIVI's keys).",
      ClaimsInt,
      ParseInt,
      IntNames,
      AllKvStreamingCodecNames,
      {"int8", "int8-g128", "int4", "int4-g32-sym", "int4-g128", "int2", "int2-g128", "kivi4",
       "kivi2"},
      {"int8", "int4", "int4+rot", "int2", "int2+rot", "f16/int4", "kivi4", "kivi2"},
      {},
      {{"kivi2", "int2-c32-asym-r128", "int2-g32-asym-r128",
        "KIVI (arXiv:2402.02750): K per channel, V per token, group 32, newest 128 in f16"},
       {"kivi4", "int4-c32-asym-r128", "int4-g32-asym-r128", "KIVI at 4 bits"}}};
  return family;
}

}  // namespace kvq
