#include "eval/planner.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>

#include "io/tensor.h"
#include "kv/codec_registry.h"
#include "kv/kv_policy.h"
#include "model/model_files.h"
#include "model/model_presets.h"

namespace kvq {
namespace {

// "f16", "q8_0": lower case, as the CLI takes dtypes.
std::string LowerDTypeName(DType d) {
  std::string s = DTypeName(d);
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

StatusOr<PlanModel> LoadPlanModel(const std::string& name_or_path) {
  PlanModel m;
  m.name = name_or_path;
  if (auto preset = FindModelPreset(name_or_path); preset.ok()) {
    m.name = preset->name;
    m.source = std::string("preset (") + preset->source + ")";
    m.config = preset->config;
    m.parameters = PresetParameterCount(*preset);
    for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
      m.weight_bytes.emplace_back(LowerDTypeName(d),
                                  m.parameters * static_cast<int64_t>(DTypeBytes(d, 1)));
    }
    // Q8_0: 34 bytes per 32 values (every preset's rows are multiples of 32).
    m.weight_bytes.emplace_back(LowerDTypeName(DType::kQ8_0), m.parameters / 32 * 34);
    return m;
  }
  auto files = OpenModel(name_or_path);
  if (!files.ok()) {
    std::string names;
    for (const ModelPreset& p : ModelPresets())
      names += (names.empty() ? "" : ", ") + std::string(p.name);
    return Status::Error(files.status().message() + " (and it is not a preset: " + names + ")");
  }
  m.source = ModelFormatName(files->format);
  m.config = files->config;
  m.parameters = CountParameters(files->tensors);
  m.weights_from_file = true;
  std::map<std::string, int64_t> by_dtype;
  for (const TensorRef& t : files->tensors) by_dtype[LowerDTypeName(t.dtype)] += t.nbytes;
  m.weight_bytes.assign(by_dtype.begin(), by_dtype.end());
  return m;
}

KvShape PlanKvShape(const ModelConfig& config) {
  KvShape shape{config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim};
  // Layouts only need the RoPE table's size (pre-RoPE caches check it).
  if (config.head_dim > 0 && config.head_dim % 2 == 0) {
    shape.rope_inv_freq.assign(static_cast<size_t>(config.head_dim / 2), 0.0f);
  }
  return shape;
}

StatusOr<int> NominalBits(const std::string& codec_name) {
  // A scheme or K/V pair counts its K codec (the registry knows every name).
  KVQ_ASSIGN_OR_RETURN(const KvLayerTypes types,
                       ExpandKvScheme(codec_name.substr(0, codec_name.find('/'))));
  KVQ_ASSIGN_OR_RETURN(const KvCodecSpec spec, ParseKvCodecSpec(types.k_type));
  return static_cast<int>(spec.NominalBits());
}

double NominalKvBytesPerToken(const KvShape& shape, double k_bits, double v_bits) {
  return static_cast<double>(shape.num_layers * shape.num_kv_heads * shape.head_dim) *
         (k_bits + v_bits) / 8.0;
}

StatusOr<KvTypePlan> PlanKvType(const KvShape& shape, const KvCacheOptions& options) {
  KvTypePlan plan;
  plan.k_type = options.k_type;
  plan.v_type = options.v_type;
  plan.rotate = options.rotate;
  // The cache's own parser speaks first: its error lists what this build has.
  KVQ_ASSIGN_OR_RETURN(plan.layout, ComputeKvLayout(shape, options));
  KVQ_ASSIGN_OR_RETURN(const std::vector<KvLayerSpec> layers,
                       ResolveKvLayerSpecs(options, shape.num_layers));
  const double tokens = static_cast<double>(plan.layout.block_tokens);
  plan.k_bits = plan.v_bits = 64;
  for (size_t l = 0; l < layers.size(); ++l) {
    const double k_bits = layers[l].k.NominalBits(), v_bits = layers[l].v.NominalBits();
    plan.k_bits = std::min(plan.k_bits, static_cast<int>(k_bits));  // 2.5 bits (tq2.5) shows as 2
    plan.v_bits = std::min(plan.v_bits, static_cast<int>(v_bits));
    plan.nominal_bytes_per_token +=
        NominalKvBytesPerToken(shape, k_bits, v_bits) / static_cast<double>(shape.num_layers);
    const KvLayerLayout& tiles = plan.layout.layers[l];
    plan.k_bytes_per_token_layer +=
        shape.num_kv_heads * tiles.k_tile_bytes / tokens / static_cast<double>(shape.num_layers);
    plan.v_bytes_per_token_layer +=
        shape.num_kv_heads * tiles.v_tile_bytes / tokens / static_cast<double>(shape.num_layers);
  }
  return plan;
}

double ExactKvBytes(const KvLayout& layout, int64_t batch, int64_t tokens) {
  return static_cast<double>(batch) * static_cast<double>(layout.SequenceBytes(tokens)) +
         static_cast<double>(layout.SideBytesFor(tokens));
}

double NominalKvBytes(const KvTypePlan& plan, int64_t batch, int64_t tokens) {
  return plan.nominal_bytes_per_token * static_cast<double>(tokens) * static_cast<double>(batch);
}

FitAnswer PlanFit(const KvLayout& layout, double weight_bytes, double memory_bytes, int64_t batch,
                  int64_t context) {
  FitAnswer a;
  a.kv_bytes = ExactKvBytes(layout, batch, context);
  a.total_bytes = a.kv_bytes + weight_bytes;
  a.fits = a.total_bytes <= memory_bytes;
  // Side data as for a cache made for `context` (max_context below keeps
  // that side data: the RoPE table of a pre-RoPE cache grows with its
  // context by a row per block, a rounding error of max_context).
  const double room =
      memory_bytes - weight_bytes - static_cast<double>(layout.SideBytesFor(context));
  const double block = static_cast<double>(layout.block_bytes);
  if (room > 0 && block > 0 && batch > 0) {
    // Each sequence first pays its staging blocks (residual windows, sinks).
    const double blocks = std::floor(room / (block * batch)) - layout.staging_blocks;
    a.max_context = std::max<int64_t>(0, static_cast<int64_t>(blocks)) * layout.block_tokens;
  }
  const double sequence_bytes = static_cast<double>(layout.SequenceBytes(context));
  if (room > 0 && sequence_bytes > 0) {
    a.max_batch = static_cast<int64_t>(std::floor(room / sequence_bytes));
  }
  return a;
}

double PhysicalRamBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<double>(pages) * static_cast<double>(page_size);
}

std::vector<std::string> PlanWarnings(const PlanModel& model, int k_bits, int v_bits) {
  std::vector<std::string> warnings;
  if (model.config.num_kv_heads == 1 && (k_bits <= 2 || v_bits <= 2)) {
    warnings.push_back(model.name +
                       " has one KV head: a 2-bit cache has no other KV head to spread the error "
                       "over (KIVI reports one-KV-head Falcon needs 4 bits)");
  }
  return warnings;
}

std::vector<std::string> DefaultPlanTypes() { return DefaultKvPlanTypes(); }

}  // namespace kvq
