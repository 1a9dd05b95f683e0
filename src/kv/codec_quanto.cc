// Hugging Face transformers' QuantizedCache with the optimum-quanto backend,
// expressed with kvq's integer codecs and streaming rule.
//
// What HF does (read in huggingface/transformers src/transformers/
// cache_utils.py: QuantizedLayer.update, QuantoQuantizedLayer; and
// huggingface/optimum-quanto optimum/quanto/tensor/optimizers/
// max_optimizer.py, affine_optimizer.py, tensor/grouped.py,
// library/quantize.py (quantize_affine), tensor/qbits.py (dequantize)):
//   - grouping (grouped.py, on the [batch, kv_heads, tokens, head_dim] cache):
//     axis 0 reshapes to rows of q_group_size consecutive values, i.e. per
//     token and KV head, q_group_size channels (when it divides head_dim);
//     axis -1 makes groups of q_group_size consecutive tokens per channel.
//   - MaxOptimizer: per group min and max, scale = (max - min) / (2^b - 1),
//     shift = -min (float, no zero-point rounding: HF does not ask for one).
//   - quantize_affine: u = clamp(round((x + shift) / scale), 0, 2^b - 1),
//     torch.round (half to even); dequantize: u * scale - shift.
//   - update(): the first call (the prompt) quantizes every token at once and
//     attends in full precision; later calls attend over dequantized history
//     + the full-precision residual + the new tokens, append to the residual,
//     and when the residual already holds residual_length - 1 tokens,
//     quantize the whole history again (dequantized values included) and
//     empty the residual: at most residual_length - 1 tokens wait unquantized.
//
// kvq's quanto{b}-g{G}-res{R} (axis 0) is int{b}-g{G}-asym per token with the
// streaming rule keep 0 / flush R: up to R - 1 tokens in f16, all R quantized
// together when the R-th arrives (R = 0: every token at once). quanto{b}-c{G}-
// res{R} (axis -1) is int{b}-c{G}-asym per-channel tiles with the same rule.
// Where it differs from HF, exactly:
//   1. kvq's asym codec stores scale and min as f16 and computes codes from
//      those rounded values, u = round((x - min16) * (1 / scale16)); HF keeps
//      them in the model's dtype and divides.
//   2. HF quantizes a prompt completely at its first update; kvq's rule counts
//      the prompt like any tokens, so (length mod R) of them stay in f16.
//   3. HF re-quantizes already dequantized history at every flush; for axis 0
//      that is the same codes up to float rounding (min and max of a group are
//      reproduced), kvq quantizes every token once. For axis -1, HF's groups
//      run over the flattened (heads, tokens) order and straddle heads when
//      the cached length is not a multiple of q_group_size; kvq's tiles are
//      G tokens of one head.
//   4. HF attends over full-precision values within a forward pass (a
//      prefill); kvq attends over the stored cache for every query.
#include <string>
#include <vector>

#include "kv/codec_formats.h"
#include "kv/codec_registry.h"

namespace kvq {
namespace {

struct QuantoFormat {
  int bits = 4;
  bool per_channel = false;  // HF axis -1
  int64_t group = 64;        // q_group_size
  int64_t residual = 128;    // residual_length
  double Bits() const { return bits; }
  std::string Name() const {
    return "quanto" + std::to_string(bits) + (per_channel ? "-c" : "-g") + std::to_string(group) +
           "-res" + std::to_string(residual);
  }
};

Status BadQuanto(const std::string& spelled, const std::string& why) {
  return Status::Error("KV cache type '" + spelled + "': " + why +
                       " (HF quanto: quanto2|quanto4 [-gG per token | -cG per channel], G 32, 64 "
                       "or 128, [-resR] the residual_length; defaults -g64 -res128)");
}

// Everything is the integer codec's; only the name and the flush rule differ.
class QuantoCodec final : public ForwardingKvCodec {
 public:
  QuantoCodec(const QuantoFormat& f, std::unique_ptr<KvCodec> inner, int64_t head_dim)
      : ForwardingKvCodec(head_dim, std::move(inner)), f_(f) {
    KvStreaming st = this->inner().streaming();
    st.keep_tokens = 0;
    st.flush_tokens = f.residual > 0 ? f.residual : st.tile_tokens;
    SetStreaming(st, "");
  }
  std::string FormatName() const override { return f_.Name(); }

 private:
  QuantoFormat f_;
};

StatusOr<std::unique_ptr<KvCodec>> MakeQuantoCodec(const QuantoFormat& f, int64_t head_dim,
                                                   CodecPath path) {
  const codec::IntFormat base{f.bits, f.group, /*symmetric=*/false, f.per_channel};
  std::unique_ptr<KvCodec> inner;
  if (f.per_channel) {
    if (head_dim % 32 != 0 || static_cast<size_t>(head_dim) * base.ParamBytes() % f.group != 0) {
      return BadQuanto(f.Name(), "per-channel groups need head_dim a multiple of 32 (head_dim " +
                                     std::to_string(head_dim) + ")");
    }
    KVQ_ASSIGN_OR_RETURN(inner, codec::MakeChannelCodec(base, head_dim, path));
  } else {
    if (head_dim % f.group != 0) {
      return BadQuanto(f.Name(), "q_group_size " + std::to_string(f.group) +
                                     " does not divide head_dim " + std::to_string(head_dim) +
                                     " (HF would group across tokens; kvq does not)");
    }
    KVQ_ASSIGN_OR_RETURN(inner, codec::MakeIntCodec(base, head_dim, path));
  }
  return std::unique_ptr<KvCodec>(std::make_unique<QuantoCodec>(f, std::move(inner), head_dim));
}
using QuantoFormatSpec = KvFormatOf<QuantoFormat, MakeQuantoCodec>;

// "128" -> 128 for a decimal of at most 6 digits, else -1.
int64_t Decimal(const std::string& text) {
  if (text.empty() || text.size() > 6 || text.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stoll(text);
}

StatusOr<std::shared_ptr<const KvFormat>> ParseQuanto(const std::string& base,
                                                      const std::string& spelled) {
  const std::vector<std::string> parts = SplitKvName(base);
  QuantoFormat f;
  f.bits = KvNameBits(parts[0], "quanto", {2, 4});
  if (f.bits < 0) return BadQuanto(spelled, "quanto supports nbits 2 or 4 only");
  const std::vector<std::string> spelled_parts = SplitKvName(spelled);
  for (size_t i = 1; i < spelled_parts.size(); ++i) {
    const std::string& part = spelled_parts[i];
    if (part.size() > 1 && part[0] == 'r' && Decimal(part.substr(1)) >= 0) {
      return BadQuanto(spelled, "-rN is kvq's sliding window; HF's residual is -resR");
    }
  }
  bool have_group = false, have_residual = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& o = parts[i];
    if (o.size() > 3 && o.compare(0, 3, "res") == 0 && Decimal(o.substr(3)) >= 0) {
      if (have_residual) return BadQuanto(spelled, "-res given twice");
      have_residual = true;
      f.residual = Decimal(o.substr(3));
    } else if (o.size() > 1 && (o[0] == 'g' || o[0] == 'c') && Decimal(o.substr(1)) >= 0) {
      if (have_group) return BadQuanto(spelled, "the group is given twice");
      have_group = true;
      f.per_channel = o[0] == 'c';
      f.group = Decimal(o.substr(1));
      if (f.group != 32 && f.group != 64 && f.group != 128) {
        return BadQuanto(spelled, "q_group_size must be 32, 64 or 128");
      }
    } else {
      return BadQuanto(spelled, "unknown option '" + o + "'");
    }
  }
  if (f.residual > 65536) return BadQuanto(spelled, "-resR needs R <= 65536");
  if (f.per_channel && f.residual % f.group != 0) {
    return BadQuanto(spelled, "per channel, the residual must be a multiple of the group");
  }
  return QuantoFormatSpec::Of(f);
}

std::vector<std::string> QuantoSamples(int64_t head_dim) {
  if (head_dim % 64 != 0) return {};
  return {"quanto4-g64-res128", "quanto2-g64-res128", "quanto4-c64-res128", "quanto2-g32-res16",
          "quanto4-g64-res0"};
}

}  // namespace

const KvCodecFamily& QuantoCodecFamily() {
  static const KvCodecFamily family{
      "quanto",
      "quanto{2,4}[-gG|-cG][-resR]",
      "Hugging Face transformers' QuantizedCache with the optimum-quanto backend: per group of "
      "G values (-gG: per token, HF axis 0; -cG: per channel over G tokens, HF axis -1) min/max "
      "asymmetric quantization (quanto's MaxOptimizer; kvq's intB-gG-asym / intB-cG-asym codes, "
      "scale and min kept as f16), and HF's residual rule: up to R - 1 newest tokens in f16, all "
      "R quantized at once when the R-th arrives. Unlike HF, a prompt is not quantized "
      "completely at once and history is not re-quantized (codec_quanto.cc lists every "
      "difference).",
      [](const std::string& base) { return base.rfind("quanto", 0) == 0; },
      ParseQuanto,
      [](int64_t) { return std::vector<std::string>{}; },
      QuantoSamples,
      {},
      {},
      {},
      {{"hf-quanto-int4", "quanto4-g64-res128", "quanto4-g64-res128",
        "transformers QuantizedCacheConfig(backend='quanto') defaults: nbits 4, axis_key 0, "
        "axis_value 0, q_group_size 64, residual_length 128"},
       {"hf-quanto-int2", "quanto2-g64-res128", "quanto2-g64-res128", "the same with nbits 2"},
       {"hf-quanto-int4-kc", "quanto4-c64-res128", "quanto4-g64-res128",
        "nbits 4 with axis_key -1 (keys per channel over 64-token groups, KIVI-like)"},
       {"hf-quanto-int2-kc", "quanto2-c64-res128", "quanto2-g64-res128",
        "nbits 2 with axis_key -1"}}};
  return family;
}

}  // namespace kvq
