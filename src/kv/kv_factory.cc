#include "kv/kv_factory.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "kv/codec.h"
#include "kv/paged_cache.h"

namespace kvq {

namespace {
size_t RoundUpTo64(size_t bytes) { return (bytes + 63) / 64 * 64; }
}  // namespace

// The block layout is described at KvLayout (kv_factory.h).
StatusOr<KvLayout> ComputeKvLayout(const KvShape& shape, const KvCacheOptions& options) {
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.num_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0) {
    return Status::Error("KV cache: invalid model shape");
  }
  if (options.block_tokens <= 0 || options.block_tokens > 4096) {
    return Status::Error("KV cache: block size " + std::to_string(options.block_tokens) +
                         " tokens outside [1, 4096]");
  }
  if (options.max_tokens <= 0) return Status::Error("KV cache: max_tokens must be positive");
  KVQ_ASSIGN_OR_RETURN(auto k_codec, ParseKvCodec(options.k_type, shape.head_dim));
  KVQ_ASSIGN_OR_RETURN(auto v_codec, ParseKvCodec(options.v_type, shape.head_dim));
  KvLayout layout;
  layout.block_tokens = options.block_tokens;
  layout.num_layers = shape.num_layers;
  layout.num_kv_heads = shape.num_kv_heads;
  layout.k_row_bytes = k_codec->RowBytes();
  layout.v_row_bytes = v_codec->RowBytes();
  const size_t tokens = static_cast<size_t>(options.block_tokens);
  layout.k_tile_bytes = RoundUpTo64(tokens * layout.k_row_bytes);
  layout.v_tile_bytes = RoundUpTo64(tokens * layout.v_row_bytes);
  const size_t heads = static_cast<size_t>(shape.num_layers * shape.num_kv_heads);
  layout.block_bytes = static_cast<size_t>(shape.num_layers) * layout.LayerBytes();
  layout.side_bytes = heads * (k_codec->SideBytes() + v_codec->SideBytes());
  size_t budget = options.memory_bytes;
  if (budget == 0) {
    const int64_t blocks = (options.max_tokens + options.block_tokens - 1) / options.block_tokens;
    budget = layout.side_bytes + static_cast<size_t>(blocks) * layout.block_bytes;
  }
  if (budget < layout.side_bytes + layout.block_bytes) {
    return Status::Error("KV cache: memory budget of " + std::to_string(budget) +
                         " bytes holds no block (one block is " +
                         std::to_string(layout.block_bytes) + " bytes)");
  }
  layout.num_blocks = static_cast<int64_t>((budget - layout.side_bytes) / layout.block_bytes);
  return layout;
}

StatusOr<size_t> ParseKvMemory(const std::string& text, size_t total_ram_bytes) {
  const Status bad = Status::Error(
      "--kv-memory '" + text +
      "': expected bytes with an optional suffix (512M, 8G, 8GiB, 8GB) or a fraction of RAM "
      "with a decimal point (0.5)");
  size_t digits_end = 0;
  while (digits_end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[digits_end])) || text[digits_end] == '.')) {
    ++digits_end;
  }
  const std::string number = text.substr(0, digits_end), suffix = text.substr(digits_end);
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1) return bad;
  const double value = std::strtod(number.c_str(), nullptr);
  if (suffix.empty() && number.find('.') != std::string::npos) {
    if (value <= 0.0 || value > 1.0) {
      return Status::Error("--kv-memory '" + text + "': a fraction of RAM must be in (0, 1]");
    }
    if (total_ram_bytes == 0) return Status::Error("--kv-memory: total RAM is unknown");
    return static_cast<size_t>(value * static_cast<double>(total_ram_bytes));
  }
  double unit = 1;
  static const struct {
    const char* suffix;
    double unit;
  } kUnits[] = {{"", 1},         {"B", 1},      {"K", 0x1p10},   {"KiB", 0x1p10}, {"M", 0x1p20},
                {"MiB", 0x1p20}, {"G", 0x1p30}, {"GiB", 0x1p30}, {"T", 0x1p40},   {"TiB", 0x1p40},
                {"KB", 1e3},     {"MB", 1e6},   {"GB", 1e9},     {"TB", 1e12}};
  bool known = false;
  for (const auto& u : kUnits) {
    if (suffix == u.suffix) {
      unit = u.unit;
      known = true;
    }
  }
  if (!known) return bad;
  const double bytes = value * unit;
  if (!(bytes >= 1.0) || bytes > 0x1p62) {
    return Status::Error("--kv-memory '" + text + "': out of range");
  }
  return static_cast<size_t>(bytes);
}

StatusOr<std::unique_ptr<KvCache>> MakeKvCache(const KvShape& shape,
                                               const KvCacheOptions& options) {
  KVQ_ASSIGN_OR_RETURN(auto cache, PagedKvCache::Create(shape, options));
  return std::unique_ptr<KvCache>(std::move(cache));
}

}  // namespace kvq
