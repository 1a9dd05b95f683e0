// Perplexity with the KV cache actually in use, as llama.cpp's
// llama-perplexity measures it, and KL divergence against a saved baseline.
//
// Convention (llama.cpp's perplexity()): the text is tokenized once (with a
// leading BOS if the model's tokenizer adds one) and cut into non-overlapping
// windows of `context` tokens; a trailing partial window is dropped. If the
// model adds BOS, each window's first token is replaced by BOS. Each window
// is a fresh sequence in the cache, prefilled in chunks of `batch` tokens.
// The first half of a window is context only: logit rows first = context / 2
// .. context - 2 are scored, row r against token r + 1, so each window scores
// context / 2 - 1 tokens. PPL = exp(mean NLL); its error is llama.cpp's:
// err(mean NLL) = sqrt((E[nll^2] - E[nll]^2) / (n - 1)), err(PPL) = PPL * that.
// (llama.cpp also demands at least 2 windows of text; kvq needs one.)
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/loaded_model.h"
#include "eval/logits_file.h"
#include "kv/kv_cache.h"

namespace kvq {

struct PerplexityOptions {
  int64_t context = 512;         // window length in tokens (even, <= the model's context)
  int64_t batch = 512;           // tokens per forward call inside a window
  int64_t max_windows = 0;       // 0 = every whole window of the text
  std::string save_logits_path;  // write the scored rows' log-probs (eval/logits_file.h)
  bool save_logits_f32 = false;  // store log-probs as f32 instead of f16 (kKvq)
  LogitsFormat save_logits_format = LogitsFormat::kKvq;
  std::string kl_base_path;  // compare against a file written by save_logits_path
};

// Statistics of KL(base || this run) over every scored position.
struct KlStats {
  int64_t positions = 0;
  double mean = 0, mean_error = 0;  // error = sqrt(var / (n - 1))
  double median = 0, p99 = 0, max = 0, min = 0;
  double top1_percent = 0, top1_error = 0;  // same argmax as the base, in %
  double base_ppl = 0, base_ppl_error = 0;
};

struct PerplexityProgress {
  int64_t window = 0;   // windows done (1-based)
  int64_t windows = 0;  // total
  double running_ppl = 0;
  double window_ppl = 0;  // this window alone
  int64_t tokens_scored = 0;
  double seconds = 0;
  // Tokens through the model so far, of windows x context in all: a window
  // of 32K tokens takes an hour on one thread, so callers hear of each chunk.
  int64_t tokens_fed = 0, tokens_total = 0;
  bool window_done = false;  // false: a chunk inside a window (the PPL fields are stale)
};

struct PerplexityResult {
  int64_t text_tokens = 0;  // the whole text, tokenized
  int64_t windows = 0;
  int64_t tokens_scored = 0;
  bool bos_per_window = false;
  double mean_nll = 0;
  double ppl = 0, ppl_error = 0;
  double seconds = 0;               // forward passes and scoring, tokenization excluded
  int64_t tokens_processed = 0;     // windows * context (tokens through the model)
  std::vector<double> running_ppl;  // after each window
  std::optional<KlStats> kl;
};

// Tokens of `text` as perplexity sees them (BOS prepended if the model adds it).
std::vector<int32_t> PerplexityTokens(const LoadedModel& model, const std::string& text);

// `cache` must have room for `options.context` tokens of sequence 0; the
// sequence is added and released for every window. `on_progress` is called
// after every forward chunk and at the end of every window (window_done).
StatusOr<PerplexityResult> RunPerplexity(
    LoadedModel& model, KvCache& cache, const std::string& text, const PerplexityOptions& options,
    const std::function<void(const PerplexityProgress&)>& on_progress = nullptr);

// KL(base || this) in nats for one position: log-probs over the same
// vocabulary, base[i] = -inf where the base stores no probability (llama.cpp's
// file leaves out tokens 16 nats below the top). Both distributions are
// renormalized over the base's support, so the stored rounding enters only
// through the difference of two proper distributions and a truncated copy of
// a distribution is at KL 0 from it. (llama-perplexity sums the same terms
// without renormalizing; the two differ by about the tail-mass difference.)
double KlDivergence(const std::vector<double>& base, const std::vector<double>& log_probs);

// log-softmax of one logits row in double. logits: [n], out: [n].
void LogSoftmax(const float* logits, int64_t n, double* out);

}  // namespace kvq
