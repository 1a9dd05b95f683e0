#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>

#include "eval/logits_file.h"

namespace kvq {
namespace {

// Running sums of a per-position quantity, for mean and llama.cpp's error.
struct MeanAccumulator {
  double sum = 0, sum_sq = 0;
  int64_t n = 0;
  void Add(double x) {
    sum += x;
    sum_sq += x * x;
    ++n;
  }
  double Mean() const { return n > 0 ? sum / n : 0; }
  // sqrt(var / (n - 1)) with var = E[x^2] - E[x]^2, as llama-perplexity.
  double MeanError() const {
    if (n < 2) return 0;
    const double mean = Mean();
    const double var = sum_sq / n - mean * mean;
    return var > 0 ? std::sqrt(var / (n - 1)) : 0;
  }
};

// Linear interpolation between the closest ranks of sorted values.
double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double pos = p * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - lo) * (sorted[hi] - sorted[lo]);
}

}  // namespace

double KlDivergence(const std::vector<double>& base, const std::vector<double>& log_probs) {
  // Both renormalized over the base's support S: llama.cpp's file drops
  // every token 16 nats below the top (~1.8e-4 of the mass on SmolLM2's
  // 49,152 tokens). Renormalizing only the base added -log(1 - tail mass) to
  // every position, a floor of about the tail mass even against itself.
  double max = -INFINITY, this_max = -INFINITY;
  for (size_t i = 0; i < base.size(); ++i) {
    if (base[i] == -INFINITY) continue;
    max = std::max(max, base[i]);
    this_max = std::max(this_max, log_probs[i]);
  }
  if (max == -INFINITY) return 0;
  double sum = 0, this_sum = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    if (base[i] == -INFINITY) continue;
    sum += std::exp(base[i] - max);
    this_sum += std::exp(log_probs[i] - this_max);
  }
  const double lse = max + std::log(sum), this_lse = this_max + std::log(this_sum);
  double kl = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    if (base[i] == -INFINITY) continue;  // zero probability in the base
    const double lb = base[i] - lse;
    kl += std::exp(lb) * (lb - (log_probs[i] - this_lse));
  }
  return kl;
}

namespace {

Status CheckBaseMatches(const LogitsFileHeader& base, const std::string& path, int64_t vocab,
                        int64_t context, int64_t first, int64_t windows,
                        const std::vector<int32_t>& fed, bool bos_per_window) {
  if (base.n_vocab != vocab) {
    return Status::Error(path + ": written with a vocabulary of " + std::to_string(base.n_vocab) +
                         " tokens, this model has " + std::to_string(vocab));
  }
  if (base.n_ctx != context || base.first != first) {
    return Status::Error(path + ": written with --ctx " + std::to_string(base.n_ctx) +
                         ", this run uses --ctx " + std::to_string(context));
  }
  if (base.n_windows < windows) {
    return Status::Error(path + ": holds " + std::to_string(base.n_windows) +
                         " windows, this run needs " + std::to_string(windows) + " (use --chunks " +
                         std::to_string(base.n_windows) + ")");
  }
  // llama.cpp stores the text's tokens; BOS replaces each window's first one
  // only when it is fed, as here.
  const bool skip_window_starts = base.format == LogitsFormat::kLlamaCpp && bos_per_window;
  for (size_t i = 0; i < fed.size(); ++i) {
    if (skip_window_starts && i % static_cast<size_t>(context) == 0) continue;
    if (base.tokens[i] != fed[i]) {
      return Status::Error(path + ": token " + std::to_string(i) + " differs (" +
                           std::to_string(base.tokens[i]) + " in the file, " +
                           std::to_string(fed[i]) +
                           " here): written from another text or tokenizer");
    }
  }
  return Status::Ok();
}

}  // namespace

void LogSoftmax(const float* logits, int64_t n, double* out) {
  double max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max = std::max(max, static_cast<double>(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  const double lse = max + std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<double>(logits[i]) - lse;
}

std::vector<int32_t> PerplexityTokens(const LoadedModel& model, const std::string& text) {
  const Tokenizer& tok = *model.tokenizer;
  // BOS is added by hand: llama.cpp asserts the model adds no EOS here, and
  // add_special would add one for models that ask for it.
  std::vector<int32_t> tokens;
  if (tok.add_bos() && tok.bos_id() >= 0) tokens.push_back(tok.bos_id());
  const std::vector<int32_t> body = tok.Encode(text);
  tokens.insert(tokens.end(), body.begin(), body.end());
  return tokens;
}

namespace {

Status CheckPerplexityOptions(const PerplexityOptions& options, int64_t model_context,
                              const std::string& text) {
  const int64_t context = options.context;
  if (context < 4) return Status::Error("--ctx must be at least 4 tokens");
  if (context % 2 != 0) {
    return Status::Error(
        "--ctx must be even: the first half of each window is context, the "
        "second half is scored (got " +
        std::to_string(context) + ")");
  }
  if (context > model_context) {
    return Status::Error("--ctx " + std::to_string(context) + " exceeds the model's context of " +
                         std::to_string(model_context) + " tokens");
  }
  if (options.batch < 1) return Status::Error("--batch must be at least 1");
  if (text.empty()) return Status::Error("the text is empty");
  return Status::Ok();
}

// --save-logits: a writer for every scored row (null when not asked for).
// tokens: the text's tokens; fed: the first windows * context of them as fed.
StatusOr<std::unique_ptr<LogitsFileWriter>> OpenLogitsWriter(const PerplexityOptions& options,
                                                             int64_t vocab, int64_t first,
                                                             int64_t windows,
                                                             const std::vector<int32_t>& tokens,
                                                             const std::vector<int32_t>& fed) {
  if (options.save_logits_path.empty()) return std::unique_ptr<LogitsFileWriter>();
  LogitsFileHeader header;
  header.n_vocab = static_cast<uint32_t>(vocab);
  header.n_ctx = static_cast<uint32_t>(options.context);
  header.first = static_cast<uint32_t>(first);
  header.n_windows = static_cast<uint32_t>(windows);
  header.f16 = !options.save_logits_f32;
  header.format = options.save_logits_format;
  // llama.cpp's files hold the text's tokens, kvq's the tokens as fed.
  header.tokens = header.format == LogitsFormat::kLlamaCpp
                      ? std::vector<int32_t>(tokens.begin(), tokens.begin() + fed.size())
                      : fed;
  return LogitsFileWriter::Create(options.save_logits_path, header);
}

// Scores each row: its NLL and, against a base file, KL and top-1 agreement;
// writes it to --save-logits.
class RowScorer {
 public:
  RowScorer(int64_t vocab, std::unique_ptr<LogitsFileWriter> writer,
            std::unique_ptr<LogitsFileReader> reader)
      : vocab_(vocab), log_probs_(vocab), writer_(std::move(writer)), reader_(std::move(reader)) {}

  Status Score(const float* logits, int32_t target, MeanAccumulator* window_nll) {
    LogSoftmax(logits, vocab_, log_probs_.data());
    const double nll = -log_probs_[target];
    nll_.Add(nll);
    window_nll->Add(nll);
    const int32_t argmax = static_cast<int32_t>(
        std::max_element(log_probs_.begin(), log_probs_.end()) - log_probs_.begin());
    if (writer_ != nullptr) {
      KVQ_RETURN_IF_ERROR(writer_->WriteRow(argmax, static_cast<float>(nll), log_probs_.data()));
    }
    if (reader_ != nullptr) {
      KVQ_RETURN_IF_ERROR(reader_->ReadRow(&base_row_));
      const double kl = KlDivergence(base_row_.log_probs, log_probs_);
      kl_.Add(kl);
      kl_values_.push_back(kl);
      base_nll_.Add(base_row_.nll);
      top1_same_ += base_row_.argmax == argmax ? 1 : 0;
    }
    return Status::Ok();
  }

  Status Close() { return writer_ != nullptr ? writer_->Close() : Status::Ok(); }
  const MeanAccumulator& nll() const { return nll_; }

  std::optional<KlStats> Kl() {
    if (reader_ == nullptr) return std::nullopt;
    KlStats kl;
    kl.positions = kl_.n;
    kl.mean = kl_.Mean();
    kl.mean_error = kl_.MeanError();
    std::sort(kl_values_.begin(), kl_values_.end());
    kl.median = Percentile(kl_values_, 0.5);
    kl.p99 = Percentile(kl_values_, 0.99);
    kl.min = kl_values_.empty() ? 0 : kl_values_.front();
    kl.max = kl_values_.empty() ? 0 : kl_values_.back();
    const double p = kl.positions > 0 ? static_cast<double>(top1_same_) / kl.positions : 0;
    kl.top1_percent = 100.0 * p;
    kl.top1_error = kl.positions > 1 ? 100.0 * std::sqrt(p * (1 - p) / (kl.positions - 1)) : 0;
    kl.base_ppl = std::exp(base_nll_.Mean());
    kl.base_ppl_error = kl.base_ppl * base_nll_.MeanError();
    return kl;
  }

 private:
  int64_t vocab_;
  std::vector<double> log_probs_;  // [vocab]
  std::unique_ptr<LogitsFileWriter> writer_;
  std::unique_ptr<LogitsFileReader> reader_;
  LogitsRow base_row_;
  MeanAccumulator nll_, kl_, base_nll_;
  std::vector<double> kl_values_;
  int64_t top1_same_ = 0;
};

// One window in a fresh sequence, fed `batch` tokens at a time; rows from
// `first` on (each predicting the next token) are scored.
// `on_chunk(n)` follows each forward call of n tokens.
Status ScoreWindow(Transformer& transformer, KvCache& cache, const int32_t* window, int64_t context,
                   int64_t first, int64_t batch, RowScorer& scorer, MeanAccumulator* window_nll,
                   std::vector<float>* logits, const std::function<void(int64_t)>& on_chunk) {
  const SeqId seq = 0;
  const int64_t vocab = transformer.config().vocab_size;
  KVQ_RETURN_IF_ERROR(cache.AddSequence(seq));
  struct Release {
    KvCache& cache;
    ~Release() { cache.ReleaseSequence(0); }
  } release{cache};
  if (cache.Capacity(seq) < context) {
    return Status::Error("the KV cache holds only " + std::to_string(cache.Capacity(seq)) +
                         " tokens, less than --ctx " + std::to_string(context) +
                         " (raise --kv-memory)");
  }
  for (int64_t start = 0; start < context; start += batch) {
    const int64_t n = std::min(batch, context - start);
    const int32_t* chunk = window + start;
    // Chunks that end before the scored half need no logits.
    const bool scored = start + n - 1 >= first;
    KVQ_RETURN_IF_ERROR(transformer.Forward({{seq, std::vector<int32_t>(chunk, chunk + n), scored}},
                                            cache, logits));
    if (scored) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = start + i;
        if (row < first || row > context - 2) continue;
        KVQ_RETURN_IF_ERROR(scorer.Score(logits->data() + i * vocab, window[row + 1], window_nll));
      }
    }
    on_chunk(n);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<PerplexityResult> RunPerplexity(
    LoadedModel& model, KvCache& cache, const std::string& text, const PerplexityOptions& options,
    const std::function<void(const PerplexityProgress&)>& on_progress) {
  Transformer& transformer = *model.transformer;
  const int64_t vocab = transformer.config().vocab_size;
  const int64_t context = options.context;
  KVQ_RETURN_IF_ERROR(
      CheckPerplexityOptions(options, transformer.config().max_position_embeddings, text));

  PerplexityResult result;
  const std::vector<int32_t> tokens = PerplexityTokens(model, text);
  result.text_tokens = static_cast<int64_t>(tokens.size());
  if (result.text_tokens < context) {
    return Status::Error("the text has " + std::to_string(tokens.size()) +
                         " tokens, fewer than one window of --ctx " + std::to_string(context));
  }
  int64_t windows = result.text_tokens / context;
  if (options.max_windows > 0) windows = std::min(windows, options.max_windows);
  const int64_t first = context / 2;
  const Tokenizer& tok = *model.tokenizer;
  result.bos_per_window = tok.add_bos() && tok.bos_id() >= 0;

  // [windows * context]: the tokens as fed, each window starting with BOS if
  // the model uses one.
  std::vector<int32_t> fed(tokens.begin(), tokens.begin() + windows * context);
  if (result.bos_per_window) {
    for (int64_t w = 0; w < windows; ++w) fed[w * context] = tok.bos_id();
  }
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<LogitsFileWriter> writer,
                       OpenLogitsWriter(options, vocab, first, windows, tokens, fed));
  std::unique_ptr<LogitsFileReader> reader;
  if (!options.kl_base_path.empty()) {
    KVQ_ASSIGN_OR_RETURN(reader, LogitsFileReader::Open(options.kl_base_path));
    KVQ_RETURN_IF_ERROR(CheckBaseMatches(reader->header(), options.kl_base_path, vocab, context,
                                         first, windows, fed, result.bos_per_window));
  }

  RowScorer scorer(vocab, std::move(writer), std::move(reader));
  std::vector<float> logits;  // [rows, vocab]
  const auto start_time = std::chrono::steady_clock::now();
  const auto seconds = [&start_time] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  };
  PerplexityProgress p;
  p.windows = windows;
  p.tokens_total = windows * context;
  const auto on_chunk = [&](int64_t n) {
    p.tokens_fed += n;
    p.seconds = seconds();
    if (on_progress) on_progress(p);
  };
  for (int64_t w = 0; w < windows; ++w) {
    MeanAccumulator window_nll;
    p.window = w + 1;
    p.window_done = false;
    KVQ_RETURN_IF_ERROR(ScoreWindow(transformer, cache, fed.data() + w * context, context, first,
                                    options.batch, scorer, &window_nll, &logits, on_chunk));
    result.running_ppl.push_back(std::exp(scorer.nll().Mean()));
    p.window_done = true;
    p.running_ppl = result.running_ppl.back();
    p.window_ppl = std::exp(window_nll.Mean());
    p.tokens_scored = scorer.nll().n;
    p.seconds = seconds();
    if (on_progress) on_progress(p);
  }
  result.seconds = seconds();
  KVQ_RETURN_IF_ERROR(scorer.Close());
  result.windows = windows;
  result.tokens_processed = windows * context;
  result.tokens_scored = scorer.nll().n;
  result.mean_nll = scorer.nll().Mean();
  result.ppl = std::exp(result.mean_nll);
  result.ppl_error = result.ppl * scorer.nll().MeanError();
  result.kl = scorer.Kl();
  return result;
}

}  // namespace kvq
