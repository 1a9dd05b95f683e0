#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

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

StatusOr<PerplexityResult> RunPerplexity(
    LoadedModel& model, KvCache& cache, const std::string& text, const PerplexityOptions& options,
    const std::function<void(const PerplexityProgress&)>& on_window) {
  Transformer& transformer = *model.transformer;
  const int64_t vocab = transformer.config().vocab_size;
  const int64_t context = options.context;
  const int64_t model_context = transformer.config().max_position_embeddings;
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

  std::unique_ptr<LogitsFileWriter> writer;
  if (!options.save_logits_path.empty()) {
    LogitsFileHeader header;
    header.n_vocab = static_cast<uint32_t>(vocab);
    header.n_ctx = static_cast<uint32_t>(context);
    header.first = static_cast<uint32_t>(first);
    header.n_windows = static_cast<uint32_t>(windows);
    header.f16 = !options.save_logits_f32;
    header.format = options.save_logits_format;
    // llama.cpp's files hold the text's tokens, kvq's the tokens as fed.
    header.tokens = header.format == LogitsFormat::kLlamaCpp
                        ? std::vector<int32_t>(tokens.begin(), tokens.begin() + windows * context)
                        : fed;
    KVQ_ASSIGN_OR_RETURN(writer, LogitsFileWriter::Create(options.save_logits_path, header));
  }
  std::unique_ptr<LogitsFileReader> reader;
  if (!options.kl_base_path.empty()) {
    KVQ_ASSIGN_OR_RETURN(reader, LogitsFileReader::Open(options.kl_base_path));
    KVQ_RETURN_IF_ERROR(CheckBaseMatches(reader->header(), options.kl_base_path, vocab, context,
                                         first, windows, fed, result.bos_per_window));
  }

  const SeqId seq = 0;
  MeanAccumulator nll_acc, kl_acc, base_nll_acc;
  std::vector<double> kl_values;
  int64_t top1_same = 0;
  std::vector<float> logits;             // [rows, vocab]
  std::vector<double> log_probs(vocab);  // [vocab]
  LogitsRow base_row;
  const auto start_time = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < windows; ++w) {
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
    MeanAccumulator window_acc;
    for (int64_t start = 0; start < context; start += options.batch) {
      const int64_t n = std::min(options.batch, context - start);
      const int32_t* chunk = fed.data() + w * context + start;
      // Chunks that end before the scored half need no logits.
      const bool scored = start + n - 1 >= first;
      KVQ_RETURN_IF_ERROR(transformer.Forward(
          {{seq, std::vector<int32_t>(chunk, chunk + n), scored}}, cache, &logits));
      if (!scored) continue;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = start + i;
        if (row < first || row > context - 2) continue;
        LogSoftmax(logits.data() + i * vocab, vocab, log_probs.data());
        const int32_t target = fed[w * context + row + 1];
        const double nll = -log_probs[target];
        nll_acc.Add(nll);
        window_acc.Add(nll);
        const int32_t argmax = static_cast<int32_t>(
            std::max_element(log_probs.begin(), log_probs.end()) - log_probs.begin());
        if (writer != nullptr) {
          KVQ_RETURN_IF_ERROR(writer->WriteRow(argmax, static_cast<float>(nll), log_probs.data()));
        }
        if (reader != nullptr) {
          KVQ_RETURN_IF_ERROR(reader->ReadRow(&base_row));
          const double kl = KlDivergence(base_row.log_probs, log_probs);
          kl_acc.Add(kl);
          kl_values.push_back(kl);
          base_nll_acc.Add(base_row.nll);
          top1_same += base_row.argmax == argmax ? 1 : 0;
        }
      }
    }
    result.running_ppl.push_back(std::exp(nll_acc.Mean()));
    if (on_window) {
      PerplexityProgress p;
      p.window = w + 1;
      p.windows = windows;
      p.running_ppl = result.running_ppl.back();
      p.window_ppl = std::exp(window_acc.Mean());
      p.tokens_scored = nll_acc.n;
      p.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
      on_window(p);
    }
  }
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  if (writer != nullptr) KVQ_RETURN_IF_ERROR(writer->Close());
  result.windows = windows;
  result.tokens_processed = windows * context;
  result.tokens_scored = nll_acc.n;
  result.mean_nll = nll_acc.Mean();
  result.ppl = std::exp(result.mean_nll);
  result.ppl_error = result.ppl * nll_acc.MeanError();
  if (reader != nullptr) {
    KlStats kl;
    kl.positions = kl_acc.n;
    kl.mean = kl_acc.Mean();
    kl.mean_error = kl_acc.MeanError();
    std::sort(kl_values.begin(), kl_values.end());
    kl.median = Percentile(kl_values, 0.5);
    kl.p99 = Percentile(kl_values, 0.99);
    kl.min = kl_values.empty() ? 0 : kl_values.front();
    kl.max = kl_values.empty() ? 0 : kl_values.back();
    const double p = kl.positions > 0 ? static_cast<double>(top1_same) / kl.positions : 0;
    kl.top1_percent = 100.0 * p;
    kl.top1_error = kl.positions > 1 ? 100.0 * std::sqrt(p * (1 - p) / (kl.positions - 1)) : 0;
    kl.base_ppl = std::exp(base_nll_acc.Mean());
    kl.base_ppl_error = kl.base_ppl * base_nll_acc.MeanError();
    result.kl = kl;
  }
  return result;
}

}  // namespace kvq
