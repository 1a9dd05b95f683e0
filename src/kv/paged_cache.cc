#include "kv/paged_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/threads.h"
#include "kv/hadamard.h"
#include "kv/kv_calibration.h"
#include "kv/kv_policy.h"
#include "ops/rope.h"

namespace kvq {
namespace {

std::string SeqName(SeqId seq) { return "sequence " + std::to_string(seq); }

}  // namespace

PagedKvCache::PagedKvCache(const KvShape& shape, const KvCacheOptions& options,
                           const KvLayout& layout)
    : shape_(shape),
      options_(options),
      layout_(layout),
      own_pool_(options.pool != nullptr
                    ? nullptr
                    : std::make_unique<ThreadPool>(options.num_threads > 0 ? options.num_threads
                                                                           : AvailableThreads())),
      pool_(options.pool != nullptr ? options.pool : own_pool_.get()) {}

StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::Create(const KvShape& shape,
                                                             const KvCacheOptions& options) {
  KVQ_ASSIGN_OR_RETURN(KvLayout layout, ComputeKvLayout(shape, options));
  if (options.rotate) {
    KVQ_RETURN_IF_ERROR(CheckHadamardDim(shape.head_dim).WithContext("--kv-rotate"));
  }
  auto cache = std::unique_ptr<PagedKvCache>(new PagedKvCache(shape, options, layout));
  KVQ_RETURN_IF_ERROR(cache->MakeCodecs());
  KVQ_ASSIGN_OR_RETURN(cache->f16_codec_, ParseKvCodec("f16", shape.head_dim));
  KVQ_ASSIGN_OR_RETURN(cache->f32_codec_, ParseKvCodec("f32", shape.head_dim));
  if (layout.rope_table_head_dim > 0) {
    // Exactly the table ComputeKvLayout counted (one coarse row per block).
    KVQ_ASSIGN_OR_RETURN(cache->rope_table_,
                         ops::RopeTable::Make(shape.rope_layout, shape.rope_inv_freq,
                                              options.max_tokens, layout.block_tokens));
  }
  const size_t instances = cache->k_codecs_.size();
  cache->k_calibrated_.assign(instances, 0);
  cache->v_calibrated_.assign(instances, 0);
  KVQ_ASSIGN_OR_RETURN(cache->allocator_,
                       BlockAllocator::Create(layout.block_bytes, layout.num_blocks));
  // The cache owns the allocator, so the callback never outlives `cache`.
  PagedKvCache* self = cache.get();
  cache->allocator_->SetEvictionCallback([self](BlockId block) {
    if (self->prefix_ != nullptr) self->prefix_->Erase(block);
  });
  if (options.rotate) cache->type_name_ += "+rot";
  KVQ_RETURN_IF_ERROR(cache->AllocateRunState());
  return cache;
}

Status PagedKvCache::MakeCodecs() {
  std::string layer_names;
  KVQ_ASSIGN_OR_RETURN(const std::vector<KvLayerSpec> layer_specs,
                       ResolveKvLayerSpecs(options_, shape_.num_layers));
  // Loaded once, on the first codec that needs it (KVQuant's nuq*).
  std::unique_ptr<KvCalibration> calibration;
  auto calibrate = [&](KvCodec& codec, int64_t layer, int64_t head, bool is_v) -> Status {
    if (!codec.NeedsCalibrationFile()) return Status::Ok();
    if (calibration == nullptr) {
      if (options_.calibration_path.empty()) {
        return Status::Error("KV cache type '" + codec.Name() +
                             "' needs a calibration file: make one with `kvq calibrate -m MODEL "
                             "-f TEXT -o FILE` and pass --kv-calibration FILE");
      }
      KVQ_ASSIGN_OR_RETURN(KvCalibration loaded, LoadKvCalibration(options_.calibration_path));
      KVQ_RETURN_IF_ERROR(loaded.CheckShape(shape_));
      calibration = std::make_unique<KvCalibration>(std::move(loaded));
    }
    return codec.SetCalibration(*calibration, layer, head, is_v);
  };
  for (int64_t l = 0; l < shape_.num_layers; ++l) {
    const KvLayerSpec& spec = layer_specs[static_cast<size_t>(l)];
    for (int64_t h = 0; h < shape_.num_kv_heads; ++h) {
      KVQ_ASSIGN_OR_RETURN(auto k_codec, spec.k.Make(shape_.head_dim));
      KVQ_ASSIGN_OR_RETURN(auto v_codec, spec.v.Make(shape_.head_dim));
      KVQ_RETURN_IF_ERROR(calibrate(*k_codec, l, h, /*is_v=*/false));
      KVQ_RETURN_IF_ERROR(calibrate(*v_codec, l, h, /*is_v=*/true));
      any_streaming_ =
          any_streaming_ || !k_codec->streaming().Plain() || !v_codec->streaming().Plain();
      any_detect_ = any_detect_ || k_codec->streaming().detect_sinks > 0 ||
                    v_codec->streaming().detect_sinks > 0;
      k_codecs_.push_back(std::move(k_codec));
      v_codecs_.push_back(std::move(v_codec));
    }
    char matrix = 0;
    for (int64_t h = 0; h < shape_.num_kv_heads; ++h) {
      const size_t i = static_cast<size_t>(l * shape_.num_kv_heads + h);
      k_matrix_.push_back(k_codecs_[i]->RotationMatrix());
      v_matrix_.push_back(v_codecs_[i]->RotationMatrix());
      matrix = matrix || k_matrix_.back() != nullptr || v_matrix_.back() != nullptr;
    }
    layer_matrix_.push_back(matrix);
    k_rotation_.push_back(k_codecs_.back()->RotationBlock(/*is_v=*/false));
    v_rotation_.push_back(v_codecs_.back()->RotationBlock(/*is_v=*/true));
    const std::string k_name = k_codecs_.back()->Name();
    const std::string v_name = v_codecs_.back()->Name();
    const std::string name = k_name == v_name ? k_name : "k:" + k_name + "/v:" + v_name;
    if (l == 0) type_name_ = name;
    layer_names += (l == 0 ? "" : ",") + name;
  }
  if (!options_.policy.empty()) type_name_ = "policy[" + layer_names + "]";
  return Status::Ok();
}

bool PagedKvCache::AnyRotation() const {
  if (options_.rotate) return true;
  for (size_t l = 0; l < k_rotation_.size(); ++l) {
    if (k_rotation_[l] > 0 || v_rotation_[l] > 0 || layer_matrix_[l]) return true;
  }
  return false;
}

PagedKvCache::Sequence* PagedKvCache::Find(SeqId seq) {
  auto it = sequences_.find(seq);
  return it == sequences_.end() ? nullptr : &it->second;
}
const PagedKvCache::Sequence* PagedKvCache::Find(SeqId seq) const {
  auto it = sequences_.find(seq);
  return it == sequences_.end() ? nullptr : &it->second;
}

const KvStreaming& PagedKvCache::Streaming(int64_t layer, bool is_v) const {
  const size_t instance = static_cast<size_t>(layer * shape_.num_kv_heads);
  return (is_v ? v_codecs_ : k_codecs_)[instance]->streaming();
}

KvStaging& PagedKvCache::StagingOf(Sequence& s, int64_t layer, bool is_v) const {
  return (is_v ? s.v_staging : s.k_staging)[static_cast<size_t>(layer)];
}
const KvStaging& PagedKvCache::StagingOf(const Sequence& s, int64_t layer, bool is_v) const {
  return (is_v ? s.v_staging : s.k_staging)[static_cast<size_t>(layer)];
}

Status PagedKvCache::ChargeStaging(Sequence& s) {
  if (layout_.staging_blocks > allocator_->NumFree()) {
    return Status::Error(
        "KV cache out of memory: a sequence's f16 residual windows and sinks take " +
        std::to_string(layout_.staging_blocks) + " blocks, " +
        std::to_string(allocator_->NumFree()) + " free (raise --kv-memory)");
  }
  for (int64_t i = 0; i < layout_.staging_blocks; ++i) {
    KVQ_ASSIGN_OR_RETURN(BlockId block, allocator_->Allocate());
    s.staging_charge.push_back(block);
  }
  return Status::Ok();
}

Status PagedKvCache::AddSequence(SeqId seq) {
  if (Find(seq) != nullptr) return Status::Error(SeqName(seq) + " exists");
  Sequence s;
  s.lengths.assign(static_cast<size_t>(shape_.num_layers), 0);
  // The whole block table up front: appending a block never reallocates.
  s.blocks.reserve(static_cast<size_t>(MaxBlocksPerSequence()));
  if (any_streaming_) {
    const size_t row = f16_codec_->RowBytes();
    for (int64_t l = 0; l < shape_.num_layers; ++l) {
      for (bool is_v : {false, true}) {
        KvStaging staging;
        staging.Allocate(Streaming(l, is_v), shape_.num_kv_heads, row);
        (is_v ? s.v_staging : s.k_staging).push_back(std::move(staging));
      }
    }
    KVQ_RETURN_IF_ERROR(ChargeStaging(s));
  }
  sequences_[seq] = std::move(s);
  return Status::Ok();
}

void PagedKvCache::ReleaseSequence(SeqId seq) {
  Sequence* s = Find(seq);
  if (s == nullptr) return;
  // Last block first: cached blocks go idle in this order, so under memory
  // pressure a prefix's tail is evicted before its head (which more
  // sequences are likely to share), as in vLLM.
  for (auto it = s->blocks.rbegin(); it != s->blocks.rend(); ++it) allocator_->Unref(*it);
  for (BlockId b : s->staging_charge) allocator_->Unref(b);
  sequences_.erase(seq);
}

Status PagedKvCache::Fork(SeqId src, SeqId dst) {
  const Sequence* s = Find(src);
  if (s == nullptr) return Status::Error("fork: unknown " + SeqName(src));
  if (Find(dst) != nullptr) return Status::Error("fork: " + SeqName(dst) + " exists");
  for (int64_t length : s->lengths) {
    if (length != s->lengths[0]) {
      return Status::Error("fork: " + SeqName(src) + " is in the middle of a forward pass");
    }
  }
  Sequence copy = *s;
  copy.blocks.reserve(static_cast<size_t>(MaxBlocksPerSequence()));
  copy.staging_charge.clear();
  if (any_streaming_) KVQ_RETURN_IF_ERROR(ChargeStaging(copy).WithContext("fork"));
  for (BlockId b : s->blocks) allocator_->Ref(b);
  sequences_[dst] = std::move(copy);
  return Status::Ok();
}

Status PagedKvCache::Truncate(SeqId seq, int64_t length) {
  Sequence* s = Find(seq);
  if (s == nullptr) return Status::Error("truncate: unknown " + SeqName(seq));
  const int64_t stored = *std::min_element(s->lengths.begin(), s->lengths.end());
  if (length < 0 || length > stored) {
    return Status::Error("truncate: length " + std::to_string(length) + " outside [0, " +
                         std::to_string(stored) + "] for " + SeqName(seq));
  }
  if (any_streaming_) {
    // Tokens that were encoded but would be waiting in the ring at this
    // length go back into it (decoded, so they keep their quantization error).
    const int64_t dim = shape_.head_dim;
    std::vector<float> x;  // [tokens, head_dim]
    std::vector<uint8_t> half;
    for (int64_t l = 0; l < shape_.num_layers; ++l) {
      for (bool is_v : {false, true}) {
        const KvStreaming& st = Streaming(l, is_v);
        KvStaging& staging = StagingOf(*s, l, is_v);
        for (size_t i = 0; i < staging.detected.size(); ++i) {
          if (staging.detected[i] >= length) {
            staging.detected[i] = -1;
            staging.detected_mass[i] = 0.0f;
          }
        }
        if (st.Plain() || staging.encoded <= st.EncodedAt(length)) continue;
        const int64_t first = st.EncodedAt(length), last = std::min(length, staging.encoded);
        const int64_t capacity = st.ResidualCapacity();
        const size_t row = f16_codec_->RowBytes();
        x.resize(static_cast<size_t>(std::max<int64_t>(0, last - first) * dim));
        half.resize(static_cast<size_t>(std::max<int64_t>(0, last - first)) * row);
        for (int64_t h = 0; h < shape_.num_kv_heads && last > first; ++h) {
          DecodeTokens(*s, l, is_v, h, first, last - first, x.data());
          f16_codec_->Encode(x.data(), last - first, half.data());
          for (int64_t p = first; p < last; ++p) {
            std::memcpy(&staging.ring[(h * capacity + p % capacity) * row],
                        &half[static_cast<size_t>(p - first) * row], row);
          }
        }
        staging.encoded = first;
      }
    }
  }
  const size_t keep =
      static_cast<size_t>((length + layout_.block_tokens - 1) / layout_.block_tokens);
  for (size_t j = keep; j < s->blocks.size(); ++j) allocator_->Unref(s->blocks[j]);
  s->blocks.resize(std::min(keep, s->blocks.size()));
  const size_t full = static_cast<size_t>(length / layout_.block_tokens);
  s->block_hashes.resize(std::min(full, s->block_hashes.size()));
  std::fill(s->lengths.begin(), s->lengths.end(), length);
  return Status::Ok();
}

int64_t PagedKvCache::Length(SeqId seq, int64_t layer) const {
  const Sequence* s = Find(seq);
  if (s == nullptr || layer < 0 || layer >= shape_.num_layers) return 0;
  return s->lengths[static_cast<size_t>(layer)];
}

int64_t PagedKvCache::TokensThatFit(const Sequence& s) const {
  const int64_t bt = layout_.block_tokens;
  const int64_t length = *std::max_element(s.lengths.begin(), s.lengths.end());
  int64_t free_blocks = allocator_->NumFree();
  int64_t room = static_cast<int64_t>(s.blocks.size()) * bt - length;
  if (length % bt != 0 && MustCopy(s.blocks[static_cast<size_t>(length / bt)])) {
    // The shared partial block must be copied before the first write.
    if (free_blocks == 0) return 0;
    --free_blocks;
  }
  return room + free_blocks * bt;
}

int64_t PagedKvCache::Capacity(SeqId seq) const {
  const Sequence* s = Find(seq);
  if (s == nullptr) return 0;
  const int64_t length = *std::max_element(s->lengths.begin(), s->lengths.end());
  return std::min(options_.max_tokens - length, TokensThatFit(*s));
}

Status PagedKvCache::PrepareWrite(Sequence& s, int64_t first_block, int64_t last_block) {
  const int64_t have = static_cast<int64_t>(s.blocks.size());
  int64_t needed = std::max<int64_t>(0, last_block + 1 - have);
  for (int64_t j = first_block; j <= std::min(last_block, have - 1); ++j) {
    if (MustCopy(s.blocks[static_cast<size_t>(j)])) ++needed;
  }
  if (needed > allocator_->NumFree()) {
    return Status::Error("KV cache out of memory: " + std::to_string(needed) + " more blocks of " +
                         std::to_string(layout_.block_bytes) + " bytes needed, " +
                         std::to_string(allocator_->NumFree()) + " of " +
                         std::to_string(allocator_->NumBlocks()) + " free (raise --kv-memory)");
  }
  for (int64_t j = first_block; j <= std::min(last_block, have - 1); ++j) {
    BlockId& block = s.blocks[static_cast<size_t>(j)];
    if (!MustCopy(block)) continue;
    // Copy-on-write: the block holds every layer's prefix tokens, so one
    // whole-block copy serves the layers that have not written yet too.
    KVQ_ASSIGN_OR_RETURN(BlockId copy, allocator_->Allocate());
    CopyBlock(block, copy);
    allocator_->Unref(block);
    block = copy;
  }
  while (static_cast<int64_t>(s.blocks.size()) <= last_block) {
    KVQ_ASSIGN_OR_RETURN(BlockId block, allocator_->Allocate());
    s.blocks.push_back(block);
  }
  return Status::Ok();
}

void PagedKvCache::CopyBlock(BlockId src, BlockId dst) {
  for (int64_t layer = 0; layer < shape_.num_layers; ++layer) {
    const KvLayerLayout& l = layout_.layers[static_cast<size_t>(layer)];
    for (int64_t h = 0; h < shape_.num_kv_heads; ++h) {
      std::memcpy(MutableTile(dst, layer, h, false), Tile(src, layer, h, false), l.k_tile_bytes);
      std::memcpy(MutableTile(dst, layer, h, true), Tile(src, layer, h, true), l.v_tile_bytes);
    }
  }
}

void PagedKvCache::EncodeRows(Sequence& s, int64_t layer, bool is_v, int64_t start, int64_t n,
                              const float* x) {
  const int64_t dim = shape_.head_dim, kv_heads = shape_.num_kv_heads;
  const int64_t bt = layout_.block_tokens;
  if (head_rows_.size() < static_cast<size_t>(n * dim)) head_rows_.resize(n * dim);
  float* head_rows = head_rows_.data();  // [n, dim] of one KV head
  for (int64_t h = 0; h < kv_heads; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(&head_rows[t * dim], x + (t * kv_heads + h) * dim, dim * sizeof(float));
    }
    const size_t instance = static_cast<size_t>(layer * kv_heads + h);
    KvCodec& codec = is_v ? *v_codecs_[instance] : *k_codecs_[instance];
    char& calibrated = is_v ? v_calibrated_[instance] : k_calibrated_[instance];
    if (!calibrated) {
      if (codec.NeedsCalibration()) codec.Calibrate(head_rows, n);
      calibrated = 1;
    }
    const size_t row_bytes = codec.RowBytes();
    for (int64_t t = 0; t < n;) {
      const int64_t pos = start + t, in_block = pos % bt;
      const int64_t run = std::min(n - t, bt - in_block);
      uint8_t* tile = MutableTile(s.blocks[static_cast<size_t>(pos / bt)], layer, h, is_v);
      codec.Encode(&head_rows[t * dim], run, tile + static_cast<size_t>(in_block) * row_bytes);
      t += run;
    }
  }
}

Status PagedKvCache::Append(SeqId seq, int64_t layer, int64_t n, const float* k_pre_rope,
                            const float* k, const float* v) {
  Sequence* s = Find(seq);
  if (s == nullptr) return Status::Error("append: unknown " + SeqName(seq));
  if (layer < 0 || layer >= shape_.num_layers) {
    return Status::Error("append: layer " + std::to_string(layer) + " outside [0, " +
                         std::to_string(shape_.num_layers) + ")");
  }
  if (n < 0) return Status::Error("append: negative token count");
  if (n == 0) return Status::Ok();
  const int64_t start = s->lengths[static_cast<size_t>(layer)];
  if (start + n > options_.max_tokens) {
    return Status::Error("KV cache full: " + SeqName(seq) + " holds " + std::to_string(start) +
                         " tokens; " + std::to_string(n) + " more exceed the limit of " +
                         std::to_string(options_.max_tokens) + " tokens per sequence");
  }
  const int64_t bt = layout_.block_tokens;
  KVQ_RETURN_IF_ERROR(PrepareWrite(*s, start / bt, (start + n - 1) / bt));
  const float* k_stored = Streaming(layer, /*is_v=*/false).pre_rope ? k_pre_rope : k;
  const float* v_stored = v;
  const int64_t k_block = k_rotation_[static_cast<size_t>(layer)];
  const int64_t v_block = v_rotation_[static_cast<size_t>(layer)];
  const bool matrix = layer_matrix_[static_cast<size_t>(layer)];
  if (options_.rotate || k_block > 0 || v_block > 0 || matrix) {  // [n, kv_heads, head_dim]
    const int64_t rows = n * shape_.num_kv_heads, dim = shape_.head_dim;
    rotated_k_.assign(k_stored, k_stored + rows * dim);
    rotated_v_.assign(v_stored, v_stored + rows * dim);
    if (options_.rotate) {
      KVQ_RETURN_IF_ERROR(HadamardRotate(rotated_k_.data(), rows, dim));
      KVQ_RETURN_IF_ERROR(HadamardRotate(rotated_v_.data(), rows, dim));
    }
    if (k_block > 0)
      KVQ_RETURN_IF_ERROR(WalshHadamardBlocks(rotated_k_.data(), rows, dim, k_block));
    if (v_block > 0)
      KVQ_RETURN_IF_ERROR(WalshHadamardBlocks(rotated_v_.data(), rows, dim, v_block));
    if (matrix) {
      const int64_t kv = shape_.num_kv_heads;
      ApplyMatrices(k_matrix_, layer, /*transpose=*/false, rotated_k_.data(), rows, kv, 1);
      ApplyMatrices(v_matrix_, layer, /*transpose=*/false, rotated_v_.data(), rows, kv, 1);
    }
    k_stored = rotated_k_.data();
    v_stored = rotated_v_.data();
  }
  if (any_detect_) {
    last_valid_ = n > 1 && (Streaming(layer, false).detect_sinks > 0 ||
                            Streaming(layer, true).detect_sinks > 0);
    if (last_valid_) {  // prefill only: a decode step neither copies nor allocates
      const size_t count = static_cast<size_t>(n * shape_.num_kv_heads * shape_.head_dim);
      last_k_.assign(k_stored, k_stored + count);
      last_v_.assign(v_stored, v_stored + count);
      last_seq_ = seq;
      last_layer_ = layer;
      last_start_ = start;
      last_n_ = n;
    }
  }
  AppendStreaming(*s, layer, /*is_v=*/false, start, n, k_stored);
  AppendStreaming(*s, layer, /*is_v=*/true, start, n, v_stored);
  s->lengths[static_cast<size_t>(layer)] += n;
  return Status::Ok();
}

void PagedKvCache::AppendStreaming(Sequence& s, int64_t layer, bool is_v, int64_t start, int64_t n,
                                   const float* x) {
  const KvStreaming& st = Streaming(layer, is_v);
  if (st.Plain()) return EncodeRows(s, layer, is_v, start, n, x);
  KvStaging& staging = StagingOf(s, layer, is_v);
  const KvDue due =
      StageTokens(st, staging, *f16_codec_, shape_.num_kv_heads, start, n, x, &staging_scratch_);
  if (due.count > 0) {
    EncodeRows(s, layer, is_v, due.first, due.count, staging_scratch_.due.data());
    staging.encoded = due.first + due.count;
  }
}

Status PagedKvCache::Attend(SeqId seq, int64_t layer, int64_t n, const float* q, float scale,
                            float* out) const {
  const Sequence* s = Find(seq);
  if (s == nullptr) return Status::Error("attend: unknown " + SeqName(seq));
  if (layer < 0 || layer >= shape_.num_layers) {
    return Status::Error("attend: layer " + std::to_string(layer) + " outside [0, " +
                         std::to_string(shape_.num_layers) + ")");
  }
  const int64_t stored = s->lengths[static_cast<size_t>(layer)];
  if (n <= 0 || n > stored) {
    return Status::Error("attend: " + std::to_string(n) + " queries for " + std::to_string(stored) +
                         " stored tokens of " + SeqName(seq));
  }
  const int64_t k_block = k_rotation_[static_cast<size_t>(layer)];
  const int64_t v_block = v_rotation_[static_cast<size_t>(layer)];
  const bool matrix = layer_matrix_[static_cast<size_t>(layer)];
  const bool detect = DetectionDue(seq, layer, n, stored);
  if (!options_.rotate && k_block == 0 && v_block == 0 && !matrix) {
    if (detect) DetectSinks(const_cast<Sequence&>(*s), layer, n, q, scale);
    AttendTiles(*s, layer, n, q, scale, out);
    return Status::Ok();
  }
  // K holds G_k R k, V holds G_v R v (R: --kv-rotate, G: llama.cpp's blocks;
  // all orthogonal): q is rotated the same way as K, so scores are
  // unchanged, and sum p (G_v R v) = G_v R (sum p v) is undone once at the
  // end (G is its own inverse).
  // M (the codecs' dense rotations) comes last on the way in and is undone
  // first on the way out; the query heads of KV head g use g's matrices.
  const int64_t rows = n * shape_.num_heads, dim = shape_.head_dim;
  const int64_t heads = shape_.num_heads, group = heads / shape_.num_kv_heads;
  const float* q_stored = q;
  if (options_.rotate || k_block > 0 || matrix) {
    rotated_q_.assign(q, q + rows * dim);  // [n, num_heads, head_dim]
    if (options_.rotate) KVQ_RETURN_IF_ERROR(HadamardRotate(rotated_q_.data(), rows, dim));
    if (k_block > 0)
      KVQ_RETURN_IF_ERROR(WalshHadamardBlocks(rotated_q_.data(), rows, dim, k_block));
    if (matrix) ApplyMatrices(k_matrix_, layer, false, rotated_q_.data(), rows, heads, group);
    q_stored = rotated_q_.data();
  }
  if (detect) DetectSinks(const_cast<Sequence&>(*s), layer, n, q_stored, scale);
  AttendTiles(*s, layer, n, q_stored, scale, out);
  if (matrix) ApplyMatrices(v_matrix_, layer, /*transpose=*/true, out, rows, heads, group);
  if (v_block > 0) KVQ_RETURN_IF_ERROR(WalshHadamardBlocks(out, rows, dim, v_block));
  return options_.rotate ? HadamardUnrotate(out, rows, dim) : Status::Ok();
}

void PagedKvCache::ApplyMatrices(const std::vector<const float*>& matrices, int64_t layer,
                                 bool transpose, float* x, int64_t rows, int64_t row_heads,
                                 int64_t heads_per_matrix) const {
  // d^2 per row, once per token and head: small next to the projections
  // (d * hidden each), so it accumulates in double and is exactly
  // reproducible by the tests' reference (tests/kv/oscar_test.cc).
  const int64_t dim = shape_.head_dim, kv_heads = shape_.num_kv_heads;
  double* y = matrix_row_.data();  // [dim]
  for (int64_t r = 0; r < rows; ++r) {
    const float* m =
        matrices[static_cast<size_t>(layer * kv_heads + r % row_heads / heads_per_matrix)];
    if (m == nullptr) continue;
    float* row = x + r * dim;
    for (int64_t i = 0; i < dim; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < dim; ++j) {
        sum += static_cast<double>(transpose ? m[j * dim + i] : m[i * dim + j]) * row[j];
      }
      y[i] = sum;
    }
    for (int64_t i = 0; i < dim; ++i) row[i] = static_cast<float>(y[i]);
  }
}

void PagedKvCache::DecodeTokens(const Sequence& s, int64_t layer, bool is_v, int64_t head,
                                int64_t t0, int64_t count, float* x) const {
  const int64_t dim = shape_.head_dim, bt = layout_.block_tokens;
  const KvCodec& codec =
      *(is_v ? v_codecs_ : k_codecs_)[static_cast<size_t>(layer * shape_.num_kv_heads + head)];
  const KvStreaming& st = codec.streaming();
  const KvStaging no_staging;
  const KvStaging& staging = st.Plain() ? no_staging : StagingOf(s, layer, is_v);
  std::vector<float> block_rows(static_cast<size_t>(bt * dim));  // [bt, dim]
  for (int64_t b = t0 / bt; b * bt < t0 + count; ++b) {
    const int64_t b0 = b * bt, b1 = std::min((b + 1) * bt, t0 + count);
    const uint8_t* tile = Tile(s.blocks[static_cast<size_t>(b)], layer, head, is_v);
    // A plain codec has every token encoded.
    KvStaging plain;
    const KvStaging* view = &staging;
    if (st.Plain()) {
      plain.encoded = b1;
      view = &plain;
    }
    // Segments in order: later ones (sinks) overwrite the encoded rows.
    ForEachKvSegment(
        st, *view, head, f16_codec_->RowBytes(), tile, b0, b1 - b0, [&](const KvSegment& seg) {
          const KvCodec& rows_codec = seg.kind == KvSegment::kEncoded ? codec : *f16_codec_;
          rows_codec.Decode(seg.rows, seg.count, &block_rows[(seg.first - b0) * dim]);
        });
    if (st.detect_sinks > 0) DetectedRows(staging, st, head, b0, b1 - b0, block_rows.data());
    const int64_t from = std::max(t0, b0);
    std::memcpy(x + (from - t0) * dim, &block_rows[static_cast<size_t>((from - b0) * dim)],
                static_cast<size_t>((b1 - from) * dim) * sizeof(float));
  }
}

size_t PagedKvCache::BytesUsed() const {
  return static_cast<size_t>(allocator_->NumUsed()) * layout_.block_bytes + layout_.side_bytes;
}

KvUsage PagedKvCache::Usage() const {
  KvUsage usage;
  usage.blocks_total = allocator_->NumBlocks();
  usage.blocks_used = allocator_->NumUsed();
  usage.block_bytes = layout_.block_bytes;
  usage.block_tokens = layout_.block_tokens;
  usage.sequence_blocks = layout_.staging_blocks;
  usage.bytes_used = BytesUsed();
  usage.bytes_reserved =
      static_cast<size_t>(allocator_->NumBlocks()) * layout_.block_bytes + layout_.side_bytes;
  usage.sequences = static_cast<int64_t>(sequences_.size());
  usage.blocks_cached = allocator_->NumIdle();
  for (const auto& [id, seq] : sequences_) {
    usage.blocks_logical += static_cast<int64_t>(seq.blocks.size() + seq.staging_charge.size());
  }
  return usage;
}

std::vector<BlockId> PagedKvCache::BlockTable(SeqId seq) const {
  const Sequence* s = Find(seq);
  return s == nullptr ? std::vector<BlockId>{} : s->blocks;
}

Status PagedKvCache::DecodeLayer(SeqId seq, int64_t layer, float* k, float* v) const {
  const Sequence* s = Find(seq);
  if (s == nullptr) return Status::Error("decode: unknown " + SeqName(seq));
  if (layer < 0 || layer >= shape_.num_layers) return Status::Error("decode: bad layer");
  const int64_t dim = shape_.head_dim, kv_heads = shape_.num_kv_heads;
  const int64_t total = s->lengths[static_cast<size_t>(layer)];
  std::vector<float> rows(static_cast<size_t>(total * dim));  // [total, dim] of one head
  for (int64_t h = 0; h < kv_heads; ++h) {
    for (bool is_v : {false, true}) {
      if (total > 0) DecodeTokens(*s, layer, is_v, h, 0, total, rows.data());
      float* dst = is_v ? v : k;
      for (int64_t t = 0; t < total; ++t) {
        std::memcpy(dst + (t * kv_heads + h) * dim, &rows[static_cast<size_t>(t * dim)],
                    dim * sizeof(float));
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvq
