// Codec names -> codecs (the registry), and the reference fused kernels.
// A new codec family is one file with a Make*Codec factory plus its entry in
// ParseKvCodec and AllKvCodecNames.
#include "kv/codec.h"

#include <sstream>
#include <vector>

#include "kv/codec_formats.h"

namespace kvq {
namespace {

struct FloatName {
  const char* name;
  codec::FloatKind kind;
};
constexpr FloatName kFloatNames[] = {
    {"f32", codec::FloatKind::kF32},          {"f16", codec::FloatKind::kF16},
    {"bf16", codec::FloatKind::kBF16},        {"fp8_e4m3", codec::FloatKind::kFp8E4M3},
    {"fp8_e5m2", codec::FloatKind::kFp8E5M2},
};

// Other spellings users bring from vLLM (fp8 = e4m3) and llama.cpp (the
// q8_0/q4_0/q4_1 cache types have the same group and bytes per value).
struct Alias {
  const char* alias;
  const char* canonical;
};
constexpr Alias kAliases[] = {{"fp8", "fp8_e4m3"},
                              {"q8_0", "int8-g32-sym"},
                              {"q4_0", "int4-g32-sym"},
                              {"q4_1", "int4-g32-asym"}};

constexpr int64_t kGroupSizes[] = {32, 64, 128};
constexpr int kIntBits[] = {8, 4, 2};

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!s.empty() && s.back() == sep) parts.push_back("");
  return parts;
}

Status BadName(const std::string& name, const std::string& why) {
  return Status::Error(
      "KV cache type '" + name + "': " + why +
      " (choose f32, f16, bf16, fp8_e4m3, fp8_e5m2, or int8/int4/int2 with "
      "optional -g32/-g64/-g128 (per token) or -c32/-c64/-c128 (per channel) and "
      "-sym/-asym, e.g. int4-g64-sym; gear2/gear4 (GEAR, e.g. gear2-c64-rank4-iter3-out2); "
      "KVQuant's nuq2/nuq3/nuq4-k or -v with -oP (P% outliers, default 1; need "
      "--kv-calibration); aliases fp8, q8_0, q4_0, q4_1; streaming "
      "options -rN (N newest tokens in f16), -sN (first N tokens in f16), "
      "-prerope (K before RoPE))");
}

// Non-negative decimal after a one-letter option ("r128"), or -1.
int64_t OptionNumber(const std::string& option, char letter) {
  if (option.size() < 2 || option.size() > 7 || option[0] != letter) return -1;
  const std::string digits = option.substr(1);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

struct StreamingOptions {
  int64_t residual = 0, sinks = 0;
  bool pre_rope = false;
  std::string base;  // the name without them
};

StatusOr<StreamingOptions> SplitStreamingOptions(const std::string& spelled) {
  StreamingOptions options;
  bool have_residual = false, have_sinks = false;
  const std::vector<std::string> parts = Split(spelled, '-');
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    const int64_t residual = i > 0 ? OptionNumber(part, 'r') : -1;
    const int64_t sinks = i > 0 ? OptionNumber(part, 's') : -1;
    if (residual >= 0) {
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
      options.base += (options.base.empty() ? "" : "-") + part;
    }
  }
  return options;
}

// Applies -rN / -sN / -prerope to a codec (see KvStreaming).
Status ApplyStreaming(const StreamingOptions& options, const std::string& spelled, KvCodec& codec) {
  KvStreaming streaming = codec.streaming();
  std::string suffix;
  if (options.residual > 0) {
    if (streaming.tile_tokens > 1) {
      if (options.residual % streaming.tile_tokens != 0) {
        return BadName(spelled, "-r" + std::to_string(options.residual) +
                                    " is not a multiple of the per-channel group " +
                                    std::to_string(streaming.tile_tokens));
      }
      streaming.keep_tokens = 0;
      streaming.flush_tokens = options.residual;
    } else {
      streaming.keep_tokens = options.residual;
      streaming.flush_tokens = 1;
    }
    suffix += "-r" + std::to_string(options.residual);
  }
  if (options.sinks > 0) {
    streaming.sink_tokens = options.sinks;
    suffix += "-s" + std::to_string(options.sinks);
  }
  if (options.pre_rope) {
    streaming.pre_rope = true;
    suffix += "-prerope";
  }
  codec.SetStreaming(streaming, suffix);
  return Status::Ok();
}

StatusOr<codec::IntFormat> ParseIntName(const std::string& name, const std::string& spelled) {
  const std::vector<std::string> parts = Split(name, '-');
  if (parts.empty()) return BadName(spelled, "empty name");
  codec::IntFormat format;
  const std::string& base = parts[0];
  if (base == "int8") {
    format.bits = 8;
  } else if (base == "int4") {
    format.bits = 4;
  } else if (base == "int2") {
    format.bits = 2;
  } else {
    return BadName(spelled, "unknown type '" + base + "'");
  }
  bool have_group = false, have_symmetry = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& option = parts[i];
    if (option == "sym" || option == "asym") {
      if (have_symmetry) return BadName(spelled, "sym/asym given twice");
      have_symmetry = true;
      format.symmetric = option == "sym";
    } else if (option.size() > 1 && (option[0] == 'g' || option[0] == 'c')) {
      if (have_group) return BadName(spelled, "group size given twice");
      have_group = true;
      format.per_channel = option[0] == 'c';
      const std::string digits = option.substr(1);
      bool valid = digits.find_first_not_of("0123456789") == std::string::npos;
      format.group = valid && digits.size() <= 4 ? std::stoll(digits) : 0;
      valid = false;
      for (int64_t g : kGroupSizes) valid = valid || format.group == g;
      if (!valid) {
        return BadName(spelled, "group size '" + option + "' is not 32, 64 or 128 (-g or -c)");
      }
    } else {
      return BadName(spelled, "unknown option '" + option + "'");
    }
  }
  return format;
}

// "nuq3-k", "nuq2-v-o2": KVQuant's non-uniform codecs (codec_nuq.cc).
StatusOr<codec::NuqFormat> ParseNuqName(const std::string& name, const std::string& spelled) {
  const std::vector<std::string> parts = Split(name, '-');
  codec::NuqFormat format;
  if (parts[0] == "nuq2" || parts[0] == "nuq3" || parts[0] == "nuq4") {
    format.bits = parts[0][3] - '0';
  } else {
    return BadName(spelled, "unknown type '" + parts[0] + "' (NUQ bits are 2, 3 or 4)");
  }
  if (parts.size() < 2 || (parts[1] != "k" && parts[1] != "v")) {
    return BadName(spelled, "NUQ codecs name the side they calibrate for: nuq3-k or nuq3-v");
  }
  format.is_v = parts[1] == "v";
  bool have_outliers = false;
  for (size_t i = 2; i < parts.size(); ++i) {
    const int64_t percent = OptionNumber(parts[i], 'o');
    if (percent < 0) return BadName(spelled, "unknown option '" + parts[i] + "'");
    if (have_outliers) return BadName(spelled, "-o given twice");
    if (percent > codec::kNuqMaxOutlierPercent) {
      return BadName(spelled, "-oP keeps P% of each row exactly, 0 <= P <= " +
                                  std::to_string(codec::kNuqMaxOutlierPercent));
    }
    have_outliers = true;
    format.outlier_percent = percent;
  }
  return format;
}

}  // namespace

StatusOr<std::unique_ptr<KvCodec>> ParseKvCodec(const std::string& spelled, int64_t head_dim,
                                                CodecPath path) {
  if (head_dim <= 0 || head_dim > kMaxCodecHeadDim) {
    return Status::Error("KV cache type '" + spelled + "': head_dim " + std::to_string(head_dim) +
                         " is not supported (1 to " + std::to_string(kMaxCodecHeadDim) + ")");
  }
  KVQ_ASSIGN_OR_RETURN(const StreamingOptions options, SplitStreamingOptions(spelled));
  std::string name = options.base;
  for (const Alias& a : kAliases) {
    if (name == a.alias) name = a.canonical;
  }
  std::unique_ptr<KvCodec> codec;
  if (name.rfind("gear", 0) == 0) {
    KVQ_ASSIGN_OR_RETURN(const codec::GearFormat format, codec::ParseGearFormat(name, spelled));
    KVQ_ASSIGN_OR_RETURN(codec, codec::MakeGearCodec(format, head_dim, path));
  }
  for (const FloatName& f : kFloatNames) {
    if (name == f.name) codec = codec::MakeFloatCodec(f.kind, head_dim, path);
    if (name.rfind(std::string(f.name) + "-", 0) == 0) {
      return BadName(spelled, std::string(f.name) + " takes no format options");
    }
  }
  if (codec == nullptr && name.rfind("nuq", 0) == 0) {
    KVQ_ASSIGN_OR_RETURN(const codec::NuqFormat format, ParseNuqName(name, spelled));
    if (head_dim % 32 != 0 || head_dim > codec::kNuqMaxHeadDim) {
      return BadName(spelled, "NUQ codecs need head_dim a multiple of 32 up to " +
                                  std::to_string(codec::kNuqMaxHeadDim) + " (head_dim " +
                                  std::to_string(head_dim) + ")");
    }
    codec = codec::MakeNuqCodec(format, head_dim, path);
  }
  if (codec == nullptr) {
    KVQ_ASSIGN_OR_RETURN(const codec::IntFormat format, ParseIntName(name, spelled));
    if (format.per_channel) {
      if (head_dim % 32 != 0 ||
          static_cast<size_t>(head_dim) * format.ParamBytes() % format.group != 0) {
        return BadName(spelled, "per-channel codecs need head_dim a multiple of 32 with its " +
                                    std::to_string(head_dim) +
                                    " parameters filling whole rows "
                                    "(head_dim " +
                                    std::to_string(head_dim) + ")");
      }
      codec = codec::MakeChannelCodec(format, head_dim, path);
    } else {
      if (head_dim % format.group != 0) {
        return BadName(spelled, "group size " + std::to_string(format.group) +
                                    " does not divide head_dim " + std::to_string(head_dim));
      }
      codec = codec::MakeIntCodec(format, head_dim, path);
    }
  }
  KVQ_RETURN_IF_ERROR(ApplyStreaming(options, spelled, *codec));
  return codec;
}

std::vector<std::string> AllKvStreamingCodecNames(int64_t head_dim) {
  std::vector<std::string> names;
  if (head_dim % 32 != 0) return names;
  for (int bits : kIntBits) {
    for (int64_t group : kGroupSizes) {
      for (bool symmetric : {true, false}) {
        if (static_cast<size_t>(head_dim) * (symmetric ? 2 : 4) % group != 0) continue;
        const std::string base = codec::IntFormat{bits, group, symmetric, true}.Name();
        names.push_back(base);
        names.push_back(base + "-r" + std::to_string(4 * group));
      }
    }
    names.push_back("int" + std::to_string(bits) + "-g32-asym-r128");
  }
  names.push_back("f16-s1");
  names.push_back("int4-g32-asym-s4");
  names.push_back("int4-c32-asym-prerope");
  return names;
}

std::vector<std::string> AllKvCodecNames(int64_t head_dim) {
  std::vector<std::string> names;
  for (const FloatName& f : kFloatNames) names.push_back(f.name);
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

namespace codec {

void ScoresByDecoding(const KvCodec& codec, const uint8_t* rows, int64_t n, const float* q,
                      int64_t group, float scale, float* scores, int64_t stride) {
  const int64_t dim = codec.head_dim();
  std::vector<float> x(static_cast<size_t>(dim));  // [head_dim], one decoded row
  for (int64_t t = 0; t < n; ++t) {
    codec.Decode(rows + t * codec.RowBytes(), 1, x.data());
    for (int64_t h = 0; h < group; ++h) {
      double dot = 0.0;
      for (int64_t i = 0; i < dim; ++i) dot += static_cast<double>(q[h * dim + i]) * x[i];
      scores[h * stride + t] = static_cast<float>(scale * dot);
    }
  }
}

void AccumulateVByDecoding(const KvCodec& codec, const uint8_t* rows, int64_t n, const float* p,
                           int64_t group, int64_t stride, float* acc) {
  const int64_t dim = codec.head_dim();
  std::vector<float> x(static_cast<size_t>(n * dim));  // [n, head_dim]
  if (n > 0) codec.Decode(rows, n, x.data());
  for (int64_t h = 0; h < group; ++h) {
    for (int64_t i = 0; i < dim; ++i) {
      double sum = acc[h * dim + i];
      for (int64_t t = 0; t < n; ++t)
        sum += static_cast<double>(p[h * stride + t]) * x[t * dim + i];
      acc[h * dim + i] = static_cast<float>(sum);
    }
  }
}

}  // namespace codec
}  // namespace kvq
