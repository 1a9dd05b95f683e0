#include "server/scheduler.h"

#include <algorithm>
#include <span>

#include "engine/generate.h"

namespace kvq {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

Scheduler::Scheduler(Transformer& model, const Tokenizer& tokenizer, KvCache& cache,
                     const SchedulerOptions& options)
    : model_(model), tokenizer_(tokenizer), cache_(cache), options_(options) {
  vocab_ = model.config().vocab_size;
  const KvUsage usage = cache.Usage();
  blocks_total_ = usage.blocks_total;
  sequence_blocks_ = usage.sequence_blocks;
  // The cache's block size wins: schemes round the requested one up.
  if (usage.block_tokens > 0) options_.block_tokens = usage.block_tokens;
  // The same end markers `kvq generate` stops at, so greedy outputs agree.
  if (tokenizer.eos_id() >= 0) stop_ids_.push_back(tokenizer.eos_id());
  for (const char* marker : {"<|im_end|>", "<|eot_id|>", "<|endoftext|>"}) {
    const int32_t id = tokenizer.PieceToId(marker);
    if (id >= 0) stop_ids_.push_back(id);
  }
}

StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(Transformer& model,
                                                       const Tokenizer& tokenizer, KvCache& cache,
                                                       const SchedulerOptions& options) {
  if (cache.Usage().blocks_total <= 0) {
    return Status::Error("the scheduler needs a paged KV cache (blocks_total is 0)");
  }
  if (options.max_num_seqs < 1 || options.max_num_batched_tokens < 1 || options.max_model_len < 1 ||
      options.block_tokens < 1) {
    return Status::Error(
        "scheduler: max_num_seqs, max_num_batched_tokens, max_model_len and block_tokens must be "
        "positive");
  }
  // A whole chunk must fit beside a full batch of decodes, or a prompt
  // could wait for ever.
  if (options.batch_invariant &&
      (options.prefill_chunk < 1 ||
       options.prefill_chunk > options.max_num_batched_tokens - options.max_num_seqs)) {
    return Status::Error("scheduler: with batch invariance the prefill chunk (" +
                         std::to_string(options.prefill_chunk) +
                         ") must be at least 1 and at most max_num_batched_tokens - "
                         "max_num_seqs (" +
                         std::to_string(options.max_num_batched_tokens - options.max_num_seqs) +
                         ")");
  }
  if (options.batch_invariant) {
    const std::string why = cache.BatchInvarianceUnsupported();
    if (!why.empty()) return Status::Error("batch invariance: " + why);
  }
  auto scheduler = std::unique_ptr<Scheduler>(new Scheduler(model, tokenizer, cache, options));
  if (options.enable_prefix_caching) {
    const Status on = cache.SetPrefixCaching(true);
    if (!on.ok()) {
      scheduler->options_.enable_prefix_caching = false;
      scheduler->prefix_caching_note_ = on.message();
    }
  } else {
    KVQ_RETURN_IF_ERROR(cache.SetPrefixCaching(false));
  }
  return scheduler;
}

Status Scheduler::Validate(const ServeRequest& request) const {
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  if (prompt == 0) return Status::Error("the prompt is empty");
  if (request.max_tokens < 1) return Status::Error("max_tokens must be at least 1");
  // Like vLLM: the context must hold the prompt and every requested token.
  if (request.max_tokens > options_.max_model_len - prompt) {
    return Status::Error(
        "This model's maximum context length is " + std::to_string(options_.max_model_len) +
        " tokens. However, you requested " + std::to_string(prompt + request.max_tokens) +
        " tokens (" + std::to_string(prompt) + " in the prompt, " +
        std::to_string(request.max_tokens) + " for the completion).");
  }
  // A request that alone outgrows the cache could never finish: preempting
  // others would not help it.
  if (request.logprobs > vocab_) {
    return Status::Error("logprobs asks for " + std::to_string(request.logprobs) +
                         " alternatives; the vocabulary has " + std::to_string(vocab_) + " tokens");
  }
  const int64_t blocks = BlocksFor(prompt + request.max_tokens) + sequence_blocks_;
  const int64_t total = blocks_total_;
  if (blocks > total) {
    return Status::Error("the request needs " + std::to_string(blocks) +
                         " KV cache blocks (prompt + max_tokens), more than the " +
                         std::to_string(total) + " the cache holds (--kv-memory)");
  }
  return Status::Ok();
}

int64_t Scheduler::MaxNewTokens(int64_t prompt_tokens) const {
  return std::min(options_.max_model_len,
                  (blocks_total_ - sequence_blocks_) * options_.block_tokens) -
         prompt_tokens;
}

void Scheduler::Add(ServeRequest request, std::shared_ptr<RequestChannel> channel,
                    Clock::time_point arrival) {
  auto s = std::make_unique<Sequence>();
  s->order = next_order_++;
  s->seq = static_cast<SeqId>(s->order & 0x7fffffff);
  s->tokens = request.prompt;
  s->sampler = std::make_unique<Sampler>(request.sampling);
  for (const std::string& stop : request.stop)
    s->max_stop_bytes = std::max(s->max_stop_bytes, stop.size());
  s->request = std::move(request);
  s->channel = std::move(channel);
  s->arrival = arrival;
  waiting_.push_back(std::move(s));
}

int64_t Scheduler::FreeBlocks() const {
  const KvUsage usage = cache_.Usage();
  return usage.blocks_total - usage.blocks_used;
}

void Scheduler::Finish(Sequence& s, const std::string& reason, const std::string& error) {
  if (s.in_cache) cache_.ReleaseSequence(s.seq);
  s.in_cache = false;
  RequestEvent event;
  event.final = true;
  event.finish_reason = reason;
  event.error = error;
  // What is held back is text, not a stop string: it belongs to the output
  // unless the request failed.
  if (reason == "length" || reason == "stop") event.text = std::move(s.held);
  s.held.clear();
  event.prompt_tokens = static_cast<int64_t>(s.request.prompt.size());
  event.completion_tokens = s.generated;
  event.logprobs = std::move(s.logprobs);
  s.logprobs.clear();
  s.channel->Push(std::move(event));
  finish_log_.push_back(reason);
}

void Scheduler::DropCancelled() {
  auto cancelled = [this](std::unique_ptr<Sequence>& s) {
    if (!s->channel->cancelled()) return false;
    Finish(*s, "cancelled");
    return true;
  };
  running_.erase(std::remove_if(running_.begin(), running_.end(), cancelled), running_.end());
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), cancelled), waiting_.end());
}

void Scheduler::Admit() {
  // Blocks already promised: what running sequences still have to compute.
  int64_t promised = 0;
  for (const auto& s : running_) promised += PendingBlocks(*s);
  const int64_t bt = options_.block_tokens;
  while (!waiting_.empty() && num_running() < options_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    const int64_t size = static_cast<int64_t>(s.tokens.size());
    // The last token always runs: its logits give the next token.
    KvPrefixHit hit;
    if (options_.enable_prefix_caching) {
      hit = cache_.FindCachedPrefix(s.tokens, size - 1);
      // Batch-invariant: resume only where the sequence's own chunks end,
      // so every chunk it computes is the one it computes alone.
      if (options_.batch_invariant && hit.tokens > 0) {
        const int64_t boundary = InvariantResumePoint(s, hit.tokens);
        if (boundary != hit.tokens) hit = cache_.FindCachedPrefix(s.tokens, boundary);
      }
    }
    int64_t cow = hit.tokens % bt != 0 ? 1 : 0;
    // New blocks, the copy of a partly used cached block, the f16 windows'
    // blocks a sequence takes when it starts, and the idle cached blocks it
    // revives (counted free until now).
    int64_t need = BlocksFor(size) - hit.blocks + cow + sequence_blocks_ + hit.idle_blocks;
    const int64_t available = FreeBlocks() - promised;
    if (need > available && BlocksFor(size) + sequence_blocks_ <= available) {
      // Only idle blocks hit and the copy makes the request need one block
      // more than computing its prompt, which fits now: with nothing else
      // to free blocks (or a request that fills the whole cache) it would
      // otherwise never start.
      hit = KvPrefixHit{};
      cow = 0;
      need = BlocksFor(size) + sequence_blocks_;
    }
    if (available < need) break;  // first come, first served
    if (!cache_.AddSequenceWithPrefix(s.seq, s.tokens, hit.tokens).ok()) break;  // id in use
    s.in_cache = true;
    s.computed = hit.tokens;
    s.cow_blocks = cow;
    promised += PendingBlocks(s);
    if (options_.enable_prefix_caching) {
      prefix_queries_ += size;
      prefix_hits_ += hit.tokens;
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Scheduler::Preempt(size_t index, StepReport* report) {
  std::unique_ptr<Sequence> s = std::move(running_[index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  cache_.ReleaseSequence(s->seq);
  s->in_cache = false;
  s->computed = 0;
  s->cow_blocks = 0;
  ++report->preemptions;
  // Back in arrival order, so it runs again before anything that came later.
  auto pos = std::find_if(waiting_.begin(), waiting_.end(),
                          [&](const auto& w) { return w->order > s->order; });
  waiting_.insert(pos, std::move(s));
}

bool Scheduler::AcceptToken(Sequence& s, const float* logits, StepReport* report) {
  const Clock::time_point now = Clock::now();
  const int32_t token = s.sampler->Sample(logits, vocab_);
  if (s.generated == 0) {
    report->time_to_first_token.push_back(Seconds(now - s.arrival));
  } else {
    report->inter_token_latency.push_back(Seconds(now - s.last_token));
  }
  s.last_token = now;
  if (s.request.stop_at_eos &&
      std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) {
    Finish(s, "stop");
    return true;
  }
  ++s.generated;
  ++report->generated_tokens;
  s.tokens.push_back(token);
  if (s.request.logprobs >= 0) {
    s.logprobs.push_back(ComputeTokenLogprob(logits, vocab_, token, s.request.logprobs));
  }
  s.held += tokenizer_.Decode(std::span<const int32_t>(&token, 1));
  for (const std::string& stop : s.request.stop) {
    const size_t at = s.held.find(stop);
    if (at != std::string::npos) {
      s.held.resize(at);
      Finish(s, "stop");
      return true;
    }
  }
  if (s.generated >= s.request.max_tokens ||
      static_cast<int64_t>(s.tokens.size()) >= options_.max_model_len) {
    Finish(s, "length");
    return true;
  }
  // Keep back what could still become a stop string, and incomplete UTF-8.
  const size_t keep = s.max_stop_bytes > 0 ? s.max_stop_bytes - 1 : 0;
  size_t ready = s.held.size() > keep ? s.held.size() - keep : 0;
  ready = CompleteUtf8Prefix(std::string_view(s.held).substr(0, ready));
  // With log probabilities every token gets its event, even with no text
  // ready, so a stream carries each token's entry as soon as it exists.
  if (ready > 0 || !s.logprobs.empty()) {
    RequestEvent event;
    event.text = s.held.substr(0, ready);
    s.held.erase(0, ready);
    event.logprobs = std::move(s.logprobs);
    s.logprobs.clear();
    s.channel->Push(std::move(event));
  }
  return false;
}

Status Scheduler::Step(StepReport* report) {
  *report = StepReport{};
  const Status status = StepBatch(report);
  report->prefix_cache_queries = prefix_queries_;
  report->prefix_cache_hits = prefix_hits_;
  prefix_queries_ = prefix_hits_ = 0;
  report->finish_reasons = std::move(finish_log_);
  finish_log_.clear();
  report->finished = static_cast<int64_t>(report->finish_reasons.size());
  return status;
}

Scheduler::BatchPlan Scheduler::PlanBatch(StepReport* report) {
  // Decodes first: every sequence with exactly one token to compute needs a
  // block when it crosses a block boundary. Preempt the newest until they fit.
  auto decode_blocks = [this] {
    int64_t need = 0;
    for (const auto& s : running_) {
      if (static_cast<int64_t>(s->tokens.size()) - s->computed == 1) need += PendingBlocks(*s);
    }
    return need;
  };
  while (running_.size() > 1 && decode_blocks() > FreeBlocks()) {
    Preempt(running_.size() - 1, report);
  }
  int64_t free_blocks = FreeBlocks() - decode_blocks();
  int64_t budget = options_.max_num_batched_tokens;

  BatchPlan plan;
  for (const auto& s : running_) {  // decodes
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->computed;
    if (remaining != 1 || budget < 1) continue;
    plan.batch.push_back({s->seq, {s->tokens.back()}, false});
    plan.rows.push_back(s.get());
    plan.samples.push_back(true);
    --budget;
  }
  for (const auto& s : running_) {  // prefill chunks, oldest first
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->computed;
    if (remaining <= 1 || budget < 1) continue;
    // Tokens that fit the blocks this sequence has plus the free ones
    // (less the copy of a cached block it writes into first).
    const int64_t fits =
        (BlocksFor(s->computed) + free_blocks - s->cow_blocks) * options_.block_tokens -
        s->computed;
    // Batch-invariant: the whole chunk or nothing.
    const int64_t n =
        options_.batch_invariant ? InvariantChunk(*s) : std::min({remaining, budget, fits});
    if (n < 1 || n > budget || n > fits) continue;
    free_blocks -= BlocksFor(s->computed + n) - BlocksFor(s->computed) + s->cow_blocks;
    budget -= n;
    const auto first = s->tokens.begin() + s->computed;
    plan.batch.push_back({s->seq, std::vector<int32_t>(first, first + n), false});
    plan.rows.push_back(s.get());
    plan.samples.push_back(n == remaining);
    report->prompt_tokens += n;
  }
  return plan;
}

int64_t Scheduler::InvariantResumePoint(const Sequence& s, int64_t cached) const {
  const int64_t prompt = static_cast<int64_t>(s.request.prompt.size());
  if (cached >= prompt) return cached;  // generated tokens: one per chunk
  return cached / options_.prefill_chunk * options_.prefill_chunk;
}

int64_t Scheduler::InvariantChunk(const Sequence& s) const {
  const int64_t prompt = static_cast<int64_t>(s.request.prompt.size());
  if (s.computed >= prompt) return 1;  // generated tokens, as they were first decoded
  return InvariantPromptChunk(s.computed, prompt, options_.prefill_chunk);
}

void Scheduler::RemoveRunning(const std::vector<Sequence*>& ended) {
  if (ended.empty()) return;
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [&](const auto& s) {
                                  return std::find(ended.begin(), ended.end(), s.get()) !=
                                         ended.end();
                                }),
                 running_.end());
}

Status Scheduler::StepBatch(StepReport* report) {
  DropCancelled();
  Admit();
  if (running_.empty()) return Status::Ok();

  const BatchPlan plan = PlanBatch(report);
  if (plan.batch.empty()) {
    // Every running sequence is prefilling and the free blocks went to
    // sequences that have since grown: free the newest so the rest progress.
    if (running_.size() > 1) Preempt(running_.size() - 1, report);
    return Status::Ok();
  }
  report->batch_sequences = static_cast<int64_t>(plan.batch.size());

  const Status status =
      model_.Forward(plan.batch, cache_, &logits_, /*observer=*/nullptr,
                     options_.batch_invariant ? BatchArith::kInvariant : BatchArith::kFastest);
  if (!status.ok()) {
    // The cache state of these sequences is unknown: end them.
    for (Sequence* s : plan.rows) Finish(*s, "error", status.message());
    RemoveRunning(plan.rows);
    return status;
  }
  std::vector<Sequence*> done;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    Sequence& s = *plan.rows[i];
    s.computed += static_cast<int64_t>(plan.batch[i].tokens.size());
    s.cow_blocks = 0;
    // Before the token is accepted: a finished request releases its blocks.
    if (options_.enable_prefix_caching) cache_.CacheFullBlocks(s.seq, s.tokens);
    if (plan.samples[i] &&
        AcceptToken(s, logits_.data() + i * static_cast<size_t>(vocab_), report)) {
      done.push_back(&s);
    }
  }
  RemoveRunning(done);
  return Status::Ok();
}

int64_t Scheduler::FinishAll(const std::string& reason) {
  for (auto& s : running_) Finish(*s, reason);
  for (auto& s : waiting_) Finish(*s, reason);
  const int64_t n = static_cast<int64_t>(running_.size() + waiting_.size());
  running_.clear();
  waiting_.clear();
  finish_log_.clear();
  return n;
}

}  // namespace kvq
