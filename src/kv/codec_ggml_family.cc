// Registry entry of llama.cpp's cache types (kv/codec_ggml.h): q8_0, q4_0,
// q4_1, q5_0, q5_1, iq4_nl, with llama.cpp's default Hadamard rotation, and
// "-norot" for the same blocks without it.
#include <string>
#include <vector>

#include "kv/codec_ggml.h"
#include "kv/codec_registry.h"

namespace kvq {
namespace {

using codec::GgmlFormat;
using codec::GgmlType;

StatusOr<std::unique_ptr<KvCodec>> MakeGgmlFamilyCodec(const GgmlFormat& f, int64_t head_dim,
                                                       CodecPath path) {
  return codec::MakeGgmlCodec(f, head_dim, path);
}
using GgmlFormatSpec = KvFormatOf<GgmlFormat, MakeGgmlFamilyCodec>;

const GgmlType* FindType(const std::string& part) {
  for (const GgmlType& t : codec::kGgmlTypes) {
    if (part == codec::GgmlTypeName(t)) return &t;
  }
  return nullptr;
}

bool ClaimsGgml(const std::string& base) { return FindType(SplitKvName(base)[0]) != nullptr; }

StatusOr<std::shared_ptr<const KvFormat>> ParseGgml(const std::string& base,
                                                    const std::string& spelled) {
  const std::vector<std::string> parts = SplitKvName(base);
  GgmlFormat format;
  format.type = *FindType(parts[0]);
  format.bits = codec::GgmlCodeBits(format.type);
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i] != "norot" || !format.rotate) {
      return Status::Error("KV cache type '" + spelled + "': unknown option '" + parts[i] +
                           "' (llama.cpp's types take only -norot, and the streaming options)");
    }
    format.rotate = false;
  }
  return GgmlFormatSpec::Of(format);
}

std::vector<std::string> GgmlNames(int64_t head_dim) {
  std::vector<std::string> names;
  if (head_dim % codec::kGgmlBlock != 0) return names;
  for (GgmlType t : codec::kGgmlTypes) names.push_back(codec::GgmlTypeName(t));
  return names;
}

std::vector<std::string> GgmlSamples(int64_t head_dim) {
  std::vector<std::string> names;
  if (head_dim % codec::kGgmlBlock != 0) return names;
  for (GgmlType t : codec::kGgmlTypes)
    names.push_back(std::string(codec::GgmlTypeName(t)) + "-norot");
  names.push_back("q4_0-r64");
  return names;
}

}  // namespace

const KvCodecFamily& GgmlCodecFamily() {
  static const KvCodecFamily family{
      "llama.cpp",
      "q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl[-norot]",
      "llama.cpp's cache types, byte for byte: ggml's 32-value blocks with an f16 scale (and "
      "min: q4_1, q5_1), written by the quantizer llama.cpp's CPU backend uses, and by default "
      "its Hadamard rotation (llama.cpp PR 21038: when head_dim is a multiple of 64, K and q "
      "by blocks of the largest power of two dividing head_dim, V by blocks of 64, undone on "
      "the output); -norot stores the same blocks unrotated (LLAMA_ATTN_ROT_DISABLE=1).",
      ClaimsGgml,
      ParseGgml,
      GgmlNames,
      GgmlSamples,
      {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"},
      {},
      {},
      {}};
  return family;
}

}  // namespace kvq
