// kvq info: what a model file is — architecture, shapes, dtypes, parameter
// count, KV-cache bytes per token, tokenizer.
#include <cstdio>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "eval/planner.h"
#include "io/gguf.h"
#include "model/model_files.h"
#include "model/tokenizer_spec.h"
#include "model/transformer.h"
#include "ops/simd_target.h"
#include "tools/commands.h"
#include "tools/model_arg.h"

namespace kvq {
namespace {

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string TokenLabel(const TokenizerSpec& t, int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= t.tokens.size()) return "none";
  return std::to_string(id) + " '" + t.tokens[id] + "'";
}

void PrintTokenizer(const TokenizerSpec& t) {
  std::printf("tokenizer:    %s BPE, pre-tokenizer '%s', %zu tokens, %zu merges\n", t.model.c_str(),
              t.pre.empty() ? "from tokenizer.json" : t.pre.c_str(), t.tokens.size(),
              t.merges.size());
  std::printf("              bos %s, eos %s%s, chat template %s\n", TokenLabel(t, t.bos_id).c_str(),
              TokenLabel(t, t.eos_id).c_str(), t.add_bos ? " (bos added)" : "",
              t.chat_template.empty() ? "none" : "present");
}

// llama.cpp's names for general.file_type (llama_ftype): the "mostly" type of
// the file's matrices, as users read it on model cards ("Q4_K_M").
const char* GgufFileTypeName(int64_t file_type) {
  static constexpr const char* kNames[] = {
      "F32",   "F16",     "Q4_0",   "Q4_1",   nullptr,  nullptr,   nullptr,  "Q8_0",   "Q5_0",
      "Q5_1",  "Q2_K",    "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S",  "Q4_K_M", "Q5_K_S", "Q5_K_M",
      "Q6_K",  "IQ2_XXS", "IQ2_XS", "Q2_K_S", "IQ3_XS", "IQ3_XXS", "IQ1_S",  "IQ4_NL", "IQ3_S",
      "IQ3_M", "IQ2_S",   "IQ2_M",  "IQ4_XS", "IQ1_M",  "BF16"};
  if (file_type >= 0 && file_type < static_cast<int64_t>(std::size(kNames)) &&
      kNames[file_type] != nullptr) {
    return kNames[file_type];
  }
  return "unknown";
}

// What a GGUF file says it is, so a user can check a download against its
// model card: general.name, license and llama.cpp's file type.
void PrintGgufIdentity(const GgufFile& gguf) {
  auto name = gguf.GetString("general.name");
  auto license = gguf.GetString("general.license");
  auto file_type = gguf.GetInt("general.file_type");
  std::printf("name:         %s\n", name.ok() ? name->c_str() : "(no general.name)");
  std::printf("license:      %s\n", license.ok() ? license->c_str() : "(no general.license)");
  if (file_type.ok()) {
    std::printf("file type:    %lld (%s)\n", static_cast<long long>(*file_type),
                GgufFileTypeName(*file_type));
  }
}

// A GGUF without tensors (llama.cpp's ggml-vocab-*.gguf): say so and show
// what it does hold.
Status InfoVocabOnly(const std::string& path) {
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
  std::printf("model:        %s (GGUF v%u)\n", path.c_str(), gguf->version());
  std::printf("note:         no tensors: vocabulary-only file\n");
  if (auto arch = gguf->GetString("general.architecture"); arch.ok()) {
    std::printf("architecture: %s\n", arch->c_str());
  }
  std::printf("metadata:     %zu keys\n", gguf->metadata().size());
  KVQ_ASSIGN_OR_RETURN(TokenizerSpec spec, TokenizerSpecFromGguf(*gguf));
  PrintTokenizer(spec);
  return Status::Ok();
}

void PrintShapes(const ModelConfig& c) {
  std::printf("architecture: %s\n", ArchitectureName(c.arch));
  std::printf("layers:       %lld, hidden %lld, ffn %lld\n", (long long)c.num_layers,
              (long long)c.hidden_size, (long long)c.intermediate_size);
  std::printf("attention:    %lld heads, %lld kv heads (%lld:1), head_dim %lld, q/k/v bias %s\n",
              (long long)c.num_heads, (long long)c.num_kv_heads,
              (long long)(c.num_heads / c.num_kv_heads), (long long)c.head_dim,
              c.attention_bias ? "yes" : "no");
  std::printf("rope:         theta %g, %s layout", c.rope_theta,
              c.rope_layout == RopeLayout::kHalves ? "halves" : "pairs");
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    std::printf(", llama3 scaling factor %g (low %g, high %g, original context %lld)",
                c.rope_scaling.factor, c.rope_scaling.low_freq_factor,
                c.rope_scaling.high_freq_factor,
                (long long)c.rope_scaling.original_max_position_embeddings);
  }
  std::printf("\n");
  std::printf("norm:         RMSNorm eps %g\n", c.rms_norm_eps);
  std::printf("vocab:        %lld, %s\n", (long long)c.vocab_size,
              c.tie_word_embeddings ? "tied embeddings" : "separate output matrix");
  std::printf("context:      %lld tokens (trained)\n", (long long)c.max_position_embeddings);
}

// Parameter count, tensors per dtype and their bytes.
void PrintParameters(const std::vector<TensorRef>& tensors) {
  std::map<std::string, int> per_dtype;
  double bytes = 0;
  for (const TensorRef& t : tensors) {
    ++per_dtype[DTypeName(t.dtype)];
    bytes += static_cast<double>(t.nbytes);
  }
  std::string dtypes;
  for (const auto& [name, n] : per_dtype) {
    dtypes += (dtypes.empty() ? "" : ", ") + name + " x" + std::to_string(n);
  }
  const int64_t params = CountParameters(tensors);
  char count[32];
  if (params >= 1000000000)
    std::snprintf(count, sizeof(count), "%.2fB", params / 1e9);
  else if (params >= 1000000)
    std::snprintf(count, sizeof(count), "%.2fM", params / 1e6);
  else
    std::snprintf(count, sizeof(count), "%lld", (long long)params);
  std::printf("parameters:   %s in %zu tensors (%s), %s\n", count, tensors.size(), dtypes.c_str(),
              Bytes(bytes).c_str());
}

// The f16 cache at a few context lengths, and the exact plan of `kv_type`.
Status PrintKvBytes(const ModelConfig& c, const std::string& kv_type) {
  const int64_t kv = c.KvBytesPerTokenF16();
  std::printf("KV cache f16: %lld bytes/token (%s)", (long long)kv, Bytes(kv).c_str());
  // A few common context lengths up to the trained one, then the trained one.
  std::vector<int64_t> contexts;
  for (int64_t ctx : {int64_t{4096}, int64_t{32768}}) {
    if (ctx < c.max_position_embeddings) contexts.push_back(ctx);
  }
  contexts.push_back(c.max_position_embeddings);
  for (int64_t ctx : contexts) {
    std::printf("; %lld tokens: %s", (long long)ctx, Bytes(static_cast<double>(kv) * ctx).c_str());
  }
  std::printf("\n");
  KvCacheOptions options;
  options.k_type = options.v_type = kv_type;
  options.max_tokens = c.max_position_embeddings;
  KVQ_ASSIGN_OR_RETURN(
      KvTypePlan plan,
      PlanKvType({c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim}, options));
  std::printf(
      "KV plan %s:  %.1f bytes/token exact (nominal %.1f; K %g + V %g per layer), "
      "%zu-byte blocks of %lld tokens\n",
      kv_type.c_str(), plan.layout.BytesPerToken(), plan.nominal_bytes_per_token,
      plan.k_bytes_per_token_layer, plan.v_bytes_per_token_layer, plan.layout.block_bytes,
      (long long)plan.layout.block_tokens);
  return Status::Ok();
}

void PrintBiasNorms(const std::vector<std::vector<double>>& bias_norms) {
  if (bias_norms.empty()) return;
  std::printf("k_proj bias:  L2 norm per layer (per KV head):");
  for (size_t l = 0; l < bias_norms.size(); ++l) {
    std::printf("%s %zu:", l % 6 == 0 ? "\n             " : "", l);
    for (double n : bias_norms[l]) std::printf(" %.1f", n);
    std::printf(l + 1 < bias_norms.size() ? ";" : "\n");
  }
}

Status RunInfo(const std::string& path, const std::string& kv_type) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0) {
    KVQ_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
    if (gguf->tensors().empty()) return InfoVocabOnly(path);
  }
  KVQ_ASSIGN_OR_RETURN(ModelFiles m, OpenModel(path));
  std::printf("model:        %s (%s)\n", path.c_str(), ModelFormatName(m.format));
  if (m.gguf != nullptr) PrintGgufIdentity(*m.gguf);
  PrintShapes(m.config);
  PrintParameters(m.tensors);
  KVQ_RETURN_IF_ERROR(PrintKvBytes(m.config, kv_type));
  KVQ_ASSIGN_OR_RETURN(auto bias_norms, KBiasNorms(m));
  PrintBiasNorms(bias_norms);
  PrintTokenizer(m.tokenizer);
  std::printf("kernels:      SIMD target %s (this CPU and build: %s)\n",
              ops::SimdTargetName().c_str(), ops::SupportedSimdTargetNames().c_str());
  return Status::Ok();
}

}  // namespace

void RegisterInfoCommand(CLI::App& app, CommandContext& ctx) {
  auto path = std::make_shared<std::string>();
  auto kv_type = std::make_shared<std::string>("f16");
  CLI::App* cmd = app.add_subcommand(
      "info", "Show a model's architecture, shapes, dtypes, parameter count and KV bytes/token");
  cmd->add_option("model", *path,
                  "A .gguf file, a Hugging Face folder, or a hub id in the local Hugging Face "
                  "cache")
      ->required()
      ->transform(ModelArgResolver());
  cmd->add_option("--kv-cache-dtype", *kv_type,
                  "Cache type the KV plan line is computed for (default f16; see kvq plan)");
  cmd->callback([&ctx, path, kv_type] {
    Status st = RunInfo(*path, *kv_type);
    if (!st.ok()) {
      ctx.exit_code = CommandError("info", st.message());
    }
  });
}

}  // namespace kvq
