// kvq study, part 4: end to end with real KV caches. For each scheme spec the
// perplexity engine runs with the cache actually quantized (PPL, KL and top-1
// agreement vs the f16 cache's logits), a passkey test measures exact recall,
// and the planner's layout gives bytes per token.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/loaded_model.h"
#include "eval/perplexity.h"
#include "eval/planner.h"
#include "kv/kv_factory.h"

namespace kvq {

// One --schemes entry. Spec grammar (one small parser for every cache the
// factory knows, so new codec names such as kivi2 work unchanged):
//   TYPE           K and V both TYPE (any --kv-cache-dtype value, e.g. int4-g64)
//   KTYPE/VTYPE    K KTYPE, V VTYPE (e.g. f16/int4)
//   ...+rot        append to either form: Hadamard rotation (--kv-rotate)
//   policy:FILE    a per-layer policy file (--kv-policy; e.g. kvq tune's
//                  output); layers it does not name stay f16
struct SchemeSpec {
  std::string name;  // the spec as written
  std::string k_type, v_type;
  bool rotate = false;
  std::string policy;  // policy:FILE's text ("" otherwise)
};
StatusOr<SchemeSpec> ParseSchemeSpec(const std::string& spec);
// Comma-separated specs; each is also checked against the factory for `shape`
// so an unknown name fails before any model work.
StatusOr<std::vector<SchemeSpec>> ParseSchemeList(const std::string& list, const KvShape& shape);
// The default --schemes list.
std::string DefaultStudySchemes();

// pool: the threads of the model the cache serves (Transformer::pool());
// null when the options only feed the planner.
// calibration_path: the KVQuant calibration file (ignored by other schemes).
KvCacheOptions SchemeCacheOptions(const SchemeSpec& spec, int64_t max_tokens, ThreadPool* pool,
                                  const std::string& calibration_path = "");

struct RecallOptions {
  std::vector<int64_t> contexts;  // total tokens (prompt + answer room) per cell
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  int trials = 2;
  uint64_t seed = 1234;
  int answer_tokens = 8;  // greedy tokens decoded after the question
};

struct RecallCell {
  int64_t context = 0;
  double depth = 0;
  int correct = 0;
  int trials = 0;
  std::string example_answer;  // the first trial's greedy text, to see what the model says
};

// One passkey prompt: BOS (if the model adds one) + filler with the needle
// " The pass key is NNNNN. Remember it." inserted at `depth` (fraction of the
// filler tokens before it) + " What is the pass key? The pass key is".
// filler: tokens of held-out text, offset chosen by the caller.
struct PasskeyPrompt {
  std::vector<int32_t> tokens;
  std::string passkey;  // 5 digits
};
StatusOr<PasskeyPrompt> BuildPasskeyPrompt(const LoadedModel& model,
                                           const std::vector<int32_t>& filler,
                                           int64_t prompt_tokens, double depth,
                                           const std::string& passkey);
// First run of digits in `text` equals `passkey`.
bool PasskeyAnswerCorrect(const std::string& text, const std::string& passkey);

// Greedy-decodes answer_tokens after `prompt` with `cache` (sequence 0, left
// empty) and returns the generated text.
StatusOr<std::string> GreedyAnswer(LoadedModel& model, KvCache& cache,
                                   const std::vector<int32_t>& prompt, int answer_tokens);

// Every (context, depth) cell, `trials` prompts each; prompts depend only on
// the seed and the text, so every scheme sees the same prompts.
StatusOr<std::vector<RecallCell>> RunPasskeyRecall(
    LoadedModel& model, KvCache& cache, const std::vector<int32_t>& filler,
    const RecallOptions& options, const std::function<void(int64_t, int64_t)>& on_trial = nullptr);

struct SchemeResult {
  SchemeSpec spec;
  KvTypePlan plan;
  double bytes_per_token = 0;  // layout: every layer, K and V, padding included
  double bits_per_value = 0;   // bytes_per_token * 8 / (2 * layers * kv_heads * head_dim)
  double compression_vs_f16 = 0;
  bool baseline = false;  // the f16 run the others are compared with
  PerplexityResult ppl;
  double kl_mean = 0, kl_p99 = 0, top1_agreement = 0;  // baseline: 0, 0, 1 by definition
  std::vector<RecallCell> recall;
  double seconds = 0;
};

struct EndToEndOptions {
  PerplexityOptions perplexity;  // context, batch, max_windows (paths are set per run)
  RecallOptions recall;
  std::string baseline_logits_path;  // scratch file for the f16 run's log-probs
  std::string calibration_path;      // for schemes that need one (KVQuant)
  int threads = 1;
};

struct SchemeProgress {
  std::string stage;  // "perplexity" or "recall"
  int64_t done = 0, total = 0;
};

// is_baseline: save log-probs to baseline_logits_path (run it first, with
// f16); otherwise compare against that file.
StatusOr<SchemeResult> RunSchemeEndToEnd(
    LoadedModel& model, const std::string& text, const std::vector<int32_t>& filler,
    const SchemeSpec& spec, const EndToEndOptions& options, bool is_baseline,
    const std::function<void(const SchemeProgress&)>& progress);

}  // namespace kvq
