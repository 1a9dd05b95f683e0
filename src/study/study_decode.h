// Greedy answers for exact-recall and reasoning tests, with the prompt's
// shared prefix computed once: the prefix is prefilled into a base sequence
// and every prompt that starts with it runs on a fork of it (the paged
// cache shares the prefix's blocks copy-on-write), so only its own tail is
// recomputed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/loaded_model.h"
#include "kv/kv_cache.h"
#include "model/transformer.h"

namespace kvq {

struct GreedyStop {
  int max_tokens = 16;
  bool stop_at_end_tokens = true;  // EOS and the chat end-of-turn markers
  // Called with the answer text after each token; true ends the answer
  // (e.g. "enough numbers seen"). May be empty.
  std::function<bool(const std::string&)> done;
};

// Tokens that end an answer: EOS and <|im_end|>, <|eot_id|>, <|endoftext|>
// where the vocabulary has them.
std::vector<int32_t> EndOfAnswerTokens(const LoadedModel& model);

struct GreedyResult {
  std::string text;
  int64_t tokens = 0;      // generated (end tokens excluded)
  bool hit_limit = false;  // stopped by max_tokens or the cache's capacity
};

class PrefixRunner {
 public:
  // Uses sequence ids 0x7ff0 (the prefix) and from 0x7ff1 on (one per prompt
  // decoding at once, at most kMaxBatch) of `cache`, which must not hold them.
  static constexpr int64_t kMaxBatch = 256;
  // decode_arith: the arithmetic of AnswerBatched's decode steps (prefills
  // hold one sequence, so no batchmate can change them).
  PrefixRunner(LoadedModel& model, KvCache& cache, BatchArith decode_arith = BatchArith::kFastest);
  ~PrefixRunner();
  PrefixRunner(const PrefixRunner&) = delete;
  PrefixRunner& operator=(const PrefixRunner&) = delete;

  // Replaces the shared prefix (empty: none) and prefills it.
  Status SetPrefix(const std::vector<int32_t>& prefix);
  // Greedy answer to `prompt`, which must start with the prefix and be longer.
  StatusOr<std::string> Answer(const std::vector<int32_t>& prompt, const GreedyStop& stop);

  // Greedy answers to every prompt (each extends the prefix), up to
  // `max_batch` of them decoding together: one forward call per step for all
  // active answers, a finished answer's place taken by the next prompt, whose
  // tail is prefilled alone. on_answer(i, answer) runs as prompt i finishes
  // (in any order); an error it returns stops the run. A prompt's answer
  // depends on the others only through the arithmetic of the batched
  // projections (ops::Matmul's path for the step's row count): it equals
  // Answer()'s while fewer than ops::kPackedMinTokens answers decode
  // together, and always under BatchArith::kInvariant.
  Status AnswerBatched(const std::vector<std::vector<int32_t>>& prompts, const GreedyStop& stop,
                       int64_t max_batch,
                       const std::function<Status(size_t, const GreedyResult&)>& on_answer);

  int64_t last_answer_tokens() const { return last_answer_tokens_; }
  bool last_hit_limit() const { return last_hit_limit_; }  // stopped by max_tokens
  int64_t tokens_computed() const { return computed_; }    // prefill + decode forwards
  int64_t tokens_shared() const { return shared_; }        // prompt tokens taken from the prefix

 private:
  Status Prefill(SeqId seq, const int32_t* tokens, int64_t n, std::vector<float>* logits);
  // Starts `seq` as a fork of the prefix (or empty) and prefills the tail of
  // `prompt`; logits: its last row.
  Status StartPrompt(SeqId seq, const std::vector<int32_t>& prompt, std::vector<float>* logits);
  // One greedy step of an answer from its last logits row: true when the
  // answer is finished (end token, stop.done, the token or capacity limit).
  bool Step(SeqId seq, const float* logits, const GreedyStop& stop, std::vector<int32_t>* answer,
            GreedyResult* out) const;

  LoadedModel& model_;
  KvCache& cache_;
  BatchArith decode_arith_;
  std::vector<int32_t> prefix_;
  bool have_prefix_ = false;
  std::vector<int32_t> end_tokens_;
  int64_t computed_ = 0, shared_ = 0;
  int64_t last_answer_tokens_ = 0;
  bool last_hit_limit_ = false;
};

// The longest common prefix of `prompts` (all of them), in tokens.
size_t CommonPrefixLength(const std::vector<std::vector<int32_t>>& prompts);

}  // namespace kvq
