// PagedKvCache's fused attention (paged_cache.h): the run state it uses, sized
// once, and the tile loop over (query tile, KV head) tasks with split-K.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kv/online_softmax.h"
#include "kv/paged_cache.h"

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
// Tokens per softmax step. The codecs score one block at a time (a block's
// tile is what they read), but the online softmax runs over chunks of whole
// blocks: its per-row max and sum reductions and the rescaling of the
// accumulator cost as much for one 16-token block as for 256 tokens, and at
// 16 tokens they cost about as much as the scores themselves.
constexpr int64_t kChunkTokens = 256;
// Tokens per codec call and per prefetch step. When a sequence's blocks are
// physically consecutive (the allocator hands them out in order, and a
// block's tiles are slot-major: BlockAllocator::BlockSlot), one head's K
// (or V) rows of several blocks are one run that a single ScoresPrepared
// (AccumulateV) call reads, instead of one call per 16-token block. While
// one step of K rows is scored, the next step's K rows and this step's V
// rows are prefetched, so the V pass after the chunk's softmax finds its
// rows in cache. On consecutive blocks this prefetch measured within noise
// of none (the slot-major layout is what removed the stalls:
// docs/benchmarks.md, "slot-major"); it stays for blocks scattered by many
// sequences growing together, where each tile is a separate short run.
constexpr int64_t kStepTokens = 64;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Parts each (query tile, KV head) task's tokens are split into (split-K)
// when there are too few tasks to keep every thread busy: the fewest that
// make the task count a multiple of the threads, or at least twice it. A
// decode step has one task per KV head, so SmolLM2's 3 KV heads on 2
// threads become 6 equal parts (3 each) instead of 3 tasks, one thread
// doing two of them while the other waits. Fewer than 2 * threads + base
// tasks result (AllocateRunState sizes the partial buffers for that).
// One softmax chunk of `count` tokens for every row of a task: row r (query
// r / group of the tile) sees the chunk's tokens before visible + r / group;
// the rest of its probabilities are zeroed, then the chunk is folded into
// the row's running max, sum and accumulator.
void SoftmaxChunk(int64_t rows, int64_t group, int64_t count, int64_t visible, float* probs,
                  int64_t stride, float* row_max, float* row_sum, float* acc, int64_t dim) {
  const bool masked = count > visible;
  for (int64_t r = 0; r < rows; ++r) {
    float* p = &probs[r * stride];
    int64_t valid = count;
    if (masked) {
      valid = std::clamp<int64_t>(visible + r / group, 0, count);
      std::fill(p + valid, p + count, 0.0f);
      if (valid == 0) continue;
    }
    OnlineSoftmaxStep(p, valid, &row_max[r], &row_sum[r], &acc[r * dim], dim);
  }
}

int64_t SplitsFor(int64_t base_tasks, int64_t threads, int64_t tokens) {
  if (threads <= 1 || base_tasks >= 2 * threads || base_tasks % threads == 0) return 1;
  int64_t splits = 1;
  while ((base_tasks * splits) % threads != 0 && base_tasks * splits < 2 * threads) ++splits;
  return std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, tokens / kMinTokensPerSplit));
}

}  // namespace

// Everything Attend and a decode step's Append use, sized once (larger
// prefills grow the append buffers the first time they occur).
Status PagedKvCache::AllocateRunState() {
  const int64_t dim = shape_.head_dim, group = shape_.num_heads / shape_.num_kv_heads;
  const int64_t bt = layout_.block_tokens;
  max_rows_ = std::max<int64_t>(1, kTargetRows / group) * group;
  const int64_t chunk = std::max<int64_t>(1, kChunkTokens / bt) * bt;
  size_t prepared_bytes = 0;
  for (const auto& codec : k_codecs_) {
    prepared_bytes = std::max(prepared_bytes, codec->PreparedQueryBytes(max_rows_));
  }
  const size_t rows = static_cast<size_t>(max_rows_);
  thread_scratch_.resize(static_cast<size_t>(pool_->size()));
  for (ThreadScratch& ts : thread_scratch_) {
    ts.q_rows.resize(rows * static_cast<size_t>(dim));
    ts.probs.resize(rows * static_cast<size_t>(chunk));
    ts.acc.resize(rows * static_cast<size_t>(dim));
    ts.row_max.resize(rows);
    ts.row_sum.resize(rows);
    ts.block.resize(static_cast<size_t>(ScratchFloats(max_rows_)));
    ts.prepared.resize(prepared_bytes);
  }
  // Split-K runs fewer than 4 * threads tasks (SplitsFor: base tasks < 2 * threads).
  const size_t part_rows = 4 * static_cast<size_t>(pool_->size()) * rows;
  part_max_.resize(part_rows);
  part_sum_.resize(part_rows);
  part_acc_.resize(part_rows * static_cast<size_t>(dim));
  // One decode step: a token per head, or a whole flush of a streaming codec.
  int64_t flush = 1;
  for (const auto* codecs : {&k_codecs_, &v_codecs_}) {
    for (const auto& codec : *codecs) flush = std::max(flush, codec->streaming().flush_tokens);
  }
  const size_t kv_rows = static_cast<size_t>(shape_.num_kv_heads);
  head_rows_.resize(static_cast<size_t>(flush * dim));
  matrix_row_.resize(static_cast<size_t>(dim));
  if (AnyRotation()) {
    rotated_q_.resize(static_cast<size_t>(shape_.num_heads * dim));
    rotated_k_.resize(kv_rows * static_cast<size_t>(dim));
    rotated_v_.resize(kv_rows * static_cast<size_t>(dim));
  }
  if (any_streaming_) {
    staging_scratch_.half.resize(kv_rows * f16_codec_->RowBytes());
    staging_scratch_.rounded.resize(kv_rows * static_cast<size_t>(dim));
    staging_scratch_.due.resize(static_cast<size_t>(flush) * kv_rows * static_cast<size_t>(dim));
  }
  return Status::Ok();
}

PagedKvCache::AttendPlan PagedKvCache::PlanAttend(const Sequence& s, int64_t layer,
                                                  int64_t n) const {
  const int64_t group = shape_.num_heads / shape_.num_kv_heads, bt = layout_.block_tokens;
  AttendPlan plan;
  plan.n = n;
  plan.total = s.lengths[static_cast<size_t>(layer)];
  plan.tile_queries = std::clamp<int64_t>(kTargetRows / group, 1, n);
  plan.num_tiles = (n + plan.tile_queries - 1) / plan.tile_queries;
  plan.base_tasks = plan.num_tiles * shape_.num_kv_heads;
  plan.splits = SplitsFor(plan.base_tasks, pool_->size(), plan.total);
  plan.num_tasks = plan.base_tasks * plan.splits;
  plan.max_rows = plan.tile_queries * group;
  plan.chunk_blocks = std::max<int64_t>(1, kChunkTokens / bt);
  plan.chunk = plan.chunk_blocks * bt;
  return plan;
}

void PagedKvCache::AttendTiles(const Sequence& s, int64_t layer, int64_t n, const float* q,
                               float scale, float* out) const {
  const AttendPlan plan = PlanAttend(s, layer, n);
  pool_->ForEach(plan.num_tasks, Schedule::kDynamic, [&](int64_t task, int thread) {
    AttendTask(s, layer, plan, task, q, scale, thread_scratch_[static_cast<size_t>(thread)], out);
  });
  if (plan.splits > 1) MergeSplits(plan, out);
}

void PagedKvCache::AttendTask(const Sequence& s, int64_t layer, const AttendPlan& plan,
                              int64_t task, const float* q, float scale, ThreadScratch& ts,
                              float* out) const {
  const int64_t dim = shape_.head_dim, heads = shape_.num_heads, kv_heads = shape_.num_kv_heads;
  const int64_t group = heads / kv_heads, bt = layout_.block_tokens;
  const int64_t n = plan.n, splits = plan.splits, chunk = plan.chunk;
  float* q_rows = ts.q_rows.data();    // [rows, dim]
  float* probs = ts.probs.data();      // [rows, chunk]
  float* acc = ts.acc.data();          // [rows, dim]
  float* row_max = ts.row_max.data();  // [rows]
  float* row_sum = ts.row_sum.data();  // [rows]
  float* scratch = ts.block.data();
  uint8_t* prepared = ts.prepared.data();
  const int64_t split = task % splits;
  const int64_t g = (task / splits) % kv_heads;
  // Later query tiles see more tokens: hand them out first.
  const int64_t tile = plan.num_tiles - 1 - task / (splits * kv_heads);
  const int64_t i0 = tile * plan.tile_queries, i1 = std::min(n, i0 + plan.tile_queries);
  const int64_t rows = (i1 - i0) * group;
  for (int64_t i = i0; i < i1; ++i) {
    std::memcpy(&q_rows[(i - i0) * group * dim], q + (i * heads + g * group) * dim,
                group * dim * sizeof(float));
  }
  k_codecs_[static_cast<size_t>(layer * kv_heads + g)]->PrepareQuery(q_rows, rows, prepared);
  // Query i sees tokens [0, total - n + i]; the tile's last query sees most.
  const int64_t first_visible = plan.total - n + i0 + 1;
  const int64_t visible_end = plan.total - n + i1;
  const int64_t num_blocks = (visible_end + bt - 1) / bt;
  const int64_t b0 = num_blocks * split / splits, b1 = num_blocks * (split + 1) / splits;
  std::fill_n(row_max, rows, kNegInf);
  std::fill_n(row_sum, rows, 0.0f);
  std::fill_n(acc, rows * dim, 0.0f);
  // A codec call reads the run of blocks [b, run_end(b, end)): up to a
  // step of physically consecutive blocks when FusesBlocks, else one.
  // Blocks holding sinks stay single: AccumulateV adds a sink's f16 row
  // after its block's encoded rows, and a longer run would move that term
  // later in the sum (the results would change in the last bits).
  const bool fuse = FusesBlocks(layer, g);
  const int64_t sink_blocks = SinkBlocks(layer, g);
  const int64_t step = std::max<int64_t>(1, kStepTokens / bt);
  const auto run_end = [&](int64_t b, int64_t end) {
    return fuse && b >= sink_blocks ? RunEnd(s, b, std::min(end, b + step)) : b + 1;
  };
  int64_t k_ahead = b0, v_ahead = b0;  // first blocks whose K / V are not prefetched
  for (; k_ahead < std::min(b1, b0 + step); ++k_ahead) PrefetchTile(s, layer, g, k_ahead, false);
  for (int64_t c0 = b0; c0 < b1; c0 += plan.chunk_blocks) {
    const int64_t c1 = std::min(b1, c0 + plan.chunk_blocks);
    const int64_t t_begin = c0 * bt, count = std::min(c1 * bt, visible_end) - t_begin;
    for (int64_t b = c0; b < c1;) {
      const int64_t e = run_end(b, c1), t0 = b * bt;
      for (; k_ahead < std::min(b1, e + step); ++k_ahead) PrefetchTile(s, layer, g, k_ahead, false);
      for (; v_ahead < e; ++v_ahead) PrefetchTile(s, layer, g, v_ahead, true);
      BlockScores(s, layer, g, t0, std::min(e * bt, visible_end) - t0, q_rows, prepared, rows,
                  scale, &probs[t0 - t_begin], chunk, scratch);
      b = e;
    }
    SoftmaxChunk(rows, group, count, first_visible - t_begin, probs, chunk, row_max, row_sum, acc,
                 dim);
    for (int64_t b = c0; b < c1;) {
      const int64_t e = run_end(b, c1), t0 = b * bt;
      BlockAccumulateV(s, layer, g, t0, std::min(e * bt, visible_end) - t0, &probs[t0 - t_begin],
                       rows, chunk, acc, scratch);
      b = e;
    }
  }
  if (splits == 1) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r / group, h = g * group + r % group;
      const float inv = 1.0f / row_sum[r];
      float* o = out + (i * heads + h) * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] = acc[r * dim + d] * inv;
    }
    return;
  }
  // Split-K partials, merged by MergeSplits (buffers sized in
  // AllocateRunState: fewer than 4 * threads tasks when there are splits).
  const int64_t max_rows = plan.max_rows;
  std::copy_n(row_max, rows, part_max_.data() + task * max_rows);
  std::copy_n(row_sum, rows, part_sum_.data() + task * max_rows);
  std::copy_n(acc, rows * dim, part_acc_.data() + task * max_rows * dim);
}

void PagedKvCache::MergeSplits(const AttendPlan& plan, float* out) const {
  const int64_t dim = shape_.head_dim, heads = shape_.num_heads, kv_heads = shape_.num_kv_heads;
  const int64_t group = heads / kv_heads, n = plan.n, splits = plan.splits;
  const int64_t tile_queries = plan.tile_queries, num_tiles = plan.num_tiles;
  const int64_t base_tasks = plan.base_tasks, max_rows = plan.max_rows;
  const float* part_max = part_max_.data();  // [tasks, max_rows]
  const float* part_sum = part_sum_.data();  // [tasks, max_rows]
  const float* part_acc = part_acc_.data();  // [tasks, max_rows, dim]
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

bool PagedKvCache::FusesBlocks(int64_t layer, int64_t head) const {
  const size_t instance = static_cast<size_t>(layer * shape_.num_kv_heads + head);
  const KvLayerLayout& l = layout_.layers[static_cast<size_t>(layer)];
  const size_t bt = static_cast<size_t>(layout_.block_tokens);
  // Residual windows only move where the encoded rows end and sinks lie in
  // the first blocks (ForEachKvSegment takes any range); pre-RoPE keys are
  // decoded a run at a time into scratch sized for it (ScratchFloats).
  // Detected sinks may sit anywhere: their heads read block by block.
  const auto runs = [](const KvStreaming& st) { return st.detect_sinks == 0; };
  return runs(k_codecs_[instance]->streaming()) && runs(v_codecs_[instance]->streaming()) &&
         l.k_tile_bytes == bt * l.k_row_bytes && l.v_tile_bytes == bt * l.v_row_bytes;
}

int64_t PagedKvCache::RunEnd(const Sequence& s, int64_t b, int64_t end) const {
  int64_t e = b + 1;
  while (e < end && s.blocks[static_cast<size_t>(e)] == s.blocks[static_cast<size_t>(e - 1)] + 1) {
    ++e;
  }
  return e;
}

void PagedKvCache::PrefetchTile(const Sequence& s, int64_t layer, int64_t head, int64_t b,
                                bool is_v) const {
  const KvLayerLayout& l = layout_.layers[static_cast<size_t>(layer)];
  const uint8_t* tile = Tile(s.blocks[static_cast<size_t>(b)], layer, head, is_v);
  const size_t bytes = is_v ? l.v_tile_bytes : l.k_tile_bytes;
  for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch(tile + i);
}

int64_t PagedKvCache::SinkBlocks(int64_t layer, int64_t head) const {
  const size_t instance = static_cast<size_t>(layer * shape_.num_kv_heads + head);
  const int64_t sinks = std::max(k_codecs_[instance]->streaming().sink_tokens,
                                 v_codecs_[instance]->streaming().sink_tokens);
  return (sinks + layout_.block_tokens - 1) / layout_.block_tokens;
}

// A run's rows: its pre-RoPE keys decoded ([tokens, head_dim]), or its V
// weights with the sinks' zeroed ([rows, tokens]).
int64_t PagedKvCache::ScratchFloats(int64_t rows) const {
  if (!any_streaming_) return 0;
  const int64_t bt = layout_.block_tokens;
  const int64_t tokens = std::max<int64_t>(1, kStepTokens / bt) * bt;
  return std::max(tokens * shape_.head_dim, rows * tokens);
}

void PagedKvCache::BlockScores(const Sequence& s, int64_t layer, int64_t head, int64_t t0,
                               int64_t count, const float* q, const uint8_t* prepared, int64_t rows,
                               float scale, float* scores, int64_t stride, float* scratch) const {
  const KvCodec& codec = *k_codecs_[static_cast<size_t>(layer * shape_.num_kv_heads + head)];
  const KvStreaming& st = codec.streaming();
  const uint8_t* tile =
      Tile(s.blocks[static_cast<size_t>(t0 / layout_.block_tokens)], layer, head, false);
  if (st.Plain()) {
    return codec.ScoresPrepared(tile, count, q, prepared, rows, scale, scores, stride);
  }
  // The sinks come last: their f16 scores replace the encoded ones.
  const KvStaging& staging = StagingOf(s, layer, /*is_v=*/false);
  ForEachKvSegment(
      st, staging, head, f16_codec_->RowBytes(), tile, t0, count, [&](const KvSegment& seg) {
        const KvCodec& rows_codec = seg.kind == KvSegment::kEncoded ? codec : *f16_codec_;
        float* out = scores + (seg.first - t0);
        if (!st.pre_rope) {
          if (seg.kind == KvSegment::kEncoded) {
            return codec.ScoresPrepared(seg.rows, seg.count, q, prepared, rows, scale, out, stride);
          }
          return rows_codec.Scores(seg.rows, seg.count, q, rows, scale, out, stride);
        }
        // K was stored before RoPE: rotate the decoded rows to their positions.
        rows_codec.Decode(seg.rows, seg.count, scratch);  // [count, dim]
        rope_table_->Apply(seg.first, seg.count, scratch);
        f32_codec_->Scores(reinterpret_cast<const uint8_t*>(scratch), seg.count, q, rows, scale,
                           out, stride);
      });
  if (st.detect_sinks > 0) {
    DetectedScores(staging, st, head, t0, count, q, rows, scale, scores, stride, scratch);
  }
}

void PagedKvCache::BlockAccumulateV(const Sequence& s, int64_t layer, int64_t head, int64_t t0,
                                    int64_t count, const float* p, int64_t rows, int64_t stride,
                                    float* acc, float* scratch) const {
  const KvCodec& codec = *v_codecs_[static_cast<size_t>(layer * shape_.num_kv_heads + head)];
  const KvStreaming& st = codec.streaming();
  const uint8_t* tile =
      Tile(s.blocks[static_cast<size_t>(t0 / layout_.block_tokens)], layer, head, true);
  if (st.Plain()) return codec.AccumulateV(tile, count, p, rows, stride, acc);
  const KvStaging& staging = StagingOf(s, layer, /*is_v=*/true);
  ForEachKvSegment(
      st, staging, head, f16_codec_->RowBytes(), tile, t0, count, [&](const KvSegment& seg) {
        const float* weights = p + (seg.first - t0);
        if (seg.kind != KvSegment::kEncoded) {
          return f16_codec_->AccumulateV(seg.rows, seg.count, weights, rows, stride, acc);
        }
        bool detected = false;
        for (int64_t t : staging.detected) {
          detected = detected || (t >= seg.first && t < seg.first + seg.count &&
                                  staging.DetectedSlot(t, st.sink_tokens) >= 0);
        }
        if (seg.shadowed == 0 && !detected) {
          return codec.AccumulateV(seg.rows, seg.count, weights, rows, stride, acc);
        }
        // Sinks (and detected sinks) are read from their f16 rows: weight 0 here.
        const int64_t n = seg.count;
        for (int64_t r = 0; r < rows; ++r) {
          std::copy_n(weights + r * stride, n, scratch + r * n);
          std::fill_n(scratch + r * n, seg.shadowed, 0.0f);
          for (int64_t t : staging.detected) {
            if (t >= seg.first && t < seg.first + n && staging.DetectedSlot(t, st.sink_tokens) >= 0)
              scratch[r * n + t - seg.first] = 0.0f;
          }
        }
        codec.AccumulateV(seg.rows, n, scratch, rows, n, acc);
      });
  if (st.detect_sinks > 0) DetectedValues(staging, st, head, t0, count, p, rows, stride, acc);
}

}  // namespace kvq
