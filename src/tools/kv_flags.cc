#include "tools/kv_flags.h"

#include <unistd.h>

namespace kvq {
namespace {

size_t TotalRamBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_size > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page_size)
                                    : 0;
}

}  // namespace

void AddKvCacheFlags(CLI::App& cmd, KvFlags* flags) {
  const char* types =
      "f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8, int4, int2 (integer options as suffixes: "
      "int4-g64, int4-g32-sym; defaults group 32, asymmetric)";
  cmd.add_option("--kv-cache-dtype", flags->kv_cache_dtype,
                 std::string("KV cache type for K and V: ") + types + " (default f16)");
  cmd.add_option("--cache-type-k", flags->cache_type_k,
                 "KV cache type for K only (default: --kv-cache-dtype)");
  cmd.add_option("--cache-type-v", flags->cache_type_v,
                 "KV cache type for V only (default: --kv-cache-dtype)");
  cmd.add_flag("--kv-rotate", flags->rotate,
               "Hadamard-rotate K, q and V per head before encoding (output unrotated); "
               "needs a power-of-two head_dim (default off)");
  cmd.add_option("--kv-memory", flags->memory,
                 "KV cache budget: bytes with optional suffix (512M, 8G = GiB, 8GB = 10^9) or a "
                 "fraction of RAM like 0.5 (default: one sequence of the full context)");
  cmd.add_option("--kv-block", flags->block_tokens, "Tokens per KV cache block (default 16)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
}

StatusOr<KvCacheOptions> KvFlagsToOptions(const KvFlags& flags, int64_t max_tokens, int threads) {
  KvCacheOptions options;
  options.k_type = flags.cache_type_k.empty() ? flags.kv_cache_dtype : flags.cache_type_k;
  options.v_type = flags.cache_type_v.empty() ? flags.kv_cache_dtype : flags.cache_type_v;
  options.rotate = flags.rotate;
  options.block_tokens = flags.block_tokens;
  options.max_tokens = max_tokens;
  options.num_threads = threads;
  if (!flags.memory.empty()) {
    KVQ_ASSIGN_OR_RETURN(options.memory_bytes, ParseKvMemory(flags.memory, TotalRamBytes()));
  }
  return options;
}

}  // namespace kvq
