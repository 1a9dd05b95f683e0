// RunNeedleStudy: every scheme over every (task, context, depth) cell, f16
// first, results appended per cell (resumable), prompts of a cell on forks
// of their shared prefix.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "study/study.h"
#include "study/study_decode.h"
#include "study/study_niah.h"
#include "study/study_resume.h"

namespace kvq {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// f16 must reach this accuracy at a (task, context) for the other schemes to
// be measured there: below it the model itself cannot do the task, and a
// scheme's failures there would say nothing about the cache.
constexpr double kF16PassRate = 0.9;

struct Cell {
  NeedleTask task;
  int64_t context;
  double depth;
};

std::string CellFile(const Cell& c) {
  char depth[16];
  std::snprintf(depth, sizeof(depth), "%.3f", c.depth);
  return std::string(NeedleTaskName(c.task)) + "_c" + std::to_string(c.context) + "_d" + depth +
         ".jsonl";
}

struct CellResult {
  int correct = 0, trials = 0;
  std::string example;                      // the first trial's answer
  std::map<std::string, int> simd_targets;  // trials per SIMD target ("" = not recorded)
};

// Runs (or resumes) one cell; returns its tally over every recorded trial.
// on_trials(n): n more trials of the cell are done (recorded ones first).
StatusOr<CellResult> RunCell(LoadedModel& model, PrefixRunner& runner, const Cell& cell,
                             const NeedleOptions& o, const std::string& path,
                             const std::function<void(int64_t)>& on_trials) {
  KVQ_ASSIGN_OR_RETURN(ResultLog log, ResultLog::Open(path));
  std::set<int> done;
  for (const Json& r : log.records()) {
    if (r.contains("trial") && r["trial"].is_number_integer()) done.insert(r["trial"].get<int>());
  }
  int64_t recorded = 0;
  for (int t : done) recorded += t < o.trials ? 1 : 0;
  if (recorded > 0 && on_trials) on_trials(recorded);
  std::vector<int> todo;
  std::vector<NeedlePrompt> prompts;
  for (int t = 0; t < o.trials; ++t) {
    if (done.count(t)) continue;
    KVQ_ASSIGN_OR_RETURN(NeedlePrompt p, BuildNeedlePrompt(model, cell.task, cell.context,
                                                           cell.depth, t, o.seed, o.chat));
    todo.push_back(t);
    prompts.push_back(std::move(p));
  }
  std::vector<std::vector<int32_t>> tokens;
  for (const NeedlePrompt& p : prompts) tokens.push_back(p.tokens);
  // One trial alone gains nothing from a prefix (and its whole prompt would be one).
  size_t shared = tokens.size() > 1 ? CommonPrefixLength(tokens) : 0;
  for (const auto& t : tokens) shared = std::min(shared, t.size() - 1);  // each keeps a tail
  std::vector<int32_t> prefix;
  if (shared > 0) prefix.assign(tokens[0].begin(), tokens[0].begin() + shared);
  KVQ_RETURN_IF_ERROR(runner.SetPrefix(prefix));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const NeedlePrompt& p = prompts[i];
    GreedyStop stop;
    stop.max_tokens = NeedleAnswerTokens(cell.task);
    const size_t want = p.values.size();
    stop.done = [want](const std::string& text) {
      // Enough complete numbers: the answer cannot change its score.
      size_t runs = 0;
      for (size_t k = 0; k < text.size(); ++k) {
        const bool digit = std::isdigit(static_cast<unsigned char>(text[k])) != 0;
        const bool next_digit =
            k + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[k + 1])) != 0;
        if (digit && !next_digit && k + 1 < text.size()) ++runs;
      }
      return runs >= want;
    };
    KVQ_ASSIGN_OR_RETURN(std::string answer, runner.Answer(p.tokens, stop));
    Json values = Json::array();
    for (const std::string& v : p.values) values.push_back(v);
    KVQ_RETURN_IF_ERROR(log.Append({{"trial", todo[i]},
                                    {"correct", NeedleAnswerCorrect(answer, p.values)},
                                    {"answer", answer},
                                    {"key", p.key},
                                    {"values", values},
                                    {"prompt_tokens", static_cast<int64_t>(p.tokens.size())},
                                    {"needle_position", p.needle_position}}));
    if (on_trials) on_trials(1);
  }
  KVQ_RETURN_IF_ERROR(runner.SetPrefix({}));
  CellResult r;
  std::set<int> counted;
  for (const Json& rec : log.records()) {
    const int t = rec.value("trial", -1);
    if (t < 0 || t >= o.trials || !counted.insert(t).second) continue;
    ++r.trials;
    r.correct += rec.value("correct", false) ? 1 : 0;
    ++r.simd_targets[rec.value("simd_target", std::string())];
    if (t == 0) r.example = rec.value("answer", std::string());
  }
  return r;
}

// What a trial's prompt depends on besides its cell. The grid itself (tasks,
// contexts, depths) and the trial count are not part of it: each cell has its
// own file, so a rerun may add trials, or narrow or widen the grid, and reuse
// every cell already recorded.
Json ConfigJson(const LoadedModel& model, const NeedleOptions& o) {
  return {{"kvq_needle_version", 1}, {"model", model.path}, {"seed", o.seed}, {"chat", o.chat}};
}

}  // namespace

StatusOr<Json> RunNeedleStudy(LoadedModel& model, const std::vector<NeedleScheme>& schemes,
                              const NeedleOptions& o, const std::string& dir,
                              const std::function<void(const NeedleProgress&)>& progress) {
  if (schemes.empty()) return Status::Error("needle study: no schemes");
  if (o.trials < 1 || o.tasks.empty() || o.contexts.empty() || o.depths.empty()) {
    return Status::Error("needle study: needs tasks, contexts, depths and at least one trial");
  }
  KVQ_RETURN_IF_ERROR(PrepareResultDir(dir, ConfigJson(model, o)));
  std::vector<Cell> cells;
  for (NeedleTask task : o.tasks) {
    for (int64_t c : o.contexts) {
      for (double d : o.depths) cells.push_back({task, c, d});
    }
  }
  // (task, context) -> f16 accuracy over its depths.
  std::map<std::pair<int, int64_t>, std::pair<int, int>> f16_tally;
  auto passes = [&](NeedleTask task, int64_t context) {
    const auto& [c, n] = f16_tally[{static_cast<int>(task), context}];
    return n > 0 && c >= kF16PassRate * n;
  };
  Json scheme_list = Json::array();
  int64_t computed = 0, shared = 0;
  for (const NeedleScheme& scheme : schemes) {
    const bool is_f16 = &scheme == &schemes[0];
    std::vector<Cell> run;
    for (const Cell& c : cells) {
      if (is_f16 || passes(c.task, c.context)) run.push_back(c);
    }
    KVQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, scheme.make_cache());
    PrefixRunner runner(model, *cache);
    const std::string scheme_dir = (fs::path(dir) / ResultFileStem(scheme.name)).string();
    std::error_code ec;
    fs::create_directories(scheme_dir, ec);
    if (ec) return Status::Error(scheme_dir + ": " + ec.message());
    NeedleProgress p{scheme.name, 0, static_cast<int64_t>(run.size()) * o.trials};
    Json list = Json::array();
    for (const Cell& cell : run) {
      const std::string path = (fs::path(scheme_dir) / CellFile(cell)).string();
      auto result = RunCell(model, runner, cell, o, path, [&](int64_t n) {
        p.done += n;
        if (progress) progress(p);
      });
      if (!result.ok()) {
        return result.status().WithContext("needle " + scheme.name + " " + CellFile(cell));
      }
      if (is_f16) {
        auto& t = f16_tally[{static_cast<int>(cell.task), cell.context}];
        t.first += result->correct;
        t.second += result->trials;
      }
      list.push_back({{"task", NeedleTaskName(cell.task)},
                      {"context", cell.context},
                      {"depth", cell.depth},
                      {"correct", result->correct},
                      {"trials", result->trials},
                      {"simd_targets", result->simd_targets},
                      {"example_answer", result->example}});
    }
    computed += runner.tokens_computed();
    shared += runner.tokens_shared();
    scheme_list.push_back({{"name", scheme.name}, {"cells", std::move(list)}});
  }
  // Per task: where f16 passes, and what it reached where it does not.
  Json tasks = Json::array();
  std::string statement;
  for (NeedleTask task : o.tasks) {
    Json passing = Json::array();
    double best = 0;
    for (int64_t c : o.contexts) {
      const auto& [k, n] = f16_tally[{static_cast<int>(task), c}];
      if (n > 0) best = std::max(best, static_cast<double>(k) / n);
      if (passes(task, c)) passing.push_back(c);
    }
    std::string line = std::string(NeedleTaskName(task)) + ": ";
    if (passing.empty()) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), "the model cannot do it at any length (best f16 %.0f%%)",
                    100 * best);
      line += buf;
    } else {
      line += "f16 >= 90% at context";
      for (size_t i = 0; i < passing.size(); ++i) {
        line += (i                    ? ", "
                 : passing.size() > 1 ? "s "
                                      : " ") +
                std::to_string(passing[i].get<int64_t>());
      }
    }
    statement += (statement.empty() ? "" : "; ") + line;
    tasks.push_back({{"task", NeedleTaskName(task)},
                     {"f16_passing_contexts", passing},
                     {"model_can_do", !passing.empty()},
                     {"best_f16_accuracy", best}});
  }
  Json task_names = Json::array();
  for (NeedleTask t : o.tasks) task_names.push_back(NeedleTaskName(t));
  return Json{{"tasks", task_names},
              {"contexts", o.contexts},
              {"depths", o.depths},
              {"trials", o.trials},
              {"seed", o.seed},
              {"chat", o.chat},
              {"results_dir", dir},
              {"f16_pass_rate", kF16PassRate},
              {"rule",
               "exact match: the first numbers of the greedy answer are the needle's values (all "
               "4 for multivalue, any order); other schemes run only at the (task, context) "
               "pairs where f16 is correct in >= 90% of the trials over all depths"},
              {"per_task", std::move(tasks)},
              {"statement", statement},
              {"tokens_computed", computed},
              {"tokens_from_shared_prefix", shared},
              {"schemes", std::move(scheme_list)}};
}

}  // namespace kvq
