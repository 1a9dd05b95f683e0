// Memory planning: exact KV-cache bytes for every cache type (from
// kv::ComputeKvLayout, the same function the paged cache allocates with),
// the nominal figure the literature quotes (2 * layers * kv_heads * head_dim *
// bits / 8 per token), weight bytes, and whether batch x context fits a
// memory budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "kv/kv_cache.h"
#include "kv/kv_factory.h"
#include "model/model_config.h"

namespace kvq {

struct PlanModel {
  std::string name;    // preset name or the path given
  std::string source;  // "preset (<config source>)" or "GGUF" / "Hugging Face"
  ModelConfig config;
  int64_t parameters = 0;
  bool weights_from_file = false;
  // (dtype name, bytes). From a file: what it stores, per dtype. For a
  // preset: the whole model in each of f32, f16, bf16, q8_0 (alternatives).
  std::vector<std::pair<std::string, int64_t>> weight_bytes;
};

// A preset name (case-insensitive, see model/model_presets.h), else a GGUF
// file or Hugging Face folder (only the headers and config are read).
StatusOr<PlanModel> LoadPlanModel(const std::string& name_or_path);

KvShape PlanKvShape(const ModelConfig& config);

// Bits per value a codec or scheme name promises before any scale or
// zero-point: f32 32, f16/bf16 16, fp8_* 8, int8 8, int4 4, int2 2, kivi2 2,
// kivi4 4; error otherwise.
StatusOr<int> NominalBits(const std::string& codec_name);

// Decimal bytes per token as papers quote them: K and V, every layer.
double NominalKvBytesPerToken(const KvShape& shape, double k_bits, double v_bits);

struct KvTypePlan {
  std::string k_type, v_type;  // as given
  bool rotate = false;
  int k_bits = 0, v_bits = 0;  // nominal (the fewest of any layer under a policy)
  KvLayout layout;             // exact
  // Exact bytes per token of one layer (all KV heads, tile padding included),
  // K and V separately.
  double k_bytes_per_token_layer = 0;
  double v_bytes_per_token_layer = 0;
  double nominal_bytes_per_token = 0;
};
StatusOr<KvTypePlan> PlanKvType(const KvShape& shape, const KvCacheOptions& options);

// Bytes the paged cache allocates for `batch` sequences of `tokens` each
// (made with max_tokens = tokens): every sequence rounds up to whole blocks,
// plus the per-cache side data.
double ExactKvBytes(const KvLayout& layout, int64_t batch, int64_t tokens);
double NominalKvBytes(const KvTypePlan& plan, int64_t batch, int64_t tokens);

struct FitAnswer {
  double kv_bytes = 0;     // exact, for batch x context
  double total_bytes = 0;  // kv + weights
  bool fits = false;
  int64_t max_context = 0;  // for the given batch, whole blocks (not capped by the model)
  int64_t max_batch = 0;    // for the given context
};
FitAnswer PlanFit(const KvLayout& layout, double weight_bytes, double memory_bytes, int64_t batch,
                  int64_t context);

// Physical RAM of this machine in bytes (0 if unknown).
double PhysicalRamBytes();

// Warnings for a cache choice (e.g. 2-bit on a model with one KV head).
std::vector<std::string> PlanWarnings(const PlanModel& model, int k_bits, int v_bits);

// The cache types `kvq plan` lists by default.
std::vector<std::string> DefaultPlanTypes();

}  // namespace kvq
