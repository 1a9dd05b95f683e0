#include "kv/kv_factory.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <numeric>

#include "kv/codec.h"
#include "kv/kv_policy.h"
#include "kv/paged_cache.h"

namespace kvq {

namespace {

size_t RoundUpTo64(size_t bytes) { return (bytes + 63) / 64 * 64; }

Status CheckLayoutInputs(const KvShape& shape, const KvCacheOptions& options) {
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.num_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0) {
    return Status::Error("KV cache: invalid model shape");
  }
  if (options.block_tokens <= 0 || options.block_tokens > 4096) {
    return Status::Error("KV cache: block size " + std::to_string(options.block_tokens) +
                         " tokens outside [1, 4096]");
  }
  if (options.max_tokens <= 0) return Status::Error("KV cache: max_tokens must be positive");
  return Status::Ok();
}

// What the layers' codecs ask of the whole layout.
struct LayoutNeeds {
  int64_t tile_multiple = 1;  // block tokens must be a multiple (per-channel groups)
  size_t side_per_head = 0;   // codec side data, per KV head
  bool any_pre_rope = false;  // some layer stores K before RoPE
};

// One layer's codecs: their row bytes and f16 staging into `layout`, what
// they need of the blocks into `needs`; an error for a K stored before RoPE
// that cannot be (rotated, or without the model's RoPE parameters).
Status AddLayer(const KvShape& shape, const KvCacheOptions& options, const KvLayerSpec& spec,
                int64_t l, KvLayout* layout, LayoutNeeds* needs) {
  const std::string where = options.policy.empty() ? "" : " (layer " + std::to_string(l) + ")";
  auto k_codec = spec.k.Make(shape.head_dim);
  if (!k_codec.ok()) return k_codec.status().WithContext("K" + where);
  auto v_codec = spec.v.Make(shape.head_dim);
  if (!v_codec.ok()) return v_codec.status().WithContext("V" + where);
  const KvStreaming& ks = (*k_codec)->streaming();
  const KvStreaming& vs = (*v_codec)->streaming();
  if (ks.pre_rope && options.rotate) {
    return Status::Error("KV cache type '" + spec.k.Name() +
                         "': --kv-rotate does not compose with K stored before RoPE");
  }
  if (ks.pre_rope && (*k_codec)->RotationBlock(/*is_v=*/false) > 0) {
    return Status::Error("KV cache type '" + spec.k.Name() +
                         "': llama.cpp's rotation applies to K after RoPE; store K before "
                         "RoPE without it (-norot, e.g. q4_0-norot-prerope)");
  }
  if (ks.pre_rope && static_cast<int64_t>(shape.rope_inv_freq.size()) * 2 != shape.head_dim) {
    return Status::Error("KV cache type '" + spec.k.Name() +
                         "': storing K before RoPE needs the model's RoPE parameters");
  }
  needs->any_pre_rope = needs->any_pre_rope || ks.pre_rope;
  needs->tile_multiple = std::lcm(needs->tile_multiple, std::lcm(ks.tile_tokens, vs.tile_tokens));
  KvLayerLayout& layer = layout->layers[static_cast<size_t>(l)];
  layer.k_row_bytes = (*k_codec)->RowBytes();
  layer.v_row_bytes = (*v_codec)->RowBytes();
  needs->side_per_head += (*k_codec)->SideBytes() + (*v_codec)->SideBytes();
  const size_t staging_row = static_cast<size_t>(shape.head_dim) * 2;  // one f16 row
  const int64_t staged = ks.ResidualCapacity() + ks.sink_tokens + ks.detect_sinks +
                         vs.ResidualCapacity() + vs.sink_tokens + vs.detect_sinks;
  layout->staging_bytes +=
      static_cast<size_t>(shape.num_kv_heads) * static_cast<size_t>(staged) * staging_row;
  return Status::Ok();
}

// Block size (rounded up to the codecs' tiles), each layer's tiles and
// offset in a block, and the per-cache side data.
Status PlaceLayers(const KvShape& shape, const KvCacheOptions& options, const LayoutNeeds& needs,
                   KvLayout* layout) {
  const int64_t tile = needs.tile_multiple;
  layout->block_tokens = (options.block_tokens + tile - 1) / tile * tile;
  if (layout->block_tokens > 4096) {
    return Status::Error("KV cache: per-channel groups need blocks of " +
                         std::to_string(layout->block_tokens) + " tokens (more than 4096)");
  }
  const size_t tokens = static_cast<size_t>(layout->block_tokens);
  size_t offset = 0;
  for (KvLayerLayout& layer : layout->layers) {
    layer.k_tile_bytes = RoundUpTo64(tokens * layer.k_row_bytes);
    layer.v_tile_bytes = RoundUpTo64(tokens * layer.v_row_bytes);
    layer.offset = offset;
    offset += static_cast<size_t>(shape.num_kv_heads) * (layer.k_tile_bytes + layer.v_tile_bytes);
  }
  layout->k_row_bytes = layout->layers[0].k_row_bytes;
  layout->v_row_bytes = layout->layers[0].v_row_bytes;
  layout->k_tile_bytes = layout->layers[0].k_tile_bytes;
  layout->v_tile_bytes = layout->layers[0].v_tile_bytes;
  layout->block_bytes = offset;
  layout->codec_side_bytes = static_cast<size_t>(shape.num_kv_heads) * needs.side_per_head;
  layout->rope_table_head_dim = needs.any_pre_rope ? shape.head_dim : 0;
  layout->side_bytes = layout->SideBytesFor(options.max_tokens);
  layout->staging_blocks =
      static_cast<int64_t>((layout->staging_bytes + layout->block_bytes - 1) / layout->block_bytes);
  return Status::Ok();
}

}  // namespace

// The block layout is described at KvLayout (kv_factory.h).
StatusOr<KvLayout> ComputeKvLayout(const KvShape& shape, const KvCacheOptions& options) {
  KVQ_RETURN_IF_ERROR(CheckLayoutInputs(shape, options));
  KVQ_ASSIGN_OR_RETURN(const std::vector<KvLayerSpec> layer_specs,
                       ResolveKvLayerSpecs(options, shape.num_layers));
  KvLayout layout;
  layout.num_layers = shape.num_layers;
  layout.num_kv_heads = shape.num_kv_heads;
  layout.layers.resize(static_cast<size_t>(shape.num_layers));
  LayoutNeeds needs;
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    KVQ_RETURN_IF_ERROR(
        AddLayer(shape, options, layer_specs[static_cast<size_t>(l)], l, &layout, &needs));
  }
  KVQ_RETURN_IF_ERROR(PlaceLayers(shape, options, needs, &layout));
  size_t budget = options.memory_bytes;
  if (budget == 0) budget = layout.side_bytes + layout.SequenceBytes(options.max_tokens);
  const size_t smallest = layout.side_bytes + layout.SequenceBytes(1);
  if (budget < smallest) {
    return Status::Error("KV cache: memory budget of " + std::to_string(budget) +
                         " bytes holds no sequence (one block is " +
                         std::to_string(layout.block_bytes) + " bytes, a sequence needs " +
                         std::to_string(smallest - layout.side_bytes) + " at least)");
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

StatusOr<bool> NeedsCalibrationFile(const KvShape& shape, const KvCacheOptions& options) {
  KVQ_ASSIGN_OR_RETURN(const std::vector<KvLayerSpec> layer_specs,
                       ResolveKvLayerSpecs(options, shape.num_layers));
  for (const KvLayerSpec& layer : layer_specs) {
    for (const KvCodecSpec* spec : {&layer.k, &layer.v}) {
      KVQ_ASSIGN_OR_RETURN(auto codec, spec->Make(shape.head_dim));
      if (codec->NeedsCalibrationFile()) return true;
    }
  }
  return false;
}

StatusOr<std::unique_ptr<KvCache>> MakeKvCache(const KvShape& shape,
                                               const KvCacheOptions& options) {
  KVQ_ASSIGN_OR_RETURN(auto cache, PagedKvCache::Create(shape, options));
  return std::unique_ptr<KvCache>(std::move(cache));
}

}  // namespace kvq
