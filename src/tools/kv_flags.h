// The KV-cache flags every command that runs a model shares (generate,
// bench, perplexity, plan, serve): registered once here, turned into
// KvCacheOptions once here, so their names, defaults and help never drift.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "kv/kv_factory.h"

namespace kvq {

struct KvFlags {
  std::string kv_cache_dtype = "f16";  // K and V
  std::string cache_type_k;            // overrides kv_cache_dtype for K when set
  std::string cache_type_v;            // overrides kv_cache_dtype for V when set
  bool rotate = false;
  std::string memory;  // --kv-memory text; empty = room for one sequence of the context
  int64_t block_tokens = 16;
  std::string policy;       // --kv-policy: inline rules or a file holding them
  std::string calibration;  // --kv-calibration: `kvq calibrate` output (KVQuant)
  // KIVI's knobs (--k-bits --v-bits --group-size --residual-length); 0 = unset.
  int kivi_k_bits = 0, kivi_v_bits = 0;
  int64_t kivi_group = 0, kivi_residual = 0;
};

// Adds --kv-cache-dtype, --cache-type-k, --cache-type-v, --kv-rotate,
// --kv-memory, --kv-block, --kv-policy and KIVI's --k-bits, --v-bits,
// --group-size, --residual-length to `cmd`. `flags` must outlive parsing.
void AddKvCacheFlags(CLI::App& cmd, KvFlags* flags);

// max_tokens: the per-sequence limit (the context); pool: the threads of the
// model the cache serves (Transformer::pool()), null when the options only
// feed the planner. Errors name the bad flag.
StatusOr<KvCacheOptions> KvFlagsToOptions(const KvFlags& flags, int64_t max_tokens,
                                          ThreadPool* pool);

// argv with llama.cpp's -ctk / -ctv spelled --cache-type-k / --cache-type-v:
// CLI11 takes one-letter short options only, so "-ctk q8_0" would otherwise
// read as -c tk. Everything after "--" is left alone.
std::vector<std::string> KvFlagArgs(int argc, const char* const* argv);

}  // namespace kvq
