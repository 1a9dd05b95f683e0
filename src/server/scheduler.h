// Iteration-level continuous batching (Orca / vLLM style) over a paged KV
// cache. Each Step() is one Transformer::Forward over every running
// sequence: sequences that are decoding contribute their one new token, and
// sequences still prefilling contribute a chunk of their prompt, so a long
// prompt never stalls the running decodes for more than one chunk.
//
// Memory: a request is admitted only when the free KV blocks cover its whole
// prompt after the blocks already promised to running prefills. When a
// decode step needs a block and none is free, the newest running sequence is
// preempted: its blocks are released and it goes back to the front of the
// waiting queue to be recomputed (prompt + what it generated so far) later.
// Its output stream is not interrupted; the client only sees a pause.
//
// Prefix caching (vLLM's automatic prefix caching, on by default where the
// cache supports it: KvCache::PrefixCachingUnsupported): after every step
// the full blocks a sequence computed are offered to the cache under the
// chain hash of their tokens, and a request starts from the longest run of
// cached blocks of its prompt (at most all but its last token, whose logits
// are needed), prefilling only the rest. A partly used last block is copied
// on the first write. Admission counts only the blocks a request really
// needs: new blocks, that copy, and cached blocks it revives (idle cached
// blocks count as free until then, and are evicted least recently used).
// A preempted sequence is usually recomputed from its own cached blocks.
//
// Pure logic on the calling thread: no locks, no HTTP. The engine loop
// (engine_loop.h) owns the thread that calls it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "kv/kv_cache.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "server/request.h"

namespace kvq {

using Clock = std::chrono::steady_clock;

struct SchedulerOptions {
  int64_t max_num_seqs = 16;             // sequences in one batch at most
  int64_t max_num_batched_tokens = 512;  // tokens in one Forward (decodes + prefill chunks)
  int64_t max_model_len = 0;             // prompt + generated tokens per sequence; required
  int64_t block_tokens = 16;             // the cache's tokens per block
  // Share cached prompt prefixes (see above). Create turns it off, saying
  // why in prefix_caching_note(), when the cache cannot share exactly.
  bool enable_prefix_caching = true;
  // Batch-invariant serving (vLLM's VLLM_BATCH_INVARIANT, SGLang's
  // deterministic inference): a request's output, logprobs included, does
  // not depend on what else is running, arrives, or was cached. Each
  // sequence's rows are multiplied as that sequence alone would multiply
  // them (BatchArith::kInvariant: its prompt chunk as one matrix, decode
  // rows each as alone); a prompt is cut at fixed positions, multiples of
  // prefill_chunk, whatever the step's budget (a chunk that does not fit
  // waits); a sequence resumes from cached blocks only where its own chunks
  // end; and the tokens a preempted sequence had generated are recomputed
  // one per step, as they were first computed. Chunk positions matter twice:
  // a chunk's length picks its product's kernel (the packed GEMM from 32
  // rows), and caches with f16 windows (KIVI, GEAR, KVQuant) show a query
  // the window as it is after its whole chunk. Cost: decode rows that would
  // have shared the packed GEMM, and chunks that wait (docs/benchmarks.md,
  // "kvq serve --batch-invariant").
  bool batch_invariant = false;
  // With batch_invariant: at most max_num_batched_tokens - max_num_seqs.
  int64_t prefill_chunk = kDefaultPrefillChunk;
};

// What one step did, for metrics.
struct StepReport {
  int64_t batch_sequences = 0;
  int64_t prompt_tokens = 0;     // prompt (or recomputed) tokens run through the model
  int64_t generated_tokens = 0;  // tokens sampled
  int64_t preemptions = 0;
  int64_t finished = 0;
  // Prefix caching, at admission (vLLM's prefix_cache_queries / _hits):
  // prompt tokens looked up, and those found cached (not computed).
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  std::vector<std::string> finish_reasons;  // one per request that ended this step
  std::vector<double> time_to_first_token;  // seconds, one per first token this step
  std::vector<double> inter_token_latency;  // seconds, one per later token this step
};

class Scheduler {
 public:
  // The cache must be paged (Usage().blocks_total > 0) and empty; all three
  // must outlive the scheduler.
  static StatusOr<std::unique_ptr<Scheduler>> Create(Transformer& model, const Tokenizer& tokenizer,
                                                     KvCache& cache,
                                                     const SchedulerOptions& options);

  // Why `request` can never run here (too long for --max-model-len or for
  // the whole cache), or Ok. Add() assumes it returned Ok. Reads only
  // constants, so HTTP threads may call it while the engine thread steps.
  Status Validate(const ServeRequest& request) const;
  // The most tokens a prompt of `prompt_tokens` can be given (context and
  // whole-cache limits); may be < 1. Constant data only, like Validate.
  int64_t MaxNewTokens(int64_t prompt_tokens) const;
  // Queues a validated request; its output goes to `channel`.
  void Add(ServeRequest request, std::shared_ptr<RequestChannel> channel,
           Clock::time_point arrival);

  bool HasWork() const { return !running_.empty() || !waiting_.empty(); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  const SchedulerOptions& options() const { return options_; }
  bool prefix_caching() const { return options_.enable_prefix_caching; }
  // Why prefix caching was asked for but is off ("" otherwise).
  const std::string& prefix_caching_note() const { return prefix_caching_note_; }

  // Drops cancelled requests, admits waiting ones, runs one Forward. An
  // error from the model fails the requests of that batch (their channels
  // get an "error" final event); the scheduler stays usable.
  Status Step(StepReport* report);

  // Ends every request with `reason` (e.g. "cancelled" at shutdown) and
  // releases its blocks.
  // Returns how many requests ended.
  int64_t FinishAll(const std::string& reason);

 private:
  struct Sequence {
    int64_t order = 0;  // arrival order: lower runs first, higher is preempted first
    SeqId seq = 0;
    ServeRequest request;
    std::shared_ptr<RequestChannel> channel;
    std::unique_ptr<Sampler> sampler;
    std::vector<int32_t> tokens;  // prompt + generated
    int64_t computed = 0;         // tokens of `tokens` stored in the cache
    int64_t generated = 0;
    // 1 while the next write lands in a cached block that must be copied
    // first (a prefix reused up to the middle of a block).
    int64_t cow_blocks = 0;
    std::string held;  // decoded text not yet sent (incomplete UTF-8 or a possible stop prefix)
    std::vector<TokenLogprob> logprobs;  // sampled since the last event (request.logprobs >= 0)
    size_t max_stop_bytes = 0;
    Clock::time_point arrival, last_token;
    bool in_cache = false;
  };

  Scheduler(Transformer& model, const Tokenizer& tokenizer, KvCache& cache,
            const SchedulerOptions& options);
  int64_t BlocksFor(int64_t tokens) const {
    return (tokens + options_.block_tokens - 1) / options_.block_tokens;
  }
  int64_t FreeBlocks() const;
  // Blocks a running sequence still needs for what it must compute.
  int64_t PendingBlocks(const Sequence& s) const {
    return BlocksFor(static_cast<int64_t>(s.tokens.size())) - BlocksFor(s.computed) + s.cow_blocks;
  }
  // One step's batch: a row per sequence that computes tokens this step.
  struct BatchPlan {
    std::vector<BatchSequence> batch;  // [rows] sequence id and its tokens
    std::vector<Sequence*> rows;       // [rows] the sequence each row belongs to
    std::vector<bool> samples;         // [rows] logits complete the pending tokens: sample
  };
  Status StepBatch(StepReport* report);
  // Preempts the newest sequences until every decode's next block fits, then
  // fills the token budget: decodes first, then prefill chunks, oldest first.
  BatchPlan PlanBatch(StepReport* report);
  // With batch invariance, the tokens `s` computes in its next prefill row:
  // up to the next multiple of prefill_chunk within the prompt, then one.
  int64_t InvariantChunk(const Sequence& s) const;
  // With batch invariance, the last chunk end of `s` at or before `cached`
  // tokens: where a sequence may resume from cached blocks.
  int64_t InvariantResumePoint(const Sequence& s, int64_t cached) const;
  // Erases these sequences from running_ (they are finished).
  void RemoveRunning(const std::vector<Sequence*>& ended);
  void DropCancelled();
  void Admit();
  void Preempt(size_t running_index, StepReport* report);
  // Samples from `logits`, streams text; returns true when the request ended.
  bool AcceptToken(Sequence& s, const float* logits, StepReport* report);
  void Finish(Sequence& s, const std::string& reason, const std::string& error = "");

  Transformer& model_;
  const Tokenizer& tokenizer_;
  KvCache& cache_;
  SchedulerOptions options_;
  int64_t vocab_ = 0;
  int64_t blocks_total_ = 0;
  int64_t sequence_blocks_ = 0;    // charged by the cache at AddSequence (residual windows)
  std::vector<int32_t> stop_ids_;  // EOS and end-of-turn markers
  int64_t next_order_ = 0;
  std::vector<std::unique_ptr<Sequence>> running_;  // ascending order
  std::deque<std::unique_ptr<Sequence>> waiting_;   // ascending order
  std::vector<std::string> finish_log_;             // reasons since the last Step
  std::vector<float> logits_;                       // [batch, vocab]
  std::string prefix_caching_note_;
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;  // since the last Step
};

}  // namespace kvq
