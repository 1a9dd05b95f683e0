// kvq plan: KV-cache and weight memory for a model (file, folder or preset),
// exact per cache type next to the nominal figure, and whether batch x
// context fits a memory budget.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/default_model.h"
#include "eval/planner.h"
#include "model/model_presets.h"
#include "tools/commands.h"
#include "tools/kv_flags.h"
#include "tools/model_arg.h"

namespace kvq {
namespace {

struct PlanFlags {
  std::string model;
  int64_t context = 0;
  int64_t batch = 1;
  std::string memory;
  std::string weights_dtype = "f16";
  std::vector<std::string> types;
  bool json = false;
  bool list_presets = false;
  KvFlags kv;
};

// Decimal bytes in the largest unit that keeps a leading digit: "1.07 GB".
std::string Human(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

// Table cells in the table's unit (GB, or MB for small models).
std::string Cell(double bytes, double unit) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", bytes / unit);
  return buf;
}

std::string ContextLabel(int64_t c) {
  return c % 1024 == 0 ? std::to_string(c / 1024) + "K" : std::to_string(c);
}

struct Row {
  std::string label;
  StatusOr<KvTypePlan> plan;
};

// Everything `kvq plan` prints, as text or JSON.
struct Plan {
  PlanModel model;
  KvShape shape;
  int64_t context = 0, batch = 1;
  double weight_bytes = 0;
  std::string weight_label;  // "as stored" or the preset's dtype
  double memory = 0;
  std::string memory_label;       // where the budget came from
  bool under_policy = false;      // --kv-policy given
  KvTypePlan selected;            // the cache of the fit question
  std::vector<Row> rows;          // the comparison table, uniform types
  std::vector<int64_t> contexts;  // the table's columns
  FitAnswer fit;
  std::vector<std::string> warnings;
};

// Weights: the file's bytes, or the preset in the chosen dtype.
Status ResolveWeights(const PlanModel& model, const std::string& dtype, Plan* plan) {
  if (model.weights_from_file) {
    for (const auto& [stored, bytes] : model.weight_bytes) plan->weight_bytes += bytes;
    plan->weight_label = "as stored";
    return Status::Ok();
  }
  for (const auto& [candidate, bytes] : model.weight_bytes) {
    if (candidate != dtype) continue;
    plan->weight_bytes = static_cast<double>(bytes);
    plan->weight_label = dtype;
    return Status::Ok();
  }
  return Status::Error("--weights-dtype must be f32, f16, bf16 or q8_0");
}

// The budget: --memory when given, else this machine's RAM.
Status ResolveMemory(const std::string& flag, Plan* plan) {
  const double ram = PhysicalRamBytes();
  plan->memory = ram;
  plan->memory_label = "this machine's RAM";
  if (flag.empty()) return Status::Ok();
  auto parsed = ParseKvMemory(flag, static_cast<size_t>(ram));
  if (!parsed.ok()) {
    // Same syntax as --kv-memory; name the flag the user actually gave.
    std::string message = parsed.status().message();
    if (message.rfind("--kv-memory", 0) == 0) message.replace(0, 11, "--memory");
    return Status::Error(message);
  }
  plan->memory = static_cast<double>(*parsed);
  plan->memory_label = "--memory " + flag;
  return Status::Ok();
}

// Prints the advice for the chosen cache before anything can fail, so it
// shows beside any error.
void WarnEarly(const PlanModel& model, const KvCacheOptions& options) {
  auto k_bits = NominalBits(options.k_type);
  auto v_bits = NominalBits(options.v_type);
  if (!k_bits.ok() || !v_bits.ok()) return;
  for (const std::string& w : PlanWarnings(model, *k_bits, *v_bits)) {
    std::fprintf(stderr, "warning: %s\n", w.c_str());
  }
}

StatusOr<Plan> MakePlan(const PlanFlags& flags) {
  const std::string target = flags.model.empty() ? DefaultModelPath() : flags.model;
  if (target.empty()) {
    return Status::Error("no model given and the default model was not found; pass -m");
  }
  Plan plan;
  KVQ_ASSIGN_OR_RETURN(plan.model, LoadPlanModel(target));
  const ModelConfig& c = plan.model.config;
  plan.shape = PlanKvShape(c);
  plan.context = flags.context > 0 ? flags.context : c.max_position_embeddings;
  if (flags.batch < 1) return Status::Error("--batch must be at least 1");
  plan.batch = flags.batch;
  KVQ_RETURN_IF_ERROR(ResolveWeights(plan.model, flags.weights_dtype, &plan));
  KVQ_RETURN_IF_ERROR(ResolveMemory(flags.memory, &plan));

  KVQ_ASSIGN_OR_RETURN(KvCacheOptions options, KvFlagsToOptions(flags.kv, plan.context, nullptr));
  WarnEarly(plan.model, options);
  KVQ_ASSIGN_OR_RETURN(plan.selected, PlanKvType(plan.shape, options));
  plan.under_policy = !options.policy.empty();
  for (const std::string& t : flags.types.empty() ? DefaultPlanTypes() : flags.types) {
    KvCacheOptions o = options;
    o.k_type = o.v_type = t;
    o.policy.clear();  // the table compares uniform types; the plan keeps the policy
    plan.rows.push_back({t, PlanKvType(plan.shape, o)});
  }
  plan.contexts = {4096, 8192, 32768, 131072};
  if (std::find(plan.contexts.begin(), plan.contexts.end(), plan.context) == plan.contexts.end()) {
    plan.contexts.push_back(plan.context);
  }
  plan.fit =
      PlanFit(plan.selected.layout, plan.weight_bytes, plan.memory, plan.batch, plan.context);
  plan.warnings = PlanWarnings(plan.model, plan.selected.k_bits, plan.selected.v_bits);
  return plan;
}

nlohmann::json ModelJson(const PlanModel& model) {
  const ModelConfig& c = model.config;
  nlohmann::json weights = nlohmann::json::object();
  for (const auto& [dtype, bytes] : model.weight_bytes) weights[dtype] = bytes;
  return {{"model",
           {{"name", model.name},
            {"source", model.source},
            {"layers", c.num_layers},
            {"heads", c.num_heads},
            {"kv_heads", c.num_kv_heads},
            {"head_dim", c.head_dim},
            {"hidden", c.hidden_size},
            {"intermediate", c.intermediate_size},
            {"vocab", c.vocab_size},
            {"context", c.max_position_embeddings},
            {"tied_embeddings", c.tie_word_embeddings},
            {"parameters", model.parameters}}},
          {"weights", {{"from_file", model.weights_from_file}, {"bytes_by_dtype", weights}}}};
}

nlohmann::json TypeJson(const Row& row, const std::vector<int64_t>& contexts) {
  nlohmann::json t = {{"type", row.label}};
  if (!row.plan.ok()) {
    t["error"] = row.plan.status().message();
    return t;
  }
  const KvTypePlan& p = *row.plan;
  t["nominal_bits"] = p.k_bits;
  t["nominal_bytes_per_token"] = p.nominal_bytes_per_token;
  t["exact_bytes_per_token"] = p.layout.BytesPerToken();
  t["k_bytes_per_token_per_layer"] = p.k_bytes_per_token_layer;
  t["v_bytes_per_token_per_layer"] = p.v_bytes_per_token_layer;
  t["block_tokens"] = p.layout.block_tokens;
  t["block_bytes"] = p.layout.block_bytes;
  t["side_bytes"] = p.layout.side_bytes;
  t["staging_bytes_per_sequence"] = p.layout.staging_bytes;
  t["staging_blocks_per_sequence"] = p.layout.staging_blocks;
  for (int64_t ctx : contexts) {
    t["bytes_at"][std::to_string(ctx)] = {{"nominal", NominalKvBytes(p, 1, ctx)},
                                          {"exact", ExactKvBytes(p.layout, 1, ctx)}};
  }
  return t;
}

void PrintPlanJson(const Plan& plan) {
  nlohmann::json j = ModelJson(plan.model);
  j["types"] = nlohmann::json::array();
  for (const Row& r : plan.rows) j["types"].push_back(TypeJson(r, plan.contexts));
  const KvTypePlan& s = plan.selected;
  j["plan"] = {{"k_type", s.k_type},
               {"v_type", s.v_type},
               {"rotate", s.rotate},
               {"batch", plan.batch},
               {"context", plan.context},
               {"kv_bytes", plan.fit.kv_bytes},
               {"kv_bytes_nominal", NominalKvBytes(s, plan.batch, plan.context)},
               {"weight_bytes", plan.weight_bytes},
               {"total_bytes", plan.fit.total_bytes},
               {"memory_bytes", plan.memory},
               {"fits", plan.fit.fits},
               {"max_context", plan.fit.max_context},
               {"max_batch", plan.fit.max_batch}};
  j["warnings"] = plan.warnings;
  std::printf("%s\n", j.dump(2).c_str());
}

void PrintModel(const PlanModel& model) {
  const ModelConfig& c = model.config;
  std::printf("model:    %s, %s\n", model.name.c_str(), model.source.c_str());
  std::printf(
      "shape:    %lld layers, %lld heads, %lld KV heads x head_dim %lld, hidden %lld, "
      "ffn %lld, vocab %lld, context %lld%s\n",
      (long long)c.num_layers, (long long)c.num_heads, (long long)c.num_kv_heads,
      (long long)c.head_dim, (long long)c.hidden_size, (long long)c.intermediate_size,
      (long long)c.vocab_size, (long long)c.max_position_embeddings,
      c.tie_word_embeddings ? ", tied embeddings" : "");
  std::printf("weights:  %.3f B parameters, %s:", model.parameters / 1e9,
              model.weights_from_file ? "stored as" : "if stored as");
  for (size_t i = 0; i < model.weight_bytes.size(); ++i) {
    const auto& [dtype, bytes] = model.weight_bytes[i];
    std::printf("%s %s %s", i == 0 ? "" : (model.weights_from_file ? " +" : " |"), dtype.c_str(),
                Human(static_cast<double>(bytes)).c_str());
  }
  std::printf("\n");
}

// One type's two lines: the nominal figure, then the exact one with what the
// paged cache adds beside its blocks.
void PrintTypeRow(const KvTypePlan& p, const std::string& label,
                  const std::vector<int64_t>& contexts, double unit) {
  std::printf("%-14s %-8s %5d %10.0f %8s %15s", label.c_str(), "nominal", p.k_bits,
              p.nominal_bytes_per_token, "", "");
  for (int64_t ctx : contexts) std::printf(" %8s", Cell(NominalKvBytes(p, 1, ctx), unit).c_str());
  std::printf("\n");
  char over[16], kv[32];
  std::snprintf(over, sizeof(over), "%+.1f%%",
                100.0 * (p.layout.BytesPerToken() / p.nominal_bytes_per_token - 1.0));
  std::snprintf(kv, sizeof(kv), "%g+%g", p.k_bytes_per_token_layer, p.v_bytes_per_token_layer);
  std::printf("%-14s %-8s %5s %10.1f %8s %15s", "", "exact", "", p.layout.BytesPerToken(), over,
              kv);
  for (int64_t ctx : contexts)
    std::printf(" %8s", Cell(ExactKvBytes(p.layout, 1, ctx), unit).c_str());
  if (p.layout.codec_side_bytes > 0) {
    std::printf("  (+%zu B side data)", p.layout.codec_side_bytes);
  }
  if (p.layout.rope_table_head_dim > 0) {
    // K before RoPE: the cos/sin table (a row per block plus block_tokens rows).
    const size_t row = static_cast<size_t>(p.layout.rope_table_head_dim) * sizeof(float);
    std::printf("  (+RoPE table: %zu B + %zu B per %lld tokens of context)",
                row * static_cast<size_t>(p.layout.block_tokens), row,
                (long long)p.layout.block_tokens);
  }
  if (p.layout.staging_blocks > 0) {
    std::printf("  (incl. %lld blocks/sequence for %s of f16 windows)",
                (long long)p.layout.staging_blocks,
                Human(static_cast<double>(p.layout.staging_bytes)).c_str());
  }
  std::printf("\n");
}

void PrintTypeTable(const Plan& plan) {
  // GB unless even 128K tokens of f16 stay under 1 GB.
  const bool mb = NominalKvBytesPerToken(plan.shape, 16, 16) * 131072 < 1e9;
  const double unit = mb ? 1e6 : 1e9;
  std::printf(
      "\nKV cache of one sequence in decimal %s (1e%d B); nominal = 2 x layers x kv_heads x "
      "head_dim x bits/8 per token;\nexact = what the paged cache allocates (%lld-token blocks, "
      "scales/zero-points/side data included)\n\n",
      mb ? "MB" : "GB", mb ? 6 : 9, (long long)plan.selected.layout.block_tokens);
  std::printf("%-14s %-8s %5s %10s %8s %15s", "type", "", "bits", "B/token", "over",
              "K+V B/tok/layer");
  for (int64_t ctx : plan.contexts) std::printf(" %8s", ContextLabel(ctx).c_str());
  std::printf("\n");
  for (const Row& r : plan.rows) {
    if (!r.plan.ok()) {
      std::printf("%-14s unavailable: %s\n", r.label.c_str(), r.plan.status().message().c_str());
      continue;
    }
    PrintTypeRow(*r.plan, r.label, plan.contexts, unit);
  }
}

void PrintFit(const Plan& plan) {
  const KvTypePlan& s = plan.selected;
  const FitAnswer& fit = plan.fit;
  const int64_t trained = plan.model.config.max_position_embeddings;
  std::printf("\nplan:     K %s / V %s%s%s, batch %lld x context %lld%s\n", s.k_type.c_str(),
              s.v_type.c_str(), s.rotate ? " (rotated)" : "",
              plan.under_policy ? " under --kv-policy" : "", (long long)plan.batch,
              (long long)plan.context,
              plan.context > trained ? " (beyond the model's trained context)" : "");
  std::printf(
      "          KV %s exact (nominal %s) + weights %s (%s) = %s\n", Human(fit.kv_bytes).c_str(),
      Human(NominalKvBytes(s, plan.batch, plan.context)).c_str(), Human(plan.weight_bytes).c_str(),
      plan.weight_label.c_str(), Human(fit.total_bytes).c_str());
  std::printf("          memory %s (%s): %s\n", Human(plan.memory).c_str(),
              plan.memory_label.c_str(), fit.fits ? "fits" : "does NOT fit");
  std::printf("          largest context at batch %lld: %lld tokens%s\n", (long long)plan.batch,
              (long long)fit.max_context,
              fit.max_context > trained ? " (beyond the model's context)" : "");
  std::printf("          largest batch at context %lld: %lld\n", (long long)plan.context,
              (long long)fit.max_batch);
}

int RunPlan(const PlanFlags& flags) {
  if (flags.list_presets) {
    for (const ModelPreset& p : ModelPresets()) {
      std::printf("%-14s %s\n", p.name, p.source);
    }
    return 0;
  }
  auto plan = MakePlan(flags);
  if (!plan.ok()) return CommandError("plan", plan.status().message());
  if (flags.json) {
    PrintPlanJson(*plan);
    return 0;
  }
  PrintModel(plan->model);
  PrintTypeTable(*plan);
  PrintFit(*plan);
  return 0;
}

}  // namespace

void RegisterPlanCommand(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "KV-cache and weight memory per cache type; does batch x context fit?");
  cmd->add_option("-m,--model", flags->model,
                  "Preset name (see --list-presets), GGUF file, Hugging Face folder or hub id "
                  "in the local Hugging Face cache (default: the default model)")
      ->transform(ModelArgResolver());
  cmd->add_option("-c,--ctx", flags->context,
                  "Context in tokens per sequence (default: the model's context)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("-b,--batch", flags->batch, "Sequences (default 1)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--memory", flags->memory,
                  "Budget for weights + KV, parsed like --kv-memory: bytes (512M, 8G = GiB, 8GB = "
                  "10^9) or a fraction of RAM like 0.5 (default: this machine's RAM)");
  cmd->add_option("--weights-dtype", flags->weights_dtype,
                  "For presets: weights stored as f32, f16, bf16 or q8_0 (default f16)");
  cmd->add_option("--types", flags->types,
                  "Cache types to tabulate (default: f32 f16 bf16 fp8_* int8 int4 int2 variants)")
      ->delimiter(',');
  cmd->add_flag("--json", flags->json, "Machine-readable output");
  cmd->add_flag("--list-presets", flags->list_presets, "List the model presets and exit");
  AddKvCacheFlags(*cmd, &flags->kv);
  cmd->callback([flags, &ctx] { ctx.exit_code = RunPlan(*flags); });
}

}  // namespace kvq
