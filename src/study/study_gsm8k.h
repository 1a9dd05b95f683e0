// kvq study: GSM8K reasoning accuracy per cache scheme. Greedy generation on
// the same problems for every scheme (the first N of the test split), the
// model's last number compared with the number after '####' in the
// reference, accuracy with a 95% Wilson interval. Results are appended per
// (scheme, problem) to dir/<scheme>.jsonl, so a killed run resumes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/loaded_model.h"
#include "kv/kv_cache.h"

namespace kvq {

struct Gsm8kProblem {
  int64_t index = 0;  // line in the file, from 0
  std::string question;
  std::string reference;  // the number after '####', commas removed
};

// Reads the split (one {"question", "answer"} object a line). With a
// non-empty `sha256sums` (a `sha256sum` listing naming the file by its base
// name), the file's digest must match first.
StatusOr<std::vector<Gsm8kProblem>> LoadGsm8k(const std::string& path,
                                              const std::string& sha256sums);

// "...#### 1,234" -> "1234"; "" when there is no '####'.
std::string Gsm8kReference(const std::string& answer);
// The last number in `text` ("-1,234.50" -> "-1234.50"; a trailing '.' is
// punctuation), or "" when there is none.
std::string LastNumber(const std::string& text);
// Numeric equality of two extracted numbers (1e-6 absolute).
bool SameNumber(const std::string& a, const std::string& b);

// 95% Wilson score interval of k successes in n trials: {low, high}.
std::pair<double, double> WilsonInterval(int64_t k, int64_t n, double z = 1.959963984540054);

// Two-sided exact McNemar test for two schemes answering the same problems:
// `only_a` problems only scheme A got right, `only_b` only B. Under "neither
// is better" each of those discordant problems is a fair coin, so the p-value
// is the Binomial(only_a + only_b, 1/2) probability of a split at least as
// uneven, both tails (1 when there is no discordant problem). Paired, it
// sees differences that two overlapping Wilson intervals cannot.
double McNemarExactP(int64_t only_a, int64_t only_b);

struct Gsm8kOptions {
  int64_t problems = 250;  // the first N of the split
  int max_new_tokens = 320;
  bool chat = true;  // the model's chat template (off for a model without one)
  // Answers decoding together (PrefixRunner::AnswerBatched): the
  // projections read each weight block once per step for all of them. They
  // decode under BatchArith::kInvariant, so each answer is the one decoded
  // alone and the batch is not part of the results' configuration: a run may
  // resume with another.
  int64_t batch = 1;
};

// The longest prompt of the first `problems` of `data`, in tokens (the cache
// is sized from it).
StatusOr<int64_t> Gsm8kLongestPrompt(const LoadedModel& model,
                                     const std::vector<Gsm8kProblem>& data, int64_t problems,
                                     bool chat);

// The prompt's tokens for one problem (chat template when options.chat).
StatusOr<std::vector<int32_t>> Gsm8kPrompt(const LoadedModel& model, const std::string& question,
                                           bool chat);

struct Gsm8kScheme {
  std::string name;
  std::function<StatusOr<std::unique_ptr<KvCache>>()> make_cache;
};
struct Gsm8kProgress {
  std::string scheme;
  int64_t done = 0, total = 0;
};

// Returns the study JSON's "gsm8k" section (docs/study.md).
StatusOr<nlohmann::json> RunGsm8kStudy(LoadedModel& model, const std::vector<Gsm8kProblem>& data,
                                       const std::vector<Gsm8kScheme>& schemes,
                                       const Gsm8kOptions& options, const std::string& dir,
                                       const std::string& data_path,
                                       const std::function<void(const Gsm8kProgress&)>& progress);

}  // namespace kvq
