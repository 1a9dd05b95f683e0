// TurboQuant (Zandieh et al., arXiv:2504.19874) and QJL (Zandieh et al.,
// arXiv:2406.03482) KV codecs: names, registry entry and the vLLM presets.
// The codec itself is kv/turbo_quant.cc.
//
// What vLLM's presets store (read in vllm-project/vllm:
// vllm/model_executor/layers/quantization/turboquant/config.py (the preset
// table and the packed sizes), .../turboquant/centroids.py (Lloyd-Max on
// N(0, 1/d)), vllm/v1/attention/ops/triton_turboquant_store.py (the store
// kernels) and vllm/v1/attention/backends/turboquant_attn.py (the rotation)):
//   turboquant_k8v4     K: fp8 e4m3 cast, no rotation, no norm (d bytes).
//                       V: 4-bit uniform over the whole head vector.
//   turboquant_4bit_nc  K: 4-bit Lloyd-Max codes of the rotated unit vector
//                       + f16 norm, norm correction. V: 4-bit uniform.
//   turboquant_k3v4_nc  K: the same at 3 bits. V: 4-bit uniform.
//   turboquant_3bit_nc  K: 3-bit, norm correction. V: 3-bit uniform.
// Rotation: the orthonormal Sylvester Hadamard matrix (no random signs);
// keys are normalised, rotated, each coordinate given the index of the
// nearest Lloyd-Max centroid for N(0, 1/d) (boundaries the midpoints);
// norm correction rescales the centroid vector to unit length before the
// inverse rotation. Values are not rotated: per token, min and
// (max - min) / (2^b - 1) over all head_dim values, both f16, after the codes.
// No QJL stage in any preset ("nc" is norm correction, not "no correction").
// Rows: K ceil(d b / 8) + 2 bytes, V ceil(d b / 8) + 4 bytes.
//
// kvq's versions (row = one token of one KV head, d = head_dim, a power of
// two 16..256; every row padded to a multiple of 4 bytes):
//   tqB[-nc]    TurboQuant_mse, B = 1, 2, 2.5, 3, 3.5, 4: x = ||x|| u, y = R u
//               with R = H D_fixed D_seed / sqrt(d) (kv/hadamard.h's rotation
//               after seeded sign flips), each y_i coded as the nearest of the
//               2^b Lloyd-Max levels of N(0, 1) / sqrt(d). Fractional B: the
//               first d/2 rotated coordinates get ceil(B) bits, the rest
//               floor(B) (the paper's 2.5/3.5-bit settings give outlier
//               channels the extra bit; after a random rotation no coordinate
//               is special, so the split is by position).
//               Row: [codes, little-endian bit stream][f16 norm]. -nc stores
//               ||x|| / ||c|| instead (vLLM's norm correction, folded in).
//   tqB-qjl     TurboQuant_prod, B = 2 .. 5 (and 2.5, 3.5): the MSE codes at
//               B - 1 bits, then m = d sign bits of S r (S Gaussian [d, d],
//               r = y - c the rotated residual), f16 norm, f16 gamma = ||r||.
//               x^ = ||x|| R^T (c + gamma sqrt(pi/2) / m S^T sign(S r)):
//               E_S[q . x^] = q . x (the QJL estimate of q . r is unbiased).
//   qjl[-x2]    QJL keys: m = d (x2: 2d) sign bits of S k, f16 ||k||;
//               q . k ~ ||k|| sqrt(pi/2) / m <S q, sign(S k)> with S q computed
//               from the unquantized query (once per attention call).
//   tqvB        vLLM's TurboQuant values (B = 2, 3, 4): codes, f16 scale, f16 min.
// -seedN picks another rotation and sketch (default 0). Norms saturate at
// the f16 range (|x| > 65504 clips the row's length, as the int codecs'
// scales clip); a row with a non-finite value decodes to NaN (every other
// codec also carries NaN through; Encode has no error channel).
#include <string>
#include <vector>

#include "kv/codec_registry.h"
#include "kv/turbo_quant.h"

namespace kvq::codec {
namespace {

Status BadTurbo(const std::string& spelled, const std::string& why) {
  return Status::Error("KV cache type '" + spelled + "': " + why +
                       " (TurboQuant: tqB[-nc] with B 1, 2, 2.5, 3, 3.5, 4; tqB-qjl with B 2, "
                       "2.5, 3, 3.5, 4, 5; tqvB with B 2, 3, 4; QJL: qjl[-x2]; any of them "
                       "[-seedN])");
}

// "2.5" -> 25, "3" -> 30, else -1.
int Tenths(const std::string& text) {
  if (text == "1" || text == "2" || text == "3" || text == "4" || text == "5") {
    return (text[0] - '0') * 10;
  }
  if (text.size() == 3 && text[1] == '.' && text[2] == '5' && text[0] >= '1' && text[0] <= '4') {
    return (text[0] - '0') * 10 + 5;
  }
  return -1;
}

std::string TenthsName(int bits10) {
  return std::to_string(bits10 / 10) + (bits10 % 10 != 0 ? ".5" : "");
}

}  // namespace

std::string TurboFormat::Name() const {
  std::string name;
  switch (kind) {
    case TurboKind::kMse:
      name = "tq" + TenthsName(bits10) + (norm_correction ? "-nc" : "");
      break;
    case TurboKind::kProd:
      name = "tq" + TenthsName(bits10) + "-qjl";
      break;
    case TurboKind::kQjl:
      name = sketch_multiple == 1 ? "qjl" : "qjl-x" + std::to_string(sketch_multiple);
      break;
    case TurboKind::kUniform:
      name = "tqv" + TenthsName(bits10);
      break;
  }
  if (seed != 0) name += "-seed" + std::to_string(seed);
  return name;
}

StatusOr<TurboFormat> ParseTurboFormat(const std::string& base, const std::string& spelled) {
  const std::vector<std::string> parts = SplitKvName(base);
  TurboFormat f;
  const std::string& head = parts[0];
  if (head == "qjl") {
    f.kind = TurboKind::kQjl;
  } else if (head.rfind("tqv", 0) == 0) {
    f.kind = TurboKind::kUniform;
    f.bits10 = Tenths(head.substr(3));
    if (f.bits10 != 20 && f.bits10 != 30 && f.bits10 != 40) {
      return BadTurbo(spelled, "unknown type '" + head + "'");
    }
  } else if (head.rfind("tq", 0) == 0) {
    f.bits10 = Tenths(head.substr(2));
    if (f.bits10 < 0) return BadTurbo(spelled, "unknown type '" + head + "'");
  } else {
    return BadTurbo(spelled, "unknown type '" + head + "'");
  }
  bool have_seed = false, have_x = false, have_qjl = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& o = parts[i];
    const bool is_tq = f.kind == TurboKind::kMse || f.kind == TurboKind::kProd;
    if (o.size() > 4 && o.size() <= 14 && o.compare(0, 4, "seed") == 0 &&
        o.find_first_not_of("0123456789", 4) == std::string::npos) {
      if (have_seed) return BadTurbo(spelled, "-seed given twice");
      have_seed = true;
      f.seed = std::stoull(o.substr(4));
    } else if (o == "nc" && is_tq) {
      if (f.norm_correction) return BadTurbo(spelled, "-nc given twice");
      f.norm_correction = true;
    } else if (o == "qjl" && is_tq) {
      if (have_qjl) return BadTurbo(spelled, "-qjl given twice");
      have_qjl = true;
      f.kind = TurboKind::kProd;
    } else if ((o == "x1" || o == "x2") && f.kind == TurboKind::kQjl) {
      if (have_x) return BadTurbo(spelled, "-x given twice");
      have_x = true;
      f.sketch_multiple = o[1] - '0';
    } else {
      return BadTurbo(spelled, "unknown option '" + o + "'");
    }
  }
  if (f.kind == TurboKind::kProd) {
    if (f.norm_correction) return BadTurbo(spelled, "-nc is for the MSE codes alone, not -qjl");
    if (f.bits10 < 20) return BadTurbo(spelled, "-qjl needs B >= 2 (B - 1 bits of MSE codes)");
  } else if (f.kind == TurboKind::kMse && f.bits10 > 40) {
    return BadTurbo(spelled, "the MSE codes have at most 4 bits (tq5-qjl has 4 + 1)");
  }
  f.bits = f.kind == TurboKind::kQjl ? f.sketch_multiple : f.bits10 / 10.0;
  return f;
}

}  // namespace kvq::codec

// ---- registry entry (kv/codec_registry.h) ----
namespace kvq {
namespace {

using TurboFormatSpec = KvFormatOf<codec::TurboFormat, codec::MakeTurboCodec>;

StatusOr<std::shared_ptr<const KvFormat>> ParseTurbo(const std::string& base,
                                                     const std::string& spelled) {
  KVQ_ASSIGN_OR_RETURN(const codec::TurboFormat format, codec::ParseTurboFormat(base, spelled));
  return TurboFormatSpec::Of(format);
}

bool ClaimsTurbo(const std::string& base) {
  const std::string head = SplitKvName(base)[0];
  return head == "qjl" || (head.rfind("tq", 0) == 0 && head.size() <= 6);
}

std::vector<std::string> TurboSamples(int64_t head_dim) {
  if (head_dim < 16 || head_dim > codec::kTurboMaxHeadDim || (head_dim & (head_dim - 1)) != 0) {
    return {};
  }
  return {"tq1",          "tq2",     "tq2.5",     "tq3",     "tq3.5",     "tq4",     "tq3-nc",
          "tq4-nc",       "tq2-qjl", "tq2.5-qjl", "tq3-qjl", "tq3.5-qjl", "tq5-qjl", "qjl",
          "qjl-x2-seed3", "tqv2",    "tqv3",      "tqv4",    "tq3-seed9"};
}

}  // namespace

const KvCodecFamily& TurboCodecFamily() {
  static const KvCodecFamily family{
      "turbo",
      "tqB[-nc|-qjl][-seedN]|tqvB|qjl[-x2][-seedN]",
      "TurboQuant (arXiv:2504.19874): a seeded random rotation, then each coordinate of the unit "
      "vector coded with the Lloyd-Max levels of N(0, 1/d) (B = 1..4 bits, 2.5 and 3.5 by "
      "giving half the coordinates one more bit), f16 norm; -nc rescales the codes to unit "
      "length (vLLM's norm correction); -qjl spends one of the B bits on a QJL sign sketch of "
      "the residual so q.k is unbiased. tqvB: vLLM's TurboQuant values (uniform over the row). "
      "QJL (arXiv:2406.03482): keys as d (x2: 2d) signs of a Gaussian projection plus the norm, "
      "scored against the projected unquantized query.",
      ClaimsTurbo,
      ParseTurbo,
      [](int64_t) { return std::vector<std::string>{}; },
      TurboSamples,
      {},
      {},
      {},
      {{"turboquant_k8v4", "fp8_e4m3", "tqv4",
        "vLLM's TurboQuant preset: fp8 keys (kvq's fp8 has a per-head scale), 4-bit uniform "
        "values"},
       {"turboquant_4bit_nc", "tq4-nc", "tqv4",
        "vLLM: 4-bit Lloyd-Max keys with norm correction, 4-bit uniform values"},
       {"turboquant_k3v4_nc", "tq3-nc", "tqv4",
        "vLLM: 3-bit Lloyd-Max keys with norm correction, 4-bit uniform values"},
       {"turboquant_3bit_nc", "tq3-nc", "tqv3",
        "vLLM: 3-bit Lloyd-Max keys with norm correction, 3-bit uniform values"},
       {"turboquant2.5", "tq2.5-qjl", "tq2.5",
        "the paper's 2.5-bit setting: keys TurboQuant_prod (MSE + QJL residual), values "
        "TurboQuant_mse"},
       {"turboquant3.5", "tq3.5-qjl", "tq3.5", "the paper's 3.5-bit setting"},
       {"qjl_k1v4", "qjl", "int4",
        "QJL: 1-bit sign sketch keys (+ f16 norm), per-token 4-bit values"}}};
  return family;
}

}  // namespace kvq
