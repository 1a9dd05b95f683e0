#include "tools/kv_flags.h"

#include <sys/stat.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "io/mapped_file.h"
#include "kv/codec_registry.h"
#include "kv/kv_policy.h"

namespace kvq {
namespace {

size_t TotalRamBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_size > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page_size)
                                    : 0;
}

}  // namespace

void AddKvCacheFlags(CLI::App& cmd, KvFlags* flags) {
  const std::string types = KvCacheTypesSummary();
  const std::string aliases =
      " (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl are llama.cpp's formats byte for byte, with its "
      "default Hadamard rotation unless -norot; vLLM's spellings: " +
      KvAliasesSummary() + "; `kvq help cache-types` lists them)";
  cmd.add_option("--kv-cache-dtype", flags->kv_cache_dtype,
                 "KV cache type for K and V: " + types + " (default f16)" + aliases);
  cmd.add_option("--cache-type-k", flags->cache_type_k,
                 "KV cache type for K only, also -ctk (default: --kv-cache-dtype)" + aliases);
  cmd.add_option("--cache-type-v", flags->cache_type_v,
                 "KV cache type for V only, also -ctv (default: --kv-cache-dtype)");
  cmd.add_flag("--kv-rotate", flags->rotate,
               "Hadamard-rotate K, q and V per head before encoding (output unrotated); "
               "needs a power-of-two head_dim (default off; llama.cpp's types also apply "
               "their own rotation after it)");
  cmd.add_option("--kv-memory", flags->memory,
                 "KV cache budget: bytes with optional suffix (512M, 8G = GiB, 8GB = 10^9) or a "
                 "fraction of RAM like 0.5 (default: one sequence of the full context)");
  cmd.add_option("--kv-block", flags->block_tokens,
                 "Tokens per KV cache block (default 16; rounded up to a multiple of per-channel "
                 "groups)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd.add_option("--kv-policy", flags->policy,
                 "Per-layer cache types: rules 'LAYERS: TYPE' separated by ';' or newlines, later "
                 "rules win, layers N, -N (from the end), A..B or *, e.g. '*: kivi2; 0,-1: f16'; "
                 "or a file holding such rules");
  cmd.add_option("--kv-calibration", flags->calibration,
                 "Calibration file from `kvq calibrate` (needed by kvquant2/3/4 and nuq* types)");
  cmd.add_option("--k-bits", flags->kivi_k_bits, "KIVI: key bits 2, 4 or 8 (sets a KIVI cache)");
  cmd.add_option("--v-bits", flags->kivi_v_bits, "KIVI: value bits 2, 4 or 8 (sets a KIVI cache)");
  cmd.add_option_function<int>(
      "--nbits", [flags](int bits) { flags->kivi_k_bits = flags->kivi_v_bits = bits; },
      "KIVI: key and value bits 2, 4 or 8 (Hugging Face's nbits; sets a KIVI cache)");
  cmd.add_option("--group-size,--q-group-size", flags->kivi_group,
                 "KIVI: group size 32, 64 or 128 (K: tokens, V: channels; default 32; "
                 "--q-group-size is Hugging Face's word)");
  cmd.add_option("--residual-length", flags->kivi_residual,
                 "KIVI: newest tokens kept in f16, a multiple of the group (default 128)");
}

StatusOr<KvCacheOptions> KvFlagsToOptions(const KvFlags& flags, int64_t max_tokens,
                                          ThreadPool* pool) {
  KvCacheOptions options;
  options.k_type = flags.cache_type_k.empty() ? flags.kv_cache_dtype : flags.cache_type_k;
  options.v_type = flags.cache_type_v.empty() ? flags.kv_cache_dtype : flags.cache_type_v;
  if (flags.kivi_k_bits || flags.kivi_v_bits || flags.kivi_group || flags.kivi_residual) {
    if (!flags.cache_type_k.empty() || !flags.cache_type_v.empty()) {
      return Status::Error(
          "--k-bits/--v-bits/--group-size/--residual-length set a KIVI cache; "
          "they do not combine with --cache-type-k/-v");
    }
    KVQ_ASSIGN_OR_RETURN(const KvLayerTypes kivi,
                         KiviTypes(flags.kivi_k_bits ? flags.kivi_k_bits : 2,
                                   flags.kivi_v_bits ? flags.kivi_v_bits : 2,
                                   flags.kivi_group ? flags.kivi_group : 32,
                                   flags.kivi_residual ? flags.kivi_residual : 128));
    options.k_type = kivi.k_type;
    options.v_type = kivi.v_type;
  }
  if (!flags.policy.empty()) {
    struct stat info {};
    if (::stat(flags.policy.c_str(), &info) == 0) {
      // A path that exists must be a policy file (a directory is an error).
      KVQ_ASSIGN_OR_RETURN(options.policy, ReadTextFile(flags.policy, size_t{1} << 20));
    } else if (flags.policy.find(':') != std::string::npos) {
      options.policy = flags.policy;
    } else {
      return Status::Error("--kv-policy '" + flags.policy +
                           "': neither a readable file nor rules like '*: int4; 0,-1: f16'");
    }
  }
  options.calibration_path = flags.calibration;
  options.rotate = flags.rotate;
  options.block_tokens = flags.block_tokens;
  options.max_tokens = max_tokens;
  options.pool = pool;
  if (!flags.memory.empty()) {
    KVQ_ASSIGN_OR_RETURN(options.memory_bytes, ParseKvMemory(flags.memory, TotalRamBytes()));
  }
  // Parsed once here; the cache and the planner take the typed specs.
  KVQ_ASSIGN_OR_RETURN(options.types,
                       ParseKvCacheTypes(options.k_type, options.v_type, options.policy));
  return options;
}

std::vector<std::string> KvFlagArgs(int argc, const char* const* argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    for (const auto& [short_name, long_name] :
         {std::pair<std::string, std::string>{"-ctk", "--cache-type-k"},
          std::pair<std::string, std::string>{"-ctv", "--cache-type-v"}}) {
      if (args[i] == short_name || args[i].rfind(short_name + "=", 0) == 0) {
        args[i] = long_name + args[i].substr(short_name.size());
      }
    }
  }
  return args;
}

}  // namespace kvq
