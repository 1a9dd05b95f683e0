#include "study/study_gsm8k.h"

#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "engine/chat_template.h"
#include "io/mapped_file.h"
#include "io/sha256.h"
#include "study/study_decode.h"
#include "study/study_resume.h"

namespace kvq {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kInstruction =
    "Solve the following math problem step by step. At the end, write the final answer as a "
    "single number after \"The answer is\".\n\n";

// The digest `sums` (sha256sum's "HEX  NAME" lines) lists for `name`, or "".
std::string ListedDigest(const std::string& sums, const std::string& name) {
  std::istringstream in(sums);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string hex, file;
    fields >> hex >> file;
    if (!file.empty() && file[0] == '*') file.erase(0, 1);  // binary-mode marker
    if (file == name) return hex;
  }
  return "";
}

// The answer so far has said its final number: "answer is" followed later by
// a line break (a number may continue until then: "$18.50").
bool SaidTheAnswer(const std::string& text) {
  const size_t at = text.rfind("answer is");
  return at != std::string::npos && text.find('\n', at) != std::string::npos &&
         !LastNumber(text.substr(at)).empty();
}

// A base model continues with the next made-up question: cut it off.
std::string CutAtNextQuestion(const std::string& text) {
  const size_t at = text.find("\nQuestion:");
  return at == std::string::npos ? text : text.substr(0, at);
}

// The answers' decode arithmetic, as the results' configuration and the
// section record it.
constexpr char kGsm8kDecode[] =
    "batch-invariant: each answer's arithmetic is that of the answer decoded alone "
    "(BatchArith::kInvariant), whatever the decode batch";

// Whether two schemes' answers were all made on one and the same SIMD
// target: otherwise a pair's differences mix the scheme's effect with the
// targets' rounding.
bool OneSameSimdTarget(const Json& a_targets, const Json& b_targets) {
  return a_targets.size() == 1 && a_targets == b_targets && !a_targets.contains("");
}

// Every pair of the section's schemes (their summaries, in order) on the
// same problems: who got which right, and the exact McNemar p-value of the
// split. correct[s][i]: scheme s's outcome on problem i.
Json PairedComparisons(const Json& schemes, const std::vector<std::vector<bool>>& correct) {
  Json pairs = Json::array();
  for (size_t a = 0; a < schemes.size(); ++a) {
    for (size_t b = a + 1; b < schemes.size(); ++b) {
      int64_t only_a = 0, only_b = 0, both = 0, neither = 0;
      for (size_t i = 0; i < correct[a].size(); ++i) {
        const bool ra = correct[a][i], rb = correct[b][i];
        only_a += ra && !rb;
        only_b += rb && !ra;
        both += ra && rb;
        neither += !ra && !rb;
      }
      pairs.push_back({{"a", schemes[a]["name"]},
                       {"b", schemes[b]["name"]},
                       {"only_a_correct", only_a},
                       {"only_b_correct", only_b},
                       {"both_correct", both},
                       {"neither_correct", neither},
                       {"same_simd_target",
                        OneSameSimdTarget(schemes[a]["simd_targets"], schemes[b]["simd_targets"])},
                       {"mcnemar_exact_p", McNemarExactP(only_a, only_b)}});
    }
  }
  return pairs;
}

}  // namespace

std::string Gsm8kReference(const std::string& answer) {
  const size_t at = answer.rfind("####");
  if (at == std::string::npos) return "";
  return LastNumber(answer.substr(at + 4));
}

std::string LastNumber(const std::string& text) {
  std::string last;
  size_t i = 0;
  while (i < text.size()) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    const size_t start = i;
    std::string number;
    // Digits with thousands commas ("1,234") and one decimal point followed
    // by a digit ("2.5"; "5." ends a sentence).
    bool point = false;
    while (i < text.size()) {
      const char c = text[i];
      const bool next_digit =
          i + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1]));
      if (std::isdigit(static_cast<unsigned char>(c))) {
        number += c;
      } else if (c == ',' && next_digit) {
        // a thousands separator: skipped
      } else if (c == '.' && next_digit && !point) {
        point = true;
        number += c;
      } else {
        break;
      }
      ++i;
    }
    if (start > 0 && text[start - 1] == '-') number = "-" + number;
    last = number;
  }
  return last;
}

bool SameNumber(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  char* end_a = nullptr;
  char* end_b = nullptr;
  const double x = std::strtod(a.c_str(), &end_a), y = std::strtod(b.c_str(), &end_b);
  if (*end_a != '\0' || *end_b != '\0') return a == b;
  return std::fabs(x - y) <= 1e-6;
}

std::pair<double, double> WilsonInterval(int64_t k, int64_t n, double z) {
  if (n <= 0) return {0.0, 1.0};
  const double p = static_cast<double>(k) / static_cast<double>(n);
  const double z2n = z * z / static_cast<double>(n);
  const double center = (p + z2n / 2) / (1 + z2n);
  const double half =
      z * std::sqrt(p * (1 - p) / static_cast<double>(n) + z2n / (4.0 * static_cast<double>(n))) /
      (1 + z2n);
  // At k = 0 (k = n) the lower (upper) end is 0 (1) exactly; the formula's
  // two terms cancel there only up to rounding (6.9e-18 for 0/50).
  const double low = k <= 0 ? 0.0 : std::max(0.0, center - half);
  const double high = k >= n ? 1.0 : std::min(1.0, center + half);
  return {low, high};
}

double McNemarExactP(int64_t only_a, int64_t only_b) {
  const int64_t n = only_a + only_b, k = std::min(only_a, only_b);
  if (n <= 0 || k < 0) return 1.0;
  // Sum the smaller tail in log space: C(n, i) / 2^n underflows doubles for
  // n past about 1,070 problems, and GSM8K's test split has 1,319.
  const double log_half_n = -static_cast<double>(n) * std::log(2.0);
  const double log_n_fact = std::lgamma(static_cast<double>(n) + 1);
  double tail = 0;
  for (int64_t i = 0; i <= k; ++i) {
    tail += std::exp(log_n_fact - std::lgamma(static_cast<double>(i) + 1) -
                     std::lgamma(static_cast<double>(n - i) + 1) + log_half_n);
  }
  return std::min(1.0, 2 * tail);
}

StatusOr<std::vector<Gsm8kProblem>> LoadGsm8k(const std::string& path,
                                              const std::string& sha256sums) {
  if (!sha256sums.empty()) {
    KVQ_ASSIGN_OR_RETURN(std::string sums, ReadTextFile(sha256sums));
    const std::string name = fs::path(path).filename().string();
    const std::string want = ListedDigest(sums, name);
    if (want.empty()) return Status::Error(sha256sums + ": lists no digest for " + name);
    KVQ_ASSIGN_OR_RETURN(std::string got, Sha256File(path));
    if (got != want) {
      return Status::Error(path + ": sha256 " + got + " differs from " + want + " in " +
                           sha256sums + " (a different or damaged file)");
    }
  }
  KVQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  std::vector<Gsm8kProblem> problems;
  std::istringstream in(text);
  std::string line;
  for (int64_t n = 0; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const Json j = Json::parse(line, nullptr, false);
    const std::string where = path + ":" + std::to_string(n + 1);
    if (j.is_discarded() || !j.is_object() || !j.contains("question") || !j.contains("answer") ||
        !j["question"].is_string() || !j["answer"].is_string()) {
      return Status::Error(where + ": expected {\"question\": ..., \"answer\": ...}");
    }
    Gsm8kProblem p;
    p.index = static_cast<int64_t>(problems.size());
    p.question = j["question"].get<std::string>();
    p.reference = Gsm8kReference(j["answer"].get<std::string>());
    if (p.reference.empty()) return Status::Error(where + ": the answer has no '#### N'");
    problems.push_back(std::move(p));
  }
  if (problems.empty()) return Status::Error(path + ": no problems");
  return problems;
}

StatusOr<std::vector<int32_t>> Gsm8kPrompt(const LoadedModel& model, const std::string& question,
                                           bool chat) {
  const Tokenizer& tok = *model.tokenizer;
  EncodeOptions options;
  options.add_special = true;
  std::string text;
  if (chat) {
    KVQ_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::FromJinja(tok.chat_template()));
    text = tmpl.Render({{"user", kInstruction + question}}, /*add_generation_prompt=*/true);
    options.parse_special = true;
    if (!tmpl.bos_text.empty()) options.add_special = false;
  } else {
    text = "Question: " + question + "\nAnswer: Let's think step by step.";
  }
  std::vector<int32_t> ids = tok.Encode(text, options);
  if (ids.empty()) return Status::Error("empty GSM8K prompt");
  return ids;
}

StatusOr<int64_t> Gsm8kLongestPrompt(const LoadedModel& model,
                                     const std::vector<Gsm8kProblem>& data, int64_t problems,
                                     bool chat) {
  int64_t longest = 0;
  const int64_t n = std::min<int64_t>(problems, static_cast<int64_t>(data.size()));
  for (int64_t i = 0; i < n; ++i) {
    KVQ_ASSIGN_OR_RETURN(std::vector<int32_t> prompt,
                         Gsm8kPrompt(model, data[static_cast<size_t>(i)].question, chat));
    longest = std::max(longest, static_cast<int64_t>(prompt.size()));
  }
  return longest;
}

namespace {

// Answers the problems of the first n that `done` lacks with `scheme`'s
// cache, appending each to `log` (and `done`) as it finishes.
Status AnswerMissing(LoadedModel& model, const std::vector<Gsm8kProblem>& data,
                     const Gsm8kScheme& scheme, const Gsm8kOptions& o, int64_t n, ResultLog& log,
                     std::map<int64_t, Json>& done, Gsm8kProgress& p,
                     const std::function<void(const Gsm8kProgress&)>& progress) {
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, scheme.make_cache());
  PrefixRunner runner(model, *cache, BatchArith::kInvariant);
  GreedyStop stop;
  stop.max_tokens = o.max_new_tokens;
  stop.done = [](const std::string& text) {
    return SaidTheAnswer(text) || text.find("\nQuestion:") != std::string::npos;
  };
  std::vector<int64_t> todo;  // problem of each prompt
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t i = 0; i < n; ++i) {
    if (done.count(i)) continue;
    KVQ_ASSIGN_OR_RETURN(std::vector<int32_t> prompt,
                         Gsm8kPrompt(model, data[static_cast<size_t>(i)].question, o.chat));
    todo.push_back(i);
    prompts.push_back(std::move(prompt));
  }
  return runner.AnswerBatched(
      prompts, stop, o.batch, [&](size_t k, const GreedyResult& answer) -> Status {
        const int64_t i = todo[k];
        const Gsm8kProblem& problem = data[static_cast<size_t>(i)];
        const std::string text = CutAtNextQuestion(answer.text);
        const std::string predicted = LastNumber(text);
        Json record = {{"index", i},
                       {"correct", SameNumber(predicted, problem.reference)},
                       {"predicted", predicted},
                       {"reference", problem.reference},
                       {"generated_tokens", answer.tokens},
                       {"hit_token_limit", answer.hit_limit},
                       {"answer", text}};
        KVQ_RETURN_IF_ERROR(log.Append(record));
        done[i] = log.records().back();  // as stamped
        ++p.done;
        if (progress) progress(p);
        return Status::Ok();
      });
}

// One scheme's entry of the section's "schemes" from its answers to the
// first n problems; `correct` gets each problem's outcome, for the pairs.
Json SummarizeScheme(const std::string& name, std::map<int64_t, Json>& done, int64_t n,
                     std::vector<bool>& correct) {
  int64_t right = 0, tokens = 0, limited = 0;
  std::map<std::string, int64_t> targets;  // answers per SIMD target ("" = not recorded)
  for (int64_t i = 0; i < n; ++i) {
    const Json& r = done[i];
    ++targets[r.value("simd_target", std::string())];
    correct.push_back(r.value("correct", false));
    right += correct.back() ? 1 : 0;
    tokens += r.value("generated_tokens", int64_t{0});
    limited += r.value("hit_token_limit", false) ? 1 : 0;
  }
  const auto [low, high] = WilsonInterval(right, n);
  return {{"name", name},
          {"problems", n},
          {"correct", right},
          {"accuracy", static_cast<double>(right) / static_cast<double>(n)},
          {"wilson95_low", low},
          {"wilson95_high", high},
          {"mean_generated_tokens", static_cast<double>(tokens) / static_cast<double>(n)},
          {"hit_token_limit", limited},
          {"simd_targets", targets},
          {"example_answer", done[0].value("answer", std::string())}};
}

}  // namespace

StatusOr<Json> RunGsm8kStudy(LoadedModel& model, const std::vector<Gsm8kProblem>& data,
                             const std::vector<Gsm8kScheme>& schemes, const Gsm8kOptions& o,
                             const std::string& dir, const std::string& data_path,
                             const std::function<void(const Gsm8kProgress&)>& progress) {
  const int64_t n = std::min<int64_t>(o.problems, static_cast<int64_t>(data.size()));
  if (n < 1) return Status::Error("GSM8K: no problems to run");
  KVQ_ASSIGN_OR_RETURN(std::string digest, Sha256File(data_path));
  // Neither the problem count (a rerun may add problems) nor the decode
  // batch (the answers do not depend on it). Version 1's answers did: its
  // folders are refused.
  const Json config = {{"kvq_gsm8k_version", 2}, {"model", model.path},
                       {"data_sha256", digest},  {"max_new_tokens", o.max_new_tokens},
                       {"chat", o.chat},         {"decode", kGsm8kDecode}};
  KVQ_RETURN_IF_ERROR(PrepareResultDir(dir, config));
  Json list = Json::array();
  std::vector<std::vector<bool>> correct;  // [scheme][problem]
  for (const Gsm8kScheme& scheme : schemes) {
    const std::string path = (fs::path(dir) / (ResultFileStem(scheme.name) + ".jsonl")).string();
    KVQ_ASSIGN_OR_RETURN(ResultLog log, ResultLog::Open(path));
    std::map<int64_t, Json> done;
    // A problem recorded twice counts once, first (as the needle's trials).
    for (const Json& r : log.records()) done.emplace(r.value("index", int64_t{-1}), r);
    Gsm8kProgress p{scheme.name, 0, n};
    for (int64_t i = 0; i < n; ++i) p.done += done.count(i) ? 1 : 0;
    if (progress) progress(p);
    if (p.done < n) {
      const Status answered = AnswerMissing(model, data, scheme, o, n, log, done, p, progress);
      if (!answered.ok()) return answered.WithContext("GSM8K " + scheme.name);
    }
    correct.emplace_back();
    list.push_back(SummarizeScheme(scheme.name, done, n, correct.back()));
  }
  Json paired = PairedComparisons(list, correct);
  return Json{{"data", data_path},
              {"data_sha256", digest},
              {"problems", n},
              {"selection", "the first " + std::to_string(n) + " problems of the file"},
              {"chat", o.chat},
              {"max_new_tokens", o.max_new_tokens},
              {"decode_batch", o.batch},
              {"decode", kGsm8kDecode},
              {"rule",
               "greedy; the model's last number (commas dropped) equals the number after '####' "
               "in the reference; 95% Wilson interval; pairs: exact McNemar test on the same "
               "problems, same_simd_target false where the two were answered on different SIMD "
               "targets (their rounding differs too)"},
              {"results_dir", dir},
              {"schemes", std::move(list)},
              {"paired", std::move(paired)}};
}

}  // namespace kvq
