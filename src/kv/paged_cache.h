// The paged KV cache (vLLM's PagedAttention idea over kvq's codecs): one
// BlockAllocator arena, a block table per sequence, copy-on-write forks, and
// attention computed straight from the encoded blocks (Scores on K tiles,
// AccumulateV on V tiles, online softmax) without an f32 copy of the cache.
// The byte layout of a block is KvLayout's (kv_factory.h).
//
// Streaming codecs (KvStreaming, codec.h) add per-sequence f16 staging: a
// ring of the newest unencoded tokens (KIVI's residual) and the first
// `sink_tokens` tokens, kept by kv/streaming.h, whose segment iterator says
// where each token lives (sinks, encoded blocks, ring). Every token still has
// its slot in a block (written when it is encoded), so block accounting is
// unchanged.
//
// Prefix caching (KvCache's interface; kv/prefix_index.h, definitions in
// paged_cache_prefix.cc): full blocks are published under their chain hash
// and retained by the allocator, so a new sequence can start from a cached
// run of blocks and idle cached blocks are evicted least recently used. A
// retained block is never written in place: like a shared one, it is copied
// on the first write. Only caches without per-sequence f16 staging share
// prefixes (PrefixCachingUnsupported says why).
//
// Run state is allocated once: per-thread attention scratch when the cache
// is made, encode and staging buffers grown to the largest append seen, so
// decoding a token allocates nothing. Attend is therefore not reentrant (one
// forward pass at a time per cache, as everywhere in kvq).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "kv/block_allocator.h"
#include "kv/codec.h"
#include "kv/kv_cache.h"
#include "kv/kv_factory.h"
#include "kv/prefix_index.h"
#include "kv/streaming.h"

namespace kvq {

class PagedKvCache final : public KvCache {
 public:
  static StatusOr<std::unique_ptr<PagedKvCache>> Create(const KvShape& shape,
                                                        const KvCacheOptions& options);

  Status AddSequence(SeqId seq) override;
  void ReleaseSequence(SeqId seq) override;
  Status Fork(SeqId src, SeqId dst) override;
  Status Truncate(SeqId seq, int64_t length) override;
  int64_t Length(SeqId seq, int64_t layer) const override;
  int64_t Capacity(SeqId seq) const override;
  Status Append(SeqId seq, int64_t layer, int64_t n, const float* k_pre_rope, const float* k,
                const float* v) override;
  Status Attend(SeqId seq, int64_t layer, int64_t n, const float* q, float scale,
                float* out) const override;
  size_t BytesUsed() const override;
  KvUsage Usage() const override;
  const char* TypeName() const override { return type_name_.c_str(); }
  std::string PrefixCachingUnsupported() const override;
  std::string BatchInvarianceUnsupported() const override;
  Status SetPrefixCaching(bool enabled) override;
  KvPrefixHit FindCachedPrefix(std::span<const int32_t> tokens, int64_t max_tokens) const override;
  Status AddSequenceWithPrefix(SeqId seq, std::span<const int32_t> tokens, int64_t reuse) override;
  void CacheFullBlocks(SeqId seq, std::span<const int32_t> tokens) override;

  const KvLayout& layout() const { return layout_; }
  const BlockAllocator& allocator() const { return *allocator_; }
  // The block table of `seq` (empty if unknown): for tests of sharing.
  std::vector<BlockId> BlockTable(SeqId seq) const;

  // The detected sinks (-aN) of `seq` in `layer` (K side), heaviest first:
  // token positions and the attention mass measured for them.
  std::vector<std::pair<int64_t, float>> DetectedSinks(SeqId seq, int64_t layer) const;

  // Decodes what `seq` stores in `layer` through each codec's Decode (the
  // scalar truth), in the stored domain (rotated when options.rotate or the
  // codec rotates, KvCodec::RotationBlock).
  // k, v: [Length(seq, layer), num_kv_heads, head_dim]. For tests and studies.
  Status DecodeLayer(SeqId seq, int64_t layer, float* k, float* v) const;

 private:
  struct Sequence {
    std::vector<BlockId> blocks;                  // logical block j -> physical block
    std::vector<int64_t> lengths;                 // [num_layers] tokens stored per layer
    std::vector<BlockId> staging_charge;          // blocks charged for the staging below
    std::vector<KvStaging> k_staging, v_staging;  // [num_layers] (kv/streaming.h)
    // Chain hashes of the leading full blocks (published, found in the
    // prefix index, or duplicates of published ones): prefix caching only.
    std::vector<uint64_t> block_hashes;
  };

  PagedKvCache(const KvShape& shape, const KvCacheOptions& options, const KvLayout& layout);
  // Makes blocks [first, last] of `s` exclusive (copying shared ones) and
  // allocates missing blocks up to `last`. Checks the budget first, so a
  // failure changes nothing.
  Status PrepareWrite(Sequence& s, int64_t first_block, int64_t last_block);
  int64_t MaxBlocksPerSequence() const {
    return (options_.max_tokens + layout_.block_tokens - 1) / layout_.block_tokens;
  }
  // The K (is_v false) or V tile of (layer, KV head) in `block`: one slot
  // each (BlockAllocator::BlockSlot), so one head's tiles of consecutive
  // blocks are adjacent in memory.
  const uint8_t* Tile(BlockId block, int64_t layer, int64_t head, bool is_v) const {
    const KvLayerLayout& l = layout_.layers[static_cast<size_t>(layer)];
    return is_v ? allocator_->BlockSlot(block, layout_.VTileOffset(layer, head), l.v_tile_bytes)
                : allocator_->BlockSlot(block, layout_.KTileOffset(layer, head), l.k_tile_bytes);
  }
  uint8_t* MutableTile(BlockId block, int64_t layer, int64_t head, bool is_v) {
    return const_cast<uint8_t*>(std::as_const(*this).Tile(block, layer, head, is_v));
  }
  // Copies every tile of block `src` into block `dst`.
  void CopyBlock(BlockId src, BlockId dst);
  // Whether writing into `block` must copy it first (shared, or retained by
  // the prefix cache).
  bool MustCopy(BlockId block) const {
    return allocator_->RefCount(block) > 1 || allocator_->IsRetained(block);
  }
  // Walks the cached full blocks of `tokens` from the start (at most
  // max_blocks): fn(block index, hash, block) for each; returns how many.
  template <class F>
  int64_t WalkCachedBlocks(std::span<const int32_t> tokens, int64_t max_blocks, const F& fn) const;
  // Free blocks this sequence can still fill, counting the copy a shared
  // partial last block would need.
  int64_t TokensThatFit(const Sequence& s) const;
  // Encodes x [n, num_kv_heads, head_dim] (stored domain: rotated if
  // options.rotate) into tokens [start, start + n) of the K (is_v = false) or
  // V tiles of `layer`.
  void EncodeRows(Sequence& s, int64_t layer, bool is_v, int64_t start, int64_t n, const float* x);
  // Appends x [n, num_kv_heads, head_dim] (stored domain) at token `start`
  // through the layer's streaming rule: staging, then encoding what is due.
  void AppendStreaming(Sequence& s, int64_t layer, bool is_v, int64_t start, int64_t n,
                       const float* x);
  const KvStreaming& Streaming(int64_t layer, bool is_v) const;
  KvStaging& StagingOf(Sequence& s, int64_t layer, bool is_v) const;
  const KvStaging& StagingOf(const Sequence& s, int64_t layer, bool is_v) const;
  // Charges the staging blocks of a new sequence (or errors, changing nothing).
  Status ChargeStaging(Sequence& s);
  // One Attend's work: query tiles x KV heads x split-K parts, each a task.
  struct AttendPlan {
    int64_t n = 0, total = 0;  // queries; tokens the layer holds
    int64_t tile_queries = 0, num_tiles = 0;
    int64_t base_tasks = 0, splits = 1, num_tasks = 0;  // base = tiles x KV heads
    int64_t max_rows = 0;                               // query rows of a task, at most
    int64_t chunk_blocks = 0, chunk = 0;                // blocks / tokens per softmax step
  };
  struct ThreadScratch;
  AttendPlan PlanAttend(const Sequence& s, int64_t layer, int64_t n) const;
  void AttendTiles(const Sequence& s, int64_t layer, int64_t n, const float* q, float scale,
                   float* out) const;
  // One task: its rows' attention, written to out (no splits) or to the
  // split-K partials.
  void AttendTask(const Sequence& s, int64_t layer, const AttendPlan& plan, int64_t task,
                  const float* q, float scale, ThreadScratch& ts, float* out) const;
  // out := the exact merge of the split-K partials.
  void MergeSplits(const AttendPlan& plan, float* out) const;
  // scores[r * stride + t - t0] for tokens [t0, t0 + count) of one block and
  // KV head, from wherever each token lives (block, sinks, ring).
  // prepared: q after the K codec's PrepareQuery (KvCodec::ScoresPrepared).
  void BlockScores(const Sequence& s, int64_t layer, int64_t head, int64_t t0, int64_t count,
                   const float* q, const uint8_t* prepared, int64_t rows, float scale,
                   float* scores, int64_t stride, float* scratch) const;
  void BlockAccumulateV(const Sequence& s, int64_t layer, int64_t head, int64_t t0, int64_t count,
                        const float* p, int64_t rows, int64_t stride, float* acc,
                        float* scratch) const;
  // Whether consecutive blocks' tiles of (layer, KV head) can be read by
  // one codec call, as one run of rows: codecs without detected sinks on
  // both sides whose tiles hold block_tokens rows with no padding.
  bool FusesBlocks(int64_t layer, int64_t head) const;
  // Leading blocks of (layer, KV head) that hold sink tokens (-sN): each is
  // read on its own even when FusesBlocks.
  int64_t SinkBlocks(int64_t layer, int64_t head) const;
  // The end of the run of s's blocks from b (before `end`) whose physical
  // blocks are consecutive, so that each head's tiles form one run of rows.
  int64_t RunEnd(const Sequence& s, int64_t b, int64_t end) const;
  // Asks the CPU to start loading every line of block b's K (is_v false) or
  // V tile of (layer, head).
  void PrefetchTile(const Sequence& s, int64_t layer, int64_t head, int64_t b, bool is_v) const;
  // Floats of per-task scratch BlockScores / BlockAccumulateV need.
  int64_t ScratchFloats(int64_t rows) const;
  // -aN (detected sinks; paged_cache_sinks.cc). Ranks the tokens of the
  // prefill chunk just appended to `layer` by the attention mass they draw
  // from a sample of its queries (q: stored domain) and keeps the top ones'
  // f16 rows in the sequence's staging. Attend is const in the KvCache
  // interface; this is the one sequence state it writes.
  void DetectSinks(Sequence& s, int64_t layer, int64_t n, const float* q, float scale) const;
  // Whether the last Append was the prefill chunk of (seq, layer) that an
  // Attend of n queries now reads.
  bool DetectionDue(SeqId seq, int64_t layer, int64_t n, int64_t stored) const;
  // For detected sinks in tokens [t0, t0 + count) of one block that live in
  // the blocks: rewrites their scores from the f16 rows, or adds their f16 V
  // rows (their encoded rows' weight was zeroed), or overwrites decoded rows.
  void DetectedScores(const KvStaging& staging, const KvStreaming& st, int64_t head, int64_t t0,
                      int64_t count, const float* q, int64_t rows, float scale, float* scores,
                      int64_t stride, float* scratch) const;
  void DetectedValues(const KvStaging& staging, const KvStreaming& st, int64_t head, int64_t t0,
                      int64_t count, const float* p, int64_t rows, int64_t stride,
                      float* acc) const;
  void DetectedRows(const KvStaging& staging, const KvStreaming& st, int64_t head, int64_t t0,
                    int64_t count, float* x) const;
  // Decodes tokens [t0, t0 + count) of one (layer, K/V, head) into x [count,
  // head_dim], in the stored domain (before RoPE for pre-RoPE K).
  void DecodeTokens(const Sequence& s, int64_t layer, bool is_v, int64_t head, int64_t t0,
                    int64_t count, float* x) const;

  KvShape shape_;
  KvCacheOptions options_;
  KvLayout layout_;
  std::unique_ptr<ThreadPool> own_pool_;  // when options.pool was null
  ThreadPool* pool_;                      // runs Attend's tasks
  std::string type_name_;
  std::unique_ptr<BlockAllocator> allocator_;
  // One codec instance per (layer, KV head): index layer * num_kv_heads + head.
  std::vector<std::unique_ptr<KvCodec>> k_codecs_, v_codecs_;
  std::unique_ptr<KvCodec> f16_codec_, f32_codec_;  // staging rows; RoPE'd decoded rows
  bool any_streaming_ = false;
  bool AnyRotation() const;
  // cos/sin for every position, when some layer keeps K before RoPE.
  std::optional<ops::RopeTable> rope_table_;
  std::vector<char> k_calibrated_, v_calibrated_;
  // Per layer: llama.cpp's rotation block of its K / V codecs (0 = none;
  // KvCodec::RotationBlock), applied after --kv-rotate's R.
  std::vector<int64_t> k_rotation_, v_rotation_;
  // Per (layer, KV head) instance: the codecs' dense rotations
  // (KvCodec::RotationMatrix, nullptr = none), applied after the above;
  // per layer whether any of its K or V codecs has one.
  std::vector<const float*> k_matrix_, v_matrix_;
  std::vector<char> layer_matrix_;
  // Rotates rows [rows, head_dim] of x in place by the instances' matrices
  // (head of row r: r % row_heads / heads_per_matrix), Mᵀ when transpose.
  void ApplyMatrices(const std::vector<const float*>& matrices, int64_t layer, bool transpose,
                     float* x, int64_t rows, int64_t row_heads, int64_t heads_per_matrix) const;
  std::map<SeqId, Sequence> sequences_;
  std::unique_ptr<KvPrefixIndex> prefix_;  // null while prefix caching is off

  // Attention scratch of one pool thread (sized in Create for the largest
  // task: max_rows query rows, a softmax chunk, the codecs' prepared query).
  struct ThreadScratch {
    std::vector<float> q_rows, probs, acc, row_max, row_sum, block;
    std::vector<uint8_t> prepared;
  };
  Status AllocateRunState();
  // Makes every layer's K and V codec per head (loading the calibration file
  // for the first that needs it), their rotations, and the cache's type name.
  Status MakeCodecs();
  int64_t max_rows_ = 0;                               // query rows per task, at most
  mutable std::vector<ThreadScratch> thread_scratch_;  // [pool_->size()]
  // Split-K partials: [tasks, max_rows], same, [tasks, max_rows, head_dim].
  mutable std::vector<float> part_max_, part_sum_, part_acc_;
  mutable std::vector<float> rotated_q_;    // q rotated (R, llama.cpp's), grown to the largest n
  mutable std::vector<double> matrix_row_;  // [head_dim] ApplyMatrices' one-row scratch
  std::vector<float> head_rows_;            // EncodeRows: one KV head's rows
  std::vector<float> rotated_k_, rotated_v_;
  KvStagingScratch staging_scratch_;
  // -aN: the stored-domain K and V rows [n, kv_heads, head_dim] of the last
  // prefill Append (n > 1) and where they went; grown to the largest prefill.
  bool any_detect_ = false;
  bool last_valid_ = false;
  SeqId last_seq_ = 0;
  int64_t last_layer_ = 0, last_start_ = 0, last_n_ = 0;
  std::vector<float> last_k_, last_v_;
  mutable std::vector<float> detect_keys_;   // [total, head_dim]: one KV head's keys
  mutable std::vector<double> detect_mass_;  // [n] mass drawn by each token of the chunk
  mutable std::vector<double> detect_p_;     // [total] one query row's probabilities

  Sequence* Find(SeqId seq);
  const Sequence* Find(SeqId seq) const;
};

}  // namespace kvq
