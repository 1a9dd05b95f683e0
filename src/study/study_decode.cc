#include "study/study_decode.h"

#include <algorithm>

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

PrefixRunner::PrefixRunner(LoadedModel& model, KvCache& cache)
    : model_(model), cache_(cache), end_tokens_(EndOfAnswerTokens(model)) {}

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

StatusOr<std::string> PrefixRunner::Answer(const std::vector<int32_t>& prompt,
                                           const GreedyStop& stop) {
  if (prompt.size() <= prefix_.size() ||
      !std::equal(prefix_.begin(), prefix_.end(), prompt.begin())) {
    return Status::Error("internal: the prompt does not extend the shared prefix");
  }
  if (have_prefix_) {
    KVQ_RETURN_IF_ERROR(cache_.Fork(kPrefixSeq, kPromptSeq));
  } else {
    KVQ_RETURN_IF_ERROR(cache_.AddSequence(kPromptSeq));
  }
  struct Release {
    KvCache& cache;
    ~Release() { cache.ReleaseSequence(kPromptSeq); }
  } release{cache_};
  const int64_t tail = static_cast<int64_t>(prompt.size() - prefix_.size());
  if (cache_.Capacity(kPromptSeq) < tail) {
    return Status::Error("a prompt of " + std::to_string(prompt.size()) +
                         " tokens does not fit the cache");
  }
  shared_ += static_cast<int64_t>(prefix_.size());
  std::vector<float> logits;  // [1, vocab] (only the last row is returned)
  KVQ_RETURN_IF_ERROR(Prefill(kPromptSeq, prompt.data() + prefix_.size(), tail, &logits));
  const int64_t vocab = model_.transformer->config().vocab_size;
  std::vector<int32_t> answer;
  std::string text;
  last_hit_limit_ = false;
  for (int i = 0; i < stop.max_tokens; ++i) {
    const int32_t next = ArgMax(logits.data(), vocab);
    if (stop.stop_at_end_tokens &&
        std::find(end_tokens_.begin(), end_tokens_.end(), next) != end_tokens_.end()) {
      break;
    }
    answer.push_back(next);
    text = model_.tokenizer->Decode(answer, true);
    if (stop.done && stop.done(text)) break;
    if (i + 1 == stop.max_tokens || cache_.Capacity(kPromptSeq) < 1) {
      last_hit_limit_ = true;
      break;
    }
    KVQ_RETURN_IF_ERROR(
        model_.transformer->Forward({{kPromptSeq, {next}, false}}, cache_, &logits));
    ++computed_;
  }
  last_answer_tokens_ = static_cast<int64_t>(answer.size());
  return text;
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
