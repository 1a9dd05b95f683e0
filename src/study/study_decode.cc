#include "study/study_decode.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "engine/sampler.h"

namespace kvq {
namespace {

constexpr SeqId kPrefixSeq = 0x7ff0;
constexpr SeqId kPromptSeq = 0x7ff1;
constexpr int64_t kChunk = 512;  // tokens per prefill call (bounds activation memory)

}  // namespace

std::vector<int32_t> EndOfAnswerTokens(const LoadedModel& model) {
  const Tokenizer& tok = *model.tokenizer;
  std::vector<int32_t> ids;
  if (tok.eos_id() >= 0) ids.push_back(tok.eos_id());
  for (const char* marker : {"<|im_end|>", "<|eot_id|>", "<|endoftext|>"}) {
    const int32_t id = tok.PieceToId(marker);
    if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

PrefixRunner::PrefixRunner(LoadedModel& model, KvCache& cache, BatchArith decode_arith)
    : model_(model),
      cache_(cache),
      decode_arith_(decode_arith),
      end_tokens_(EndOfAnswerTokens(model)) {}

PrefixRunner::~PrefixRunner() {
  cache_.ReleaseSequence(kPromptSeq);
  cache_.ReleaseSequence(kPrefixSeq);
}

Status PrefixRunner::Prefill(SeqId seq, const int32_t* tokens, int64_t n,
                             std::vector<float>* logits) {
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t count = std::min(kChunk, n - start);
    KVQ_RETURN_IF_ERROR(model_.transformer->Forward(
        {{seq, std::vector<int32_t>(tokens + start, tokens + start + count), false}}, cache_,
        logits));
    computed_ += count;
  }
  return Status::Ok();
}

Status PrefixRunner::SetPrefix(const std::vector<int32_t>& prefix) {
  cache_.ReleaseSequence(kPrefixSeq);
  have_prefix_ = false;
  prefix_ = prefix;
  if (prefix_.empty()) return Status::Ok();
  KVQ_RETURN_IF_ERROR(cache_.AddSequence(kPrefixSeq));
  have_prefix_ = true;
  if (cache_.Capacity(kPrefixSeq) < static_cast<int64_t>(prefix_.size())) {
    return Status::Error("the shared prefix of " + std::to_string(prefix_.size()) +
                         " tokens does not fit the cache");
  }
  std::vector<float> logits;
  return Prefill(kPrefixSeq, prefix_.data(), static_cast<int64_t>(prefix_.size()), &logits);
}

Status PrefixRunner::StartPrompt(SeqId seq, const std::vector<int32_t>& prompt,
                                 std::vector<float>* logits) {
  if (prompt.size() <= prefix_.size() ||
      !std::equal(prefix_.begin(), prefix_.end(), prompt.begin())) {
    return Status::Error("internal: the prompt does not extend the shared prefix");
  }
  if (have_prefix_) {
    KVQ_RETURN_IF_ERROR(cache_.Fork(kPrefixSeq, seq));
  } else {
    KVQ_RETURN_IF_ERROR(cache_.AddSequence(seq));
  }
  const int64_t tail = static_cast<int64_t>(prompt.size() - prefix_.size());
  if (cache_.Capacity(seq) < tail) {
    cache_.ReleaseSequence(seq);
    return Status::Error("a prompt of " + std::to_string(prompt.size()) +
                         " tokens does not fit the cache");
  }
  shared_ += static_cast<int64_t>(prefix_.size());
  const Status prefilled = Prefill(seq, prompt.data() + prefix_.size(), tail, logits);
  if (!prefilled.ok()) cache_.ReleaseSequence(seq);
  return prefilled;
}

bool PrefixRunner::Step(SeqId seq, const float* logits, const GreedyStop& stop,
                        std::vector<int32_t>* answer, GreedyResult* out) const {
  if (stop.max_tokens <= 0) return true;
  const int32_t next = ArgMax(logits, model_.transformer->config().vocab_size);
  if (stop.stop_at_end_tokens &&
      std::find(end_tokens_.begin(), end_tokens_.end(), next) != end_tokens_.end()) {
    return true;
  }
  answer->push_back(next);
  out->tokens = static_cast<int64_t>(answer->size());
  out->text = model_.tokenizer->Decode(*answer, true);
  if (stop.done && stop.done(out->text)) return true;
  if (out->tokens == stop.max_tokens || cache_.Capacity(seq) < 1) {
    out->hit_limit = true;
    return true;
  }
  return false;
}

StatusOr<std::string> PrefixRunner::Answer(const std::vector<int32_t>& prompt,
                                           const GreedyStop& stop) {
  GreedyResult result;
  KVQ_RETURN_IF_ERROR(AnswerBatched({prompt}, stop, 1, [&](size_t, const GreedyResult& r) {
    result = r;
    return Status::Ok();
  }));
  last_answer_tokens_ = result.tokens;
  last_hit_limit_ = result.hit_limit;
  return result.text;
}

Status PrefixRunner::AnswerBatched(
    const std::vector<std::vector<int32_t>>& prompts, const GreedyStop& stop, int64_t max_batch,
    const std::function<Status(size_t, const GreedyResult&)>& on_answer) {
  if (max_batch < 1 || max_batch > kMaxBatch) {
    return Status::Error("the decode batch must be in [1, " + std::to_string(kMaxBatch) + "]");
  }
  struct Slot {
    size_t prompt = 0;
    std::vector<int32_t> answer;
    GreedyResult out;
  };
  std::vector<std::optional<Slot>> slots(static_cast<size_t>(max_batch));  // slot k: seq base + k
  auto seq_of = [](size_t k) { return static_cast<SeqId>(kPromptSeq + static_cast<SeqId>(k)); };
  struct ReleaseAll {
    KvCache& cache;
    size_t n;
    SeqId base;
    ~ReleaseAll() {
      for (size_t k = 0; k < n; ++k) cache.ReleaseSequence(base + static_cast<SeqId>(k));
    }
  } release{cache_, slots.size(), kPromptSeq};
  const int64_t vocab = model_.transformer->config().vocab_size;
  std::vector<float> logits;  // [active, vocab]
  size_t next_prompt = 0;
  while (true) {
    // Fill free slots; an answer may finish at its first token.
    for (size_t k = 0; k < slots.size() && next_prompt < prompts.size(); ++k) {
      while (!slots[k] && next_prompt < prompts.size()) {
        Slot slot{next_prompt++, {}, {}};
        KVQ_RETURN_IF_ERROR(StartPrompt(seq_of(k), prompts[slot.prompt], &logits));
        if (Step(seq_of(k), logits.data(), stop, &slot.answer, &slot.out)) {
          cache_.ReleaseSequence(seq_of(k));
          KVQ_RETURN_IF_ERROR(on_answer(slot.prompt, slot.out));
        } else {
          slots[k] = std::move(slot);
        }
      }
    }
    std::vector<BatchSequence> batch;
    std::vector<size_t> rows;  // slot of each batch row
    for (size_t k = 0; k < slots.size(); ++k) {
      if (slots[k]) {
        batch.push_back({seq_of(k), {slots[k]->answer.back()}, false});
        rows.push_back(k);
      }
    }
    if (batch.empty()) return Status::Ok();
    KVQ_RETURN_IF_ERROR(
        model_.transformer->Forward(batch, cache_, &logits, nullptr, decode_arith_));
    computed_ += static_cast<int64_t>(batch.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      Slot& slot = *slots[rows[r]];
      if (!Step(seq_of(rows[r]), logits.data() + static_cast<int64_t>(r) * vocab, stop,
                &slot.answer, &slot.out)) {
        continue;
      }
      cache_.ReleaseSequence(seq_of(rows[r]));
      const size_t prompt = slot.prompt;
      const GreedyResult out = std::move(slot.out);
      slots[rows[r]].reset();
      KVQ_RETURN_IF_ERROR(on_answer(prompt, out));
    }
  }
}

size_t CommonPrefixLength(const std::vector<std::vector<int32_t>>& prompts) {
  if (prompts.empty()) return 0;
  size_t n = prompts[0].size();
  for (const auto& p : prompts) {
    n = std::min(n, p.size());
    n = static_cast<size_t>(std::mismatch(p.begin(), p.begin() + n, prompts[0].begin()).first -
                            p.begin());
  }
  return n;
}

}  // namespace kvq
