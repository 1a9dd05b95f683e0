#include "kv/paged_cache.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include "kv/hadamard.h"
#include "kv/online_softmax.h"

namespace kvq {
namespace {

// Query rows (query tokens x the query heads of one KV head) one task handles
// together: each K/V tile it reads serves all of them, so prefill reads the
// cache about n * group / kTargetRows times instead of n * group times, while
// the per-task buffers ([rows, head_dim] floats) stay in L1/L2.
constexpr int64_t kTargetRows = 32;
// Split-K only when every part still has this many tokens to read: below
// that, merging partial results costs more than the parallelism gains.
constexpr int64_t kMinTokensPerSplit = 256;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::string SeqName(SeqId seq) { return "sequence " + std::to_string(seq); }

}  // namespace

PagedKvCache::PagedKvCache(const KvShape& shape, const KvCacheOptions& options,
                           const KvLayout& layout)
    : shape_(shape),
      options_(options),
      layout_(layout),
      num_threads_(options.num_threads > 0 ? options.num_threads : omp_get_max_threads()) {}

StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::Create(const KvShape& shape,
                                                             const KvCacheOptions& options) {
  KVQ_ASSIGN_OR_RETURN(KvLayout layout, ComputeKvLayout(shape, options));
  if (options.rotate) {
    KVQ_RETURN_IF_ERROR(CheckHadamardDim(shape.head_dim).WithContext("--kv-rotate"));
  }
  auto cache = std::unique_ptr<PagedKvCache>(new PagedKvCache(shape, options, layout));
  const int64_t instances = shape.num_layers * shape.num_kv_heads;
  for (int64_t i = 0; i < instances; ++i) {
    KVQ_ASSIGN_OR_RETURN(auto k_codec, ParseKvCodec(options.k_type, shape.head_dim));
    KVQ_ASSIGN_OR_RETURN(auto v_codec, ParseKvCodec(options.v_type, shape.head_dim));
    cache->k_codecs_.push_back(std::move(k_codec));
    cache->v_codecs_.push_back(std::move(v_codec));
  }
  cache->k_calibrated_.assign(static_cast<size_t>(instances), 0);
  cache->v_calibrated_.assign(static_cast<size_t>(instances), 0);
  KVQ_ASSIGN_OR_RETURN(cache->allocator_,
                       BlockAllocator::Create(layout.block_bytes, layout.num_blocks));
  const std::string k_name = cache->k_codecs_[0]->Name();
  const std::string v_name = cache->v_codecs_[0]->Name();
  cache->type_name_ = k_name == v_name ? k_name : "k:" + k_name + "/v:" + v_name;
  if (options.rotate) cache->type_name_ += "+rot";
  return cache;
}

PagedKvCache::Sequence* PagedKvCache::Find(SeqId seq) {
  auto it = sequences_.find(seq);
  return it == sequences_.end() ? nullptr : &it->second;
}
const PagedKvCache::Sequence* PagedKvCache::Find(SeqId seq) const {
  auto it = sequences_.find(seq);
  return it == sequences_.end() ? nullptr : &it->second;
}

Status PagedKvCache::AddSequence(SeqId seq) {
  if (Find(seq) != nullptr) return Status::Error(SeqName(seq) + " exists");
  sequences_[seq].lengths.assign(static_cast<size_t>(shape_.num_layers), 0);
  return Status::Ok();
}

void PagedKvCache::ReleaseSequence(SeqId seq) {
  Sequence* s = Find(seq);
  if (s == nullptr) return;
  for (BlockId b : s->blocks) allocator_->Unref(b);
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
  for (BlockId b : s->blocks) allocator_->Ref(b);
  Sequence copy = *s;
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
  const size_t keep =
      static_cast<size_t>((length + layout_.block_tokens - 1) / layout_.block_tokens);
  for (size_t j = keep; j < s->blocks.size(); ++j) allocator_->Unref(s->blocks[j]);
  s->blocks.resize(std::min(keep, s->blocks.size()));
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
  if (length % bt != 0 && allocator_->RefCount(s.blocks[static_cast<size_t>(length / bt)]) > 1) {
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
    if (allocator_->RefCount(s.blocks[static_cast<size_t>(j)]) > 1) ++needed;
  }
  if (needed > allocator_->NumFree()) {
    return Status::Error("KV cache out of memory: " + std::to_string(needed) + " more blocks of " +
                         std::to_string(layout_.block_bytes) + " bytes needed, " +
                         std::to_string(allocator_->NumFree()) + " of " +
                         std::to_string(allocator_->NumBlocks()) + " free (raise --kv-memory)");
  }
  for (int64_t j = first_block; j <= std::min(last_block, have - 1); ++j) {
    BlockId& block = s.blocks[static_cast<size_t>(j)];
    if (allocator_->RefCount(block) == 1) continue;
    // Copy-on-write: the block holds every layer's prefix tokens, so one
    // whole-block copy serves the layers that have not written yet too.
    KVQ_ASSIGN_OR_RETURN(BlockId copy, allocator_->Allocate());
    std::memcpy(allocator_->BlockData(copy), allocator_->BlockData(block), layout_.block_bytes);
    allocator_->Unref(block);
    block = copy;
  }
  while (static_cast<int64_t>(s.blocks.size()) <= last_block) {
    KVQ_ASSIGN_OR_RETURN(BlockId block, allocator_->Allocate());
    s.blocks.push_back(block);
  }
  return Status::Ok();
}

void PagedKvCache::EncodeRows(Sequence& s, int64_t layer, bool is_v, int64_t start, int64_t n,
                              const float* x) {
  const int64_t dim = shape_.head_dim, kv_heads = shape_.num_kv_heads;
  const int64_t bt = layout_.block_tokens;
  std::vector<float> rotated;  // [n, kv_heads, dim]
  if (options_.rotate) {
    rotated.assign(x, x + n * kv_heads * dim);
    // Create checked the dimension, the only way rotation can fail.
    const Status rotated_ok = HadamardRotate(rotated.data(), n * kv_heads, dim);
    assert(rotated_ok.ok());
    (void)rotated_ok;
    x = rotated.data();
  }
  std::vector<float> head_rows(static_cast<size_t>(n * dim));  // [n, dim] of one KV head
  for (int64_t h = 0; h < kv_heads; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(&head_rows[t * dim], x + (t * kv_heads + h) * dim, dim * sizeof(float));
    }
    const size_t instance = static_cast<size_t>(layer * kv_heads + h);
    KvCodec& codec = is_v ? *v_codecs_[instance] : *k_codecs_[instance];
    char& calibrated = is_v ? v_calibrated_[instance] : k_calibrated_[instance];
    if (!calibrated) {
      if (codec.NeedsCalibration()) codec.Calibrate(head_rows.data(), n);
      calibrated = 1;
    }
    const size_t offset = is_v ? layout_.VTileOffset(layer, h) : layout_.KTileOffset(layer, h);
    const size_t row_bytes = codec.RowBytes();
    for (int64_t t = 0; t < n;) {
      const int64_t pos = start + t, in_block = pos % bt;
      const int64_t run = std::min(n - t, bt - in_block);
      uint8_t* tile = allocator_->BlockData(s.blocks[static_cast<size_t>(pos / bt)]) + offset;
      codec.Encode(&head_rows[t * dim], run, tile + static_cast<size_t>(in_block) * row_bytes);
      t += run;
    }
  }
}

Status PagedKvCache::Append(SeqId seq, int64_t layer, int64_t n, const float* /*k_pre_rope*/,
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
  EncodeRows(*s, layer, /*is_v=*/false, start, n, k);
  EncodeRows(*s, layer, /*is_v=*/true, start, n, v);
  s->lengths[static_cast<size_t>(layer)] += n;
  return Status::Ok();
}

void PagedKvCache::Attend(SeqId seq, int64_t layer, int64_t n, const float* q, float scale,
                          float* out) const {
  const Sequence* s = Find(seq);
  const int64_t q_count = n * shape_.num_heads * shape_.head_dim;
  // The interface has no error path here; the forward pass only attends after
  // a successful Append, so these guard against misuse in tests and tools.
  if (s == nullptr || layer < 0 || layer >= shape_.num_layers || n <= 0 ||
      n > s->lengths[static_cast<size_t>(layer)]) {
    assert(false && "Attend on an unknown sequence or more queries than stored tokens");
    if (n > 0) std::fill(out, out + q_count, 0.0f);
    return;
  }
  if (!options_.rotate) {
    AttendTiles(*s, layer, n, q, scale, out);
    return;
  }
  // H orthogonal: (Hq)·(Hk) = q·k, and sum p (Hv) = H (sum p v), so the output
  // is unrotated once at the end.
  std::vector<float> q_rotated(q, q + q_count);  // [n, num_heads, head_dim]
  // Create checked the dimension, the only way rotation can fail.
  Status rotated_ok = HadamardRotate(q_rotated.data(), n * shape_.num_heads, shape_.head_dim);
  AttendTiles(*s, layer, n, q_rotated.data(), scale, out);
  rotated_ok = HadamardUnrotate(out, n * shape_.num_heads, shape_.head_dim);
  assert(rotated_ok.ok());
  (void)rotated_ok;
}

void PagedKvCache::AttendTiles(const Sequence& s, int64_t layer, int64_t n, const float* q,
                               float scale, float* out) const {
  const int64_t dim = shape_.head_dim, heads = shape_.num_heads, kv_heads = shape_.num_kv_heads;
  const int64_t group = heads / kv_heads, bt = layout_.block_tokens;
  const int64_t total = s.lengths[static_cast<size_t>(layer)];
  const int64_t tile_queries = std::clamp<int64_t>(kTargetRows / group, 1, n);
  const int64_t num_tiles = (n + tile_queries - 1) / tile_queries;
  const int64_t base_tasks = num_tiles * kv_heads;
  int64_t splits = 1;
  if (base_tasks < num_threads_) {
    splits = std::clamp<int64_t>((num_threads_ + base_tasks - 1) / base_tasks, 1,
                                 std::max<int64_t>(1, total / kMinTokensPerSplit));
  }
  const int64_t num_tasks = base_tasks * splits;
  const int64_t max_rows = tile_queries * group;
  // Split-K partial results, merged below: running max, sum and unnormalized
  // accumulator per task and row.
  std::vector<float> part_max, part_sum, part_acc;  // [tasks, max_rows], same, [.., dim]
  if (splits > 1) {
    part_max.resize(static_cast<size_t>(num_tasks * max_rows));
    part_sum.resize(static_cast<size_t>(num_tasks * max_rows));
    part_acc.resize(static_cast<size_t>(num_tasks * max_rows * dim));
  }
  const int threads = static_cast<int>(std::min<int64_t>(num_threads_, num_tasks));

#pragma omp parallel num_threads(threads)
  {
    std::vector<float> q_rows(static_cast<size_t>(max_rows * dim));  // [rows, dim]
    std::vector<float> probs(static_cast<size_t>(max_rows * bt));    // [rows, bt]
    std::vector<float> acc(static_cast<size_t>(max_rows * dim));     // [rows, dim]
    std::vector<float> row_max(static_cast<size_t>(max_rows));
    std::vector<float> row_sum(static_cast<size_t>(max_rows));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < num_tasks; ++task) {
      const int64_t split = task % splits;
      const int64_t g = (task / splits) % kv_heads;
      // Later query tiles see more tokens: hand them out first.
      const int64_t tile = num_tiles - 1 - task / (splits * kv_heads);
      const int64_t i0 = tile * tile_queries, i1 = std::min(n, i0 + tile_queries);
      const int64_t rows = (i1 - i0) * group;
      for (int64_t i = i0; i < i1; ++i) {
        std::memcpy(&q_rows[(i - i0) * group * dim], q + (i * heads + g * group) * dim,
                    group * dim * sizeof(float));
      }
      const size_t instance = static_cast<size_t>(layer * kv_heads + g);
      const KvCodec& k_codec = *k_codecs_[instance];
      const KvCodec& v_codec = *v_codecs_[instance];
      const size_t k_offset = layout_.KTileOffset(layer, g);
      const size_t v_offset = layout_.VTileOffset(layer, g);
      // Query i sees tokens [0, total - n + i]; the tile's last query sees most.
      const int64_t first_visible = total - n + i0 + 1;
      const int64_t visible_end = total - n + i1;
      const int64_t num_blocks = (visible_end + bt - 1) / bt;
      const int64_t b0 = num_blocks * split / splits, b1 = num_blocks * (split + 1) / splits;
      std::fill_n(row_max.begin(), rows, kNegInf);
      std::fill_n(row_sum.begin(), rows, 0.0f);
      std::fill_n(acc.begin(), rows * dim, 0.0f);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t t0 = b * bt, count = std::min(bt, visible_end - t0);
        const uint8_t* block = allocator_->BlockData(s.blocks[static_cast<size_t>(b)]);
        k_codec.Scores(block + k_offset, count, q_rows.data(), rows, scale, probs.data(), bt);
        const bool masked = t0 + count > first_visible;
        for (int64_t r = 0; r < rows; ++r) {
          float* p = &probs[r * bt];
          int64_t valid = count;
          if (masked) {
            valid = std::clamp<int64_t>(first_visible + r / group - t0, 0, count);
            std::fill(p + valid, p + count, 0.0f);
            if (valid == 0) continue;
          }
          OnlineSoftmaxStep(p, valid, &row_max[r], &row_sum[r], &acc[r * dim], dim);
        }
        v_codec.AccumulateV(block + v_offset, count, probs.data(), rows, bt, acc.data());
      }
      if (splits == 1) {
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r / group, h = g * group + r % group;
          const float inv = 1.0f / row_sum[r];
          float* o = out + (i * heads + h) * dim;
          for (int64_t d = 0; d < dim; ++d) o[d] = acc[r * dim + d] * inv;
        }
      } else {
        std::copy_n(row_max.begin(), rows, part_max.begin() + task * max_rows);
        std::copy_n(row_sum.begin(), rows, part_sum.begin() + task * max_rows);
        std::copy_n(acc.begin(), rows * dim, part_acc.begin() + task * max_rows * dim);
      }
    }
  }
  if (splits == 1) return;
  // Exact merge of the split-K parts: with M = max_s m_s, the full softmax
  // sum is sum_s l_s e^(m_s - M) and the output sum_s acc_s e^(m_s - M) / sum.
  for (int64_t base = 0; base < base_tasks; ++base) {
    const int64_t g = base % kv_heads, tile = num_tiles - 1 - base / kv_heads;
    const int64_t i0 = tile * tile_queries, i1 = std::min(n, i0 + tile_queries);
    for (int64_t r = 0; r < (i1 - i0) * group; ++r) {
      float merged_max = kNegInf;
      for (int64_t sp = 0; sp < splits; ++sp) {
        merged_max = std::max(merged_max, part_max[(base * splits + sp) * max_rows + r]);
      }
      float total_sum = 0;
      float* o = out + ((i0 + r / group) * heads + g * group + r % group) * dim;
      std::fill(o, o + dim, 0.0f);
      for (int64_t sp = 0; sp < splits; ++sp) {
        const int64_t task = base * splits + sp;
        const float m = part_max[task * max_rows + r];
        if (m == kNegInf) continue;  // this part saw no visible token of the row
        const float w = std::exp(m - merged_max);
        total_sum += part_sum[task * max_rows + r] * w;
        const float* a = &part_acc[(task * max_rows + r) * dim];
        for (int64_t d = 0; d < dim; ++d) o[d] += a[d] * w;
      }
      const float inv = 1.0f / total_sum;
      for (int64_t d = 0; d < dim; ++d) o[d] *= inv;
    }
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
  usage.bytes_used = BytesUsed();
  usage.bytes_reserved =
      static_cast<size_t>(allocator_->NumBlocks()) * layout_.block_bytes + layout_.side_bytes;
  usage.sequences = static_cast<int64_t>(sequences_.size());
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
  const int64_t dim = shape_.head_dim, kv_heads = shape_.num_kv_heads, bt = layout_.block_tokens;
  const int64_t total = s->lengths[static_cast<size_t>(layer)];
  std::vector<float> rows(static_cast<size_t>(bt * dim));  // [bt, dim]
  for (int64_t h = 0; h < kv_heads; ++h) {
    const size_t instance = static_cast<size_t>(layer * kv_heads + h);
    for (int is_v = 0; is_v < 2; ++is_v) {
      const KvCodec& codec = is_v ? *v_codecs_[instance] : *k_codecs_[instance];
      const size_t offset = is_v ? layout_.VTileOffset(layer, h) : layout_.KTileOffset(layer, h);
      float* dst = is_v ? v : k;
      for (int64_t t0 = 0; t0 < total; t0 += bt) {
        const int64_t count = std::min(bt, total - t0);
        codec.Decode(allocator_->BlockData(s->blocks[static_cast<size_t>(t0 / bt)]) + offset, count,
                     rows.data());
        for (int64_t t = 0; t < count; ++t) {
          std::memcpy(dst + ((t0 + t) * kv_heads + h) * dim, &rows[t * dim], dim * sizeof(float));
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvq
