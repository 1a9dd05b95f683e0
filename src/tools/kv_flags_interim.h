// Interim KV-cache flags for the commands on this branch, with the same
// names and meaning as the shared helper (src/tools/kv_flags.h, branch
// `paged`); once that lands, replace InterimKvFlags / AddInterimKvCacheFlags /
// InterimKvFlagsToOptions with KvFlags / AddKvCacheFlags / KvFlagsToOptions.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "base/status.h"
#include "engine/planner.h"
#include "kv/kv_factory.h"

namespace kvq {

struct InterimKvFlags {
  std::string dtype = "f16";  // --kv-cache-dtype: K and V
  std::string k_type;         // --cache-type-k: overrides dtype for K
  std::string v_type;         // --cache-type-v: overrides dtype for V
  bool rotate = false;
  std::string memory;  // bytes with suffix or fraction of RAM; empty = one sequence
  int64_t block_tokens = 16;
};

inline void AddInterimKvCacheFlags(CLI::App& cmd, InterimKvFlags* f) {
  cmd.add_option("--kv-cache-dtype", f->dtype,
                 "KV cache type for K and V: f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8, int4, int2"
                 " (integer options: -g32/-g64/-g128, -sym/-asym) (default f16)");
  cmd.add_option("--cache-type-k", f->k_type, "KV cache type for K (default: --kv-cache-dtype)");
  cmd.add_option("--cache-type-v", f->v_type, "KV cache type for V (default: --kv-cache-dtype)");
  cmd.add_flag("--kv-rotate", f->rotate, "Hadamard-rotate K/q and V per head (default off)");
  cmd.add_option("--kv-memory", f->memory,
                 "KV cache budget: bytes (suffix K/M/G, KiB/MiB/GiB) or a fraction of RAM"
                 " (default: room for one sequence of the context)");
  cmd.add_option("--kv-block", f->block_tokens, "Tokens per cache block (default 16)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
}

inline StatusOr<KvCacheOptions> InterimKvFlagsToOptions(const InterimKvFlags& f, int64_t max_tokens,
                                                        int threads) {
  KvCacheOptions o;
  o.k_type = f.k_type.empty() ? f.dtype : f.k_type;
  o.v_type = f.v_type.empty() ? f.dtype : f.v_type;
  o.rotate = f.rotate;
  o.block_tokens = f.block_tokens;
  o.max_tokens = max_tokens;
  o.num_threads = threads;
  if (!f.memory.empty()) {
    KVQ_ASSIGN_OR_RETURN(double bytes, ParseMemoryAmount(f.memory, PhysicalRamBytes()));
    o.memory_bytes = static_cast<size_t>(bytes);
  }
  return o;
}

}  // namespace kvq
