#include "model/synth.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "base/fp16.h"
#include "base/thread_pool.h"
#include "base/threads.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "model/gguf_config.h"
#include "model/hf_config.h"
#include "model/tensor_names.h"

namespace kvq {
namespace {

ModelConfig Make(Architecture arch, int64_t vocab, int64_t hidden, int64_t layers, int64_t heads,
                 int64_t kv_heads, int64_t head_dim, int64_t ffn, double theta, double eps,
                 int64_t ctx, bool tie) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.intermediate_size = ffn;
  c.rope_theta = theta;
  c.rms_norm_eps = eps;
  c.max_position_embeddings = ctx;
  c.tie_word_embeddings = tie;
  c.attention_bias = arch == Architecture::kQwen2;
  c.rope_layout = RopeLayout::kHalves;  // Hugging Face layout; GGUF readers decide per format
  return c;
}

ModelConfig WithLlama3(ModelConfig c, double factor) {
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = factor;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  return c;
}

std::vector<SynthPreset> BuildSynthPresets() {
  using A = Architecture;
  return {
      {"qwen2.5-0.5b", "Qwen2.5-0.5B shapes",
       Make(A::kQwen2, 151936, 896, 24, 14, 2, 64, 4864, 1e6, 1e-6, 32768, true)},
      {"llama-3.2-1b", "Llama-3.2-1B shapes (llama3 rope scaling)",
       WithLlama3(Make(A::kLlama, 128256, 2048, 16, 32, 8, 64, 8192, 500000, 1e-5, 131072, true),
                  32.0)},
      {"smollm2-135m", "SmolLM2-135M shapes (Llama architecture)",
       Make(A::kLlama, 49152, 576, 30, 9, 3, 64, 1536, 100000, 1e-5, 8192, true)},
      {"tiny-qwen2", "test: Qwen2, hidden 64, 4 heads : 2 kv, 2 layers",
       Make(A::kQwen2, 151936, 64, 2, 4, 2, 16, 96, 1e6, 1e-6, 4096, true)},
      {"tiny-qwen2-gqa7", "test: Qwen2, 7 heads : 1 kv head, head_dim 16",
       Make(A::kQwen2, 151936, 112, 2, 7, 1, 16, 160, 1e6, 1e-6, 4096, true)},
      {"tiny-llama-odd", "test: Llama, odd sizes (hidden 96, 3 heads, ffn 200), untied output",
       Make(A::kLlama, 128256, 96, 3, 3, 1, 32, 200, 10000, 1e-5, 2048, false)},
      {"tiny-llama-mha", "test: Llama, 4 heads : 4 kv heads (no grouping), head_dim 64",
       Make(A::kLlama, 128256, 256, 2, 4, 4, 64, 512, 10000, 1e-5, 4096, true)},
      {"tiny-llama3", "test: Llama with llama3 rope scaling, head_dim 32",
       WithLlama3(Make(A::kLlama, 128256, 128, 2, 4, 2, 32, 256, 500000, 1e-5, 131072, true), 8.0)},
  };
}

// splitmix64: a tiny, well-mixed generator, so values depend only on
// (seed, tensor name, element index) and not on thread count.
uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t HashName(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// Fills `out` with standard normal values (Box-Muller), chunk by chunk.
void FillNormal(uint64_t seed, const std::string& name, float* out, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;
  const uint64_t base = HashName(name) ^ (seed * 0x9E3779B97F4A7C15ull);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // Each chunk has its own stream, so the values do not depend on threads.
  ThreadPool pool(chunks > 1 ? AvailableThreads() : 1);
  pool.ForEach(chunks, Schedule::kStatic, [&](int64_t c, int) {
    uint64_t state = base + static_cast<uint64_t>(c) * 0xD1B54A32D192ED03ull;
    const int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; i += 2) {
      const double u1 = (static_cast<double>(SplitMix(state) >> 11) + 1.0) * 0x1.0p-53;
      const double u2 = static_cast<double>(SplitMix(state) >> 11) * 0x1.0p-53;
      const double r = std::sqrt(-2.0 * std::log(u1));
      out[i] = static_cast<float>(r * std::cos(2 * M_PI * u2));
      if (i + 1 < end) out[i + 1] = static_cast<float>(r * std::sin(2 * M_PI * u2));
    }
  });
}

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// llama.cpp's converter reorders each head's q/k rows from "halves" to
// "pairs": row s*(d/2)+j of a head moves to row 2j+s.
std::vector<float> PermuteForGguf(const std::vector<float>& v, int64_t heads, int64_t rows,
                                  int64_t cols) {
  std::vector<float> out(v.size());
  const int64_t d = rows / heads;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t j = 0; j < d / 2; ++j) {
        const int64_t from = h * d + s * (d / 2) + j;
        const int64_t to = h * d + 2 * j + s;
        std::memcpy(&out[to * cols], &v[from * cols], cols * sizeof(float));
      }
    }
  }
  return out;
}

// Reference Q8_0 (ggml's layout): per 32 values one f16 scale amax/127, then
// 32 rounded int8.
void QuantizeQ8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + b * 32;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    uint8_t* block = out + b * 34;
    const uint16_t scale = F32ToF16(d);
    std::memcpy(block, &scale, 2);
    for (int i = 0; i < 32; ++i) {
      block[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(v[i] * id)));
    }
  }
}

void Encode(const std::vector<float>& v, DType dtype, uint8_t* out) {
  const int64_t n = static_cast<int64_t>(v.size());
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, v.data(), v.size() * 4);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = F32ToF16(v[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = F32ToBf16(v[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      break;
    case DType::kQ8_0:
      QuantizeQ8_0(v.data(), n, out);
      break;
    default:  // synthetic models use only the types above (cmd_synth checks)
      break;
  }
}

DType StorageType(const ExpectedTensor& t, DType wanted) {
  if (t.shape.size() < 2) return DType::kF32;
  if (wanted == DType::kQ8_0 && t.shape.back() % 32 != 0) return DType::kF16;
  return wanted;
}

// GPT-2's byte -> printable code point map, as UTF-8 strings.
std::vector<std::string> ByteLevelPieces() {
  std::vector<std::string> pieces(256);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    const uint32_t cp = printable ? b : 256 + extra++;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    pieces[b] = s;
  }
  return pieces;
}

void WriteByteVocab(GgufWriter& w) {
  std::vector<std::string> tokens = ByteLevelPieces();
  std::vector<int32_t> types(256, 1);
  tokens.push_back("<|endoftext|>");
  types.push_back(3);  // control
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "gpt-2");
  w.SetStringArray("tokenizer.ggml.tokens", tokens);
  w.SetInt32Array("tokenizer.ggml.token_type", types);
  w.SetStringArray("tokenizer.ggml.merges", {});
  w.SetUint32("tokenizer.ggml.bos_token_id", 256);
  w.SetUint32("tokenizer.ggml.eos_token_id", 256);
}

uint32_t GgufFileType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 0;  // LLAMA_FTYPE_ALL_F32
    case DType::kF16:
      return 1;  // LLAMA_FTYPE_MOSTLY_F16
    case DType::kQ8_0:
      return 7;  // LLAMA_FTYPE_MOSTLY_Q8_0
    case DType::kBF16:
      return 32;  // LLAMA_FTYPE_MOSTLY_BF16
    default:
      break;
  }
  return 0;
}

}  // namespace

const std::vector<SynthPreset>& SynthPresets() {
  static const std::vector<SynthPreset> presets = BuildSynthPresets();  // immutable after init
  return presets;
}

StatusOr<SynthPreset> FindSynthPreset(std::string_view name) {
  std::string names;
  for (const SynthPreset& p : SynthPresets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + std::string(p.name);
  }
  return Status::Error("unknown preset '" + std::string(name) + "' (available: " + names + ")");
}

std::vector<float> SynthTensorValues(const ModelConfig& config, uint64_t seed,
                                     const std::string& name, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (name == "rope_freqs.weight") return Llama3RopeFactors(config);
  std::vector<float> v(static_cast<size_t>(n));
  FillNormal(seed, name, v.data(), n);
  const bool norm = EndsWith(name, "norm.weight");
  for (float& x : v) x = norm ? 1.0f + 0.02f * x : 0.02f * x;
  return v;
}

Status WriteSynthGguf(ModelConfig config, const GgufFile* vocab, const SynthOptions& options,
                      const std::string& out_path) {
  GgufWriter w;
  if (vocab != nullptr) {
    const GgufValue* tokens = vocab->Find("tokenizer.ggml.tokens");
    if (tokens == nullptr || tokens->type != GgufType::kArray || tokens->elements.empty()) {
      return Status::Error(vocab->name() + ": no tokenizer.ggml.tokens: not a vocabulary file");
    }
    config.vocab_size = static_cast<int64_t>(tokens->elements.size());
  } else {
    config.vocab_size = 257;
  }
  KVQ_RETURN_IF_ERROR(ValidateModelConfig(config));
  WriteGgufModelConfig(config, w);
  w.SetString("general.name", options.name);
  w.SetUint32("general.file_type", GgufFileType(options.dtype));
  if (vocab != nullptr) {
    for (const auto& [key, value] : vocab->metadata()) {
      if (key.rfind("tokenizer.", 0) == 0) w.SetValue(key, value);
    }
  } else {
    WriteByteVocab(w);
  }
  const bool permute = config.arch == Architecture::kLlama;
  for (const ExpectedTensor& t : ExpectedTensors(config)) {
    const DType dtype = StorageType(t, options.dtype);
    const uint64_t seed = options.seed;
    int64_t heads = 0;
    if (permute && (EndsWith(t.name, "attn_q.weight") || EndsWith(t.name, "attn_q.bias"))) {
      heads = config.num_heads;
    } else if (permute && (EndsWith(t.name, "attn_k.weight") || EndsWith(t.name, "attn_k.bias"))) {
      heads = config.num_kv_heads;
    }
    KVQ_RETURN_IF_ERROR(
        w.AddTensorFn(t.name, dtype, t.shape, [config, seed, t, dtype, heads](uint8_t* out) {
          std::vector<float> v = SynthTensorValues(config, seed, t.name, t.shape);
          if (heads > 0) {
            const int64_t cols = t.shape.size() > 1 ? t.shape[1] : 1;
            v = PermuteForGguf(v, heads, t.shape[0], cols);
          }
          Encode(v, dtype, out);
        }));
  }
  return w.Write(out_path);
}

Status WriteSynthHfFolder(const ModelConfig& config, const SynthOptions& options,
                          const std::string& out_dir) {
  KVQ_RETURN_IF_ERROR(ValidateModelConfig(config));
  if (options.dtype == DType::kQ8_0) {
    return Status::Error("safetensors cannot store Q8_0; use f32, f16 or bf16");
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Status::Error(out_dir + ": cannot create directory: " + ec.message());
  const std::string config_path = (std::filesystem::path(out_dir) / "config.json").string();
  KVQ_RETURN_IF_ERROR(WriteTextFile(config_path, HfConfigJson(config)));
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  for (const ExpectedTensor& t : ExpectedTensors(config)) {
    std::optional<std::string> hf = HfNameFromCanonical(t.name);
    if (!hf) continue;  // GGUF-only (rope_freqs): config.json carries rope_scaling
    const DType dtype = StorageType(t, options.dtype);
    const uint64_t seed = options.seed;
    KVQ_RETURN_IF_ERROR(w.AddTensorFn(*hf, dtype, t.shape, [config, seed, t, dtype](uint8_t* out) {
      Encode(SynthTensorValues(config, seed, t.name, t.shape), dtype, out);
    }));
  }
  return w.Write((std::filesystem::path(out_dir) / "model.safetensors").string());
}

}  // namespace kvq
