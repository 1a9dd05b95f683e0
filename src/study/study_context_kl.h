// kvq study: KL vs f16 as a function of context length ("small model + long
// context", issue 17 item 6). For each window length L the perplexity engine
// scores the second half of windows of L tokens (positions L/2 .. L-1, so a
// length's figure is the error of a cache holding L/2 to L tokens) with the
// f16 cache, then with each scheme, and records KL(f16 || scheme) mean and
// p99, top-1 agreement and perplexity. Results are JSON lines per scheme in
// a results directory, one line per length, so a killed run resumes and a
// rerun may add lengths or schemes.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/loaded_model.h"
#include "study/study_e2e.h"

namespace kvq {

struct ContextKlOptions {
  std::vector<int64_t> lengths;  // window lengths in tokens, each even and <= the model's
  // Scored positions wanted per length: windows = ceil(positions / (L/2 - 1)),
  // at least 1, at most what the text holds. Equal sample sizes keep short
  // and long lengths comparably noisy (one window of 512 scores 255).
  int64_t positions = 2048;
  int64_t batch = 512;
  int threads = 1;
  std::string calibration_path;  // for KVQuant schemes
};

// The windows of length `length` a run scores, for a text of `text_tokens`.
int64_t ContextKlWindows(int64_t length, int64_t positions, int64_t text_tokens);

// Every length's token need, model context and evenness, before any work.
Status ValidateContextKl(const LoadedModel& model, int64_t text_tokens,
                         const ContextKlOptions& options);

struct ContextKlProgress {
  int64_t length = 0;
  std::string scheme;
  int64_t done = 0, total = 0;  // (length, scheme) points recorded / asked for
  // Inside the running point (0 of 0 when it starts): one 32K point takes an
  // hour on one thread.
  int64_t tokens_fed = 0, tokens_total = 0;
};

// `schemes` must start with the f16 baseline (F16First). `text_digest`
// identifies the text in the results directory's configuration. Returns the
// study JSON's "context_kl" section (docs/study.md).
StatusOr<nlohmann::json> RunContextKlStudy(
    LoadedModel& model, const std::string& text, const std::string& text_digest,
    const std::vector<SchemeSpec>& schemes, const ContextKlOptions& options, const std::string& dir,
    const std::function<void(const ContextKlProgress&)>& progress);

}  // namespace kvq
