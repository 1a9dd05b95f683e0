// RunNeedleStudy: every scheme over every (task, context, depth) cell, f16
// first, results appended per cell (resumable), prompts of a cell on forks
// of their shared prefix.
#include <algorithm>
#include <cctype>
#include <cmath>
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

// (task, context) -> f16's (correct, trials) over the context's depths.
using F16Tally = std::map<std::pair<int, int64_t>, std::pair<int, int>>;

// Whether f16 passes at (task, context): ran there and reached kF16PassRate.
bool F16Passes(const F16Tally& tally, NeedleTask task, int64_t context) {
  const auto it = tally.find({static_cast<int>(task), context});
  return it != tally.end() && it->second.second > 0 &&
         it->second.first >= kF16PassRate * it->second.second;
}

struct CellResult {
  int correct = 0, trials = 0;
  std::string example;                      // the first trial's answer
  std::map<std::string, int> simd_targets;  // trials per SIMD target ("" = not recorded)
};

// The trial numbers a cell's file holds.
std::set<int> RecordedTrials(const ResultLog& log) {
  std::set<int> done;
  for (const Json& r : log.records()) {
    if (r.contains("trial") && r["trial"].is_number_integer()) done.insert(r["trial"].get<int>());
  }
  return done;
}

// Runs (or resumes) one cell, appending to its opened file; returns its
// tally over every recorded trial. on_trial(): one more trial of the cell is
// done (the recorded ones are not reported: the caller counts them first).
StatusOr<CellResult> RunCell(LoadedModel& model, PrefixRunner& runner, const Cell& cell,
                             const NeedleOptions& o, ResultLog& log,
                             const std::function<void()>& on_trial) {
  const std::set<int> done = RecordedTrials(log);
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
    if (on_trial) on_trial();
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

// One scheme's run over cells given in batches (f16's longer contexts are
// chosen from its results at the shorter ones): its cache, the prefix runner
// over it, its result folder and the JSON list of the cells it ran.
class SchemeRun {
 public:
  static StatusOr<std::unique_ptr<SchemeRun>> Start(LoadedModel& model, const NeedleScheme& scheme,
                                                    const std::string& dir) {
    KVQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, scheme.make_cache());
    const std::string scheme_dir = (fs::path(dir) / ResultFileStem(scheme.name)).string();
    std::error_code ec;
    fs::create_directories(scheme_dir, ec);
    if (ec) return Status::Error(scheme_dir + ": " + ec.message());
    return std::unique_ptr<SchemeRun>(
        new SchemeRun(model, scheme.name, std::move(cache), scheme_dir));
  }

  // Runs (or resumes) `cells`; calls on_cell(cell, result) after each.
  Status Run(const std::vector<Cell>& cells, const NeedleOptions& o,
             const std::function<void(const NeedleProgress&)>& progress,
             const std::function<void(const Cell&, const CellResult&)>& on_cell) {
    progress_.total += static_cast<int64_t>(cells.size()) * o.trials;
    // The recorded trials are counted up front, so that what is left is
    // what will run (the progress lines' time left is measured on it).
    int64_t recorded = 0;
    std::vector<ResultLog> logs;  // [cells.size()]
    for (const Cell& cell : cells) {
      const std::string path = (fs::path(scheme_dir_) / CellFile(cell)).string();
      auto log = ResultLog::Open(path);
      if (!log.ok()) return log.status().WithContext("needle " + progress_.scheme);
      for (int t : RecordedTrials(*log)) recorded += t < o.trials ? 1 : 0;
      logs.push_back(std::move(*log));
    }
    progress_.done += recorded;
    if (recorded > 0 && progress) progress(progress_);
    for (size_t i = 0; i < cells.size(); ++i) {
      const Cell& cell = cells[i];
      auto result = RunCell(model_, runner_, cell, o, logs[i], [&] {
        ++progress_.done;
        if (progress) progress(progress_);
      });
      if (!result.ok()) {
        return result.status().WithContext("needle " + progress_.scheme + " " + CellFile(cell));
      }
      if (on_cell) on_cell(cell, *result);
      cells_.push_back({{"task", NeedleTaskName(cell.task)},
                        {"context", cell.context},
                        {"depth", cell.depth},
                        {"correct", result->correct},
                        {"trials", result->trials},
                        {"simd_targets", result->simd_targets},
                        {"example_answer", result->example}});
    }
    return Status::Ok();
  }

  const PrefixRunner& runner() const { return runner_; }
  Json TakeCells() { return std::move(cells_); }

 private:
  SchemeRun(LoadedModel& model, const std::string& name, std::unique_ptr<KvCache> cache,
            std::string scheme_dir)
      : model_(model),
        cache_(std::move(cache)),
        runner_(model, *cache_),
        scheme_dir_(std::move(scheme_dir)),
        progress_{name, 0, 0} {}

  LoadedModel& model_;
  std::unique_ptr<KvCache> cache_;
  PrefixRunner runner_;
  std::string scheme_dir_;
  NeedleProgress progress_;
  Json cells_ = Json::array();
};

std::vector<Cell> CellsAt(const std::vector<NeedleTask>& tasks, int64_t context,
                          const std::vector<double>& depths) {
  std::vector<Cell> cells;
  for (NeedleTask task : tasks) {
    for (double d : depths) cells.push_back({task, context, d});
  }
  return cells;
}

Status CheckOptions(const NeedleOptions& o) {
  if (o.trials < 1 || o.tasks.empty() || o.contexts.empty() || o.depths.empty()) {
    return Status::Error("needle study: needs tasks, contexts, depths and at least one trial");
  }
  const int64_t longest = *std::max_element(o.contexts.begin(), o.contexts.end());
  for (size_t i = 0; i < o.extend_contexts.size(); ++i) {
    const int64_t c = o.extend_contexts[i];
    if (c <= longest || (i > 0 && c <= o.extend_contexts[i - 1])) {
      return Status::Error("needle study: extension contexts must ascend beyond every context (" +
                           std::to_string(c) + ")");
    }
  }
  return Status::Ok();
}

// Per task: where f16 passes, and what it reached where it does not; and the
// statement saying so in one line.
std::pair<Json, std::string> PerTask(const NeedleOptions& o, const F16Tally& f16_tally) {
  Json tasks = Json::array();
  std::string statement;
  for (NeedleTask task : o.tasks) {
    Json passing = Json::array();
    double best = 0;
    std::string failing_longer;  // contexts past the last passing one where f16 ran and failed
    for (int64_t c : AllContexts(o)) {
      const auto it = f16_tally.find({static_cast<int>(task), c});
      if (it == f16_tally.end() || it->second.second == 0) continue;
      const auto [k, n] = it->second;
      best = std::max(best, static_cast<double>(k) / n);
      if (F16Passes(f16_tally, task, c)) {
        passing.push_back(c);
        failing_longer.clear();
      } else if (!passing.empty()) {
        failing_longer += (failing_longer.empty() ? "" : ", ") + std::to_string(c) + " (" +
                          std::to_string(std::lround(100.0 * k / n)) + "%)";
      }
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
      if (!failing_longer.empty()) line += ", not at " + failing_longer;
    }
    statement += (statement.empty() ? "" : "; ") + line;
    tasks.push_back({{"task", NeedleTaskName(task)},
                     {"f16_passing_contexts", passing},
                     {"model_can_do", !passing.empty()},
                     {"best_f16_accuracy", best}});
  }
  return {std::move(tasks), std::move(statement)};
}

}  // namespace

std::vector<int64_t> AllContexts(const NeedleOptions& o) {
  std::vector<int64_t> all = o.contexts;
  all.insert(all.end(), o.extend_contexts.begin(), o.extend_contexts.end());
  return all;
}

StatusOr<Json> RunNeedleStudy(LoadedModel& model, const std::vector<NeedleScheme>& schemes,
                              const NeedleOptions& o, const std::string& dir,
                              const std::function<void(const NeedleProgress&)>& progress) {
  if (schemes.empty()) return Status::Error("needle study: no schemes");
  KVQ_RETURN_IF_ERROR(CheckOptions(o));
  KVQ_RETURN_IF_ERROR(PrepareResultDir(dir, ConfigJson(model, o)));
  F16Tally f16_tally;
  const auto tally_f16 = [&](const Cell& cell, const CellResult& r) {
    auto& t = f16_tally[{static_cast<int>(cell.task), cell.context}];
    t.first += r.correct;
    t.second += r.trials;
  };
  // f16: every base cell, then each extension context for the tasks it has
  // passed at every shorter one (the task's longest passing length, without
  // spending the long prompts on tasks the model already fails).
  std::vector<Cell> f16_cells;
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<SchemeRun> f16, SchemeRun::Start(model, schemes[0], dir));
  for (int64_t c : o.contexts) {
    const std::vector<Cell> cells = CellsAt(o.tasks, c, o.depths);
    KVQ_RETURN_IF_ERROR(f16->Run(cells, o, progress, tally_f16));
    f16_cells.insert(f16_cells.end(), cells.begin(), cells.end());
  }
  std::vector<int64_t> shorter = o.contexts;
  for (int64_t c : o.extend_contexts) {
    std::vector<NeedleTask> still;
    for (NeedleTask t : o.tasks) {
      if (std::all_of(shorter.begin(), shorter.end(),
                      [&](int64_t s) { return F16Passes(f16_tally, t, s); })) {
        still.push_back(t);
      }
    }
    const std::vector<Cell> cells = CellsAt(still, c, o.depths);
    KVQ_RETURN_IF_ERROR(f16->Run(cells, o, progress, tally_f16));
    f16_cells.insert(f16_cells.end(), cells.begin(), cells.end());
    shorter.push_back(c);
  }
  Json scheme_list = Json::array();
  int64_t computed = f16->runner().tokens_computed(), shared = f16->runner().tokens_shared();
  scheme_list.push_back({{"name", schemes[0].name}, {"cells", f16->TakeCells()}});
  f16.reset();
  // Every other scheme where f16 passes.
  std::vector<Cell> passing_cells;
  for (const Cell& c : f16_cells) {
    if (F16Passes(f16_tally, c.task, c.context)) passing_cells.push_back(c);
  }
  for (size_t i = 1; i < schemes.size(); ++i) {
    KVQ_ASSIGN_OR_RETURN(std::unique_ptr<SchemeRun> run, SchemeRun::Start(model, schemes[i], dir));
    KVQ_RETURN_IF_ERROR(run->Run(passing_cells, o, progress, nullptr));
    computed += run->runner().tokens_computed();
    shared += run->runner().tokens_shared();
    scheme_list.push_back({{"name", schemes[i].name}, {"cells", run->TakeCells()}});
  }
  auto [tasks, statement] = PerTask(o, f16_tally);
  Json task_names = Json::array();
  for (NeedleTask t : o.tasks) task_names.push_back(NeedleTaskName(t));
  return Json{{"tasks", task_names},
              {"contexts", AllContexts(o)},
              {"extend_contexts", o.extend_contexts},
              {"depths", o.depths},
              {"trials", o.trials},
              {"seed", o.seed},
              {"chat", o.chat},
              {"results_dir", dir},
              {"f16_pass_rate", kF16PassRate},
              {"rule",
               "exact match: the first numbers of the greedy answer are the needle's values (all "
               "4 for multivalue, any order); other schemes run only at the (task, context) "
               "pairs where f16 is correct in >= 90% of the trials over all depths; f16 runs an "
               "extension context only for the tasks it passes at every shorter one"},
              {"per_task", std::move(tasks)},
              {"statement", statement},
              {"tokens_computed", computed},
              {"tokens_from_shared_prefix", shared},
              {"schemes", std::move(scheme_list)}};
}

}  // namespace kvq
