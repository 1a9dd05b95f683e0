// The study's long stages on a tiny synthetic model: needle-in-a-haystack
// prompts and scoring, GSM8K parsing and scoring, prefix sharing through
// forks, and resuming from the per-cell result files.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "io/mapped_file.h"
#include "kv/kv_factory.h"
#include "study/study.h"
#include "study/study_context_kl.h"
#include "study/study_decode.h"
#include "study/study_e2e.h"
#include "study/study_gsm8k.h"
#include "study/study_niah.h"
#include "study/study_resume.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

// A random-weight Qwen2 with a byte vocabulary (one byte = one token) and a
// 640-token context: room for a needle prompt's fixed text (~250 bytes).
class StudyTasksTest : public test_util::TinyModelTest {
 protected:
  static void SetUpTestSuite() {
    WriteSuiteModel({.max_positions = 640, .seed = 11, .head_dim_64 = true});
  }
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(LoadTinyModel(1)); }
  std::unique_ptr<KvCache> Cache(const std::string& type, int64_t tokens) {
    SchemeSpec spec{type, type, type, false, ""};
    KvCacheOptions o = SchemeCacheOptions(spec, tokens, model_.transformer->pool());
    o.memory_bytes = 0;
    auto plan = PlanKvType(model_.transformer->kv_shape(), o);
    EXPECT_TRUE(plan.ok());
    o.memory_bytes = static_cast<size_t>(2 * ExactKvBytes(plan->layout, 1, tokens));
    auto cache = MakeKvCache(model_.transformer->kv_shape(), o);
    EXPECT_TRUE(cache.ok()) << cache.status().message();
    return std::move(cache).value();
  }
  std::string Text(const std::vector<int32_t>& ids) { return model_.tokenizer->Decode(ids); }
};

// A prompt has exactly context - answer room tokens; the asked needle sits
// at needle_position, at the start for depth 0 and last for depth 1; keys
// are the asked one, values 7 digits.
TEST_F(StudyTasksTest, NeedlePromptHasTheRequestedLengthAndNeedle) {
  for (NeedleTask task : {NeedleTask::kSingleRepeat, NeedleTask::kSingleNeedle,
                          NeedleTask::kMultiKeyRepeat, NeedleTask::kMultiValueRepeat}) {
    for (double depth : {0.0, 0.5, 1.0}) {
      auto p = BuildNeedlePrompt(model_, task, 600, depth, 3, 99, false);
      ASSERT_TRUE(p.ok()) << NeedleTaskName(task) << ": " << p.status().message();
      EXPECT_EQ(static_cast<int64_t>(p->tokens.size()), 600 - NeedleAnswerTokens(task));
      const std::string text = Text(p->tokens);
      const std::string needle = " One special number for " + p->key + " is " + p->values[0] + ".";
      const std::string at =
          Text(std::vector<int32_t>(p->tokens.begin() + p->needle_position, p->tokens.end()));
      EXPECT_EQ(at.rfind(needle, 0), 0u) << NeedleTaskName(task) << " depth " << depth;
      EXPECT_NE(text.find("What " +
                          std::string(task == NeedleTask::kMultiValueRepeat
                                          ? "are all the special numbers for "
                                          : "is the special number for ") +
                          p->key + "?"),
                std::string::npos);
      for (const std::string& v : p->values) {
        EXPECT_EQ(v.size(), 7u);
        EXPECT_NE(text.find(" is " + v + "."), std::string::npos);
      }
      EXPECT_EQ(p->values.size(), task == NeedleTask::kMultiValueRepeat ? 4u : 1u);
      if (depth == 0.0) {
        EXPECT_LT(p->needle_position, 200);  // right after the instruction
      }
      if (depth == 1.0 && task != NeedleTask::kMultiValueRepeat &&
          task != NeedleTask::kMultiKeyRepeat) {
        // Nothing but the question after the needle.
        EXPECT_EQ(at.substr(needle.size(), 11), "\n\nQuestion:") << at;
      }
    }
  }
  // The asked key appears in the needle and the question only: distractors
  // never carry it.
  auto p = BuildNeedlePrompt(model_, NeedleTask::kSingleNeedle, 600, 0.5, 1, 99, false);
  ASSERT_TRUE(p.ok());
  const std::string text = Text(p->tokens);
  size_t count = 0;
  for (size_t at = text.find(p->key); at != std::string::npos; at = text.find(p->key, at + 1))
    ++count;
  EXPECT_EQ(count, 3u);  // needle, question, answer prefix
  EXPECT_FALSE(BuildNeedlePrompt(model_, NeedleTask::kSingleRepeat, 200, 0.5, 0, 1, false).ok());
}

// Seeded per (task, context, depth, trial): the same prompt every time, and
// the trials of a cell share their text up to the asked needle.
TEST_F(StudyTasksTest, NeedleTrialsAreSeededAndShareTheirPrefix) {
  auto a = BuildNeedlePrompt(model_, NeedleTask::kMultiKeyRepeat, 600, 0.5, 0, 7, false);
  auto b = BuildNeedlePrompt(model_, NeedleTask::kMultiKeyRepeat, 600, 0.5, 0, 7, false);
  auto c = BuildNeedlePrompt(model_, NeedleTask::kMultiKeyRepeat, 600, 0.5, 1, 7, false);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_NE(a->tokens, c->tokens);
  const size_t shared = CommonPrefixLength({a->tokens, c->tokens});
  EXPECT_GE(shared + 40, static_cast<size_t>(std::min(a->needle_position, c->needle_position)));
  EXPECT_GT(shared, 100u);
}

TEST(StudyNeedleScoreTest, ExactMatchOfTheFirstNumbers) {
  EXPECT_TRUE(NeedleAnswerCorrect(" 1234567.", {"1234567"}));
  EXPECT_FALSE(NeedleAnswerCorrect(" 1234568.", {"1234567"}));
  EXPECT_FALSE(NeedleAnswerCorrect(" 123456", {"1234567"}));
  EXPECT_FALSE(NeedleAnswerCorrect(" 7654321 and 1234567", {"1234567"}));  // the first counts
  EXPECT_TRUE(NeedleAnswerCorrect(" 3333333, 1111111, 4444444 and 2222222.",
                                  {"1111111", "2222222", "3333333", "4444444"}));
  EXPECT_FALSE(NeedleAnswerCorrect(" 3333333, 1111111, 1111111 and 2222222.",
                                   {"1111111", "2222222", "3333333", "4444444"}));
  EXPECT_FALSE(NeedleAnswerCorrect("", {"1"}));
  auto t = ParseNeedleTask("multivalue_repeat");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, NeedleTask::kMultiValueRepeat);
  EXPECT_FALSE(ParseNeedleTask("single").ok());
}

// A prompt answered on a fork of its prefilled prefix gives the same greedy
// answer as the whole prompt run alone, and recomputes only its tail.
TEST_F(StudyTasksTest, ForkedPrefixGivesTheSameAnswer) {
  auto p = BuildNeedlePrompt(model_, NeedleTask::kSingleRepeat, 600, 0.75, 0, 5, false);
  ASSERT_TRUE(p.ok());
  for (const char* type : {"f16", "kivi2"}) {
    std::unique_ptr<KvCache> cache = Cache(type, 600);
    GreedyStop stop;
    stop.max_tokens = 8;
    std::string alone, forked;
    {
      PrefixRunner runner(model_, *cache);
      auto a = runner.Answer(p->tokens, stop);
      ASSERT_TRUE(a.ok()) << a.status().message();
      alone = *a;
    }
    PrefixRunner runner(model_, *cache);
    const std::vector<int32_t> prefix(p->tokens.begin(), p->tokens.begin() + p->needle_position);
    ASSERT_TRUE(runner.SetPrefix(prefix).ok());
    const int64_t before = runner.tokens_computed();
    auto b = runner.Answer(p->tokens, stop);
    ASSERT_TRUE(b.ok()) << b.status().message();
    forked = *b;
    EXPECT_EQ(forked, alone) << type;
    EXPECT_EQ(runner.tokens_shared(), p->needle_position);
    EXPECT_LE(runner.tokens_computed() - before,
              static_cast<int64_t>(p->tokens.size()) - p->needle_position + stop.max_tokens);
    // A second prompt on the same prefix works too (the fork was released).
    EXPECT_TRUE(runner.Answer(p->tokens, stop).ok());
    EXPECT_FALSE(runner.Answer(prefix, stop).ok());  // not longer than the prefix
  }
}

// Batched decoding gives every prompt the answer it gets alone (below
// ops::kPackedMinTokens rows the projections are row by row), with and
// without a shared prefix, whatever the batch size; answers that stop early
// (stop.done, an end token, the limit) free their slot for the next prompt.
TEST_F(StudyTasksTest, BatchedAnswersEqualOneAtATime) {
  // Random text after a shared opening, so the answers differ.
  std::mt19937 rng(23);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 7; ++i) {
    std::string text = "Shared opening of every prompt. ";
    for (int c = 0; c < 40 + 13 * i; ++c) text += static_cast<char>('a' + rng() % 26);
    EncodeOptions options;
    options.add_special = true;
    prompts.push_back(model_.tokenizer->Encode(text, options));
  }
  GreedyStop stop;
  stop.max_tokens = 9;
  // Stops some answers early, at a text-dependent point.
  stop.done = [](const std::string& text) {
    return text.size() >= 2 && static_cast<unsigned char>(text.back()) % 5 == 0;
  };
  for (const char* type : {"f16", "kivi2"}) {
    SchemeSpec spec{type, type, type, false, ""};
    KvCacheOptions o = SchemeCacheOptions(spec, 640, model_.transformer->pool());
    auto plan = PlanKvType(model_.transformer->kv_shape(), o);
    ASSERT_TRUE(plan.ok());
    o.memory_bytes = static_cast<size_t>(ExactKvBytes(plan->layout, 6, 640));
    auto cache = MakeKvCache(model_.transformer->kv_shape(), o);
    ASSERT_TRUE(cache.ok()) << cache.status().message();
    for (size_t prefix : {size_t{0}, CommonPrefixLength(prompts)}) {
      PrefixRunner runner(model_, **cache);
      ASSERT_TRUE(
          runner.SetPrefix(std::vector<int32_t>(prompts[0].begin(), prompts[0].begin() + prefix))
              .ok());
      std::vector<GreedyResult> alone;
      for (const auto& prompt : prompts) {
        auto a = runner.Answer(prompt, stop);
        ASSERT_TRUE(a.ok()) << a.status().message();
        alone.push_back({*a, runner.last_answer_tokens(), runner.last_hit_limit()});
      }
      int limited = 0;
      for (const GreedyResult& a : alone) limited += a.hit_limit ? 1 : 0;
      EXPECT_GT(limited, 0) << "some answers should run to the limit";
      EXPECT_LT(limited, 7) << "some answers should stop early";
      for (int64_t batch : {1, 3, 5}) {
        std::vector<int> seen(prompts.size(), 0);
        const Status status = runner.AnswerBatched(
            prompts, stop, batch, [&](size_t i, const GreedyResult& a) -> Status {
              ++seen[i];
              EXPECT_EQ(a.text, alone[i].text) << type << " batch " << batch << " prompt " << i;
              EXPECT_EQ(a.tokens, alone[i].tokens);
              EXPECT_EQ(a.hit_limit, alone[i].hit_limit);
              return Status::Ok();
            });
        ASSERT_TRUE(status.ok()) << status.message();
        EXPECT_EQ(seen, std::vector<int>(prompts.size(), 1));
      }
      // The callback's error stops the run; every sequence is released.
      int calls = 0;
      EXPECT_FALSE(runner
                       .AnswerBatched(prompts, stop, 3,
                                      [&](size_t, const GreedyResult&) -> Status {
                                        return ++calls == 2 ? Status::Error("stop") : Status::Ok();
                                      })
                       .ok());
      EXPECT_EQ(calls, 2);
      EXPECT_TRUE(runner.Answer(prompts[0], stop).ok());
      EXPECT_FALSE(runner.AnswerBatched(prompts, stop, 0, nullptr).ok());
    }
  }
}

TEST(StudyResumeTest, LogDropsACutShortLineAndRefusesGarbage) {
  const std::string path = test_util::TestPath("study_tasks", "log.jsonl");
  fs::remove(path);
  {
    auto log = ResultLog::Open(path);
    ASSERT_TRUE(log.ok());
    EXPECT_TRUE(log->records().empty());
    ASSERT_TRUE(log->Append({{"trial", 0}}).ok());
    ASSERT_TRUE(log->Append({{"trial", 1}}).ok());
  }
  {
    std::ofstream f(path, std::ios::app);
    f << "{\"trial\": 2, \"corr";  // killed mid-write
  }
  auto log = ResultLog::Open(path);
  ASSERT_TRUE(log.ok()) << log.status().message();
  ASSERT_EQ(log->records().size(), 2u);
  ASSERT_TRUE(log->Append({{"trial", 2}}).ok());
  auto again = ResultLog::Open(path);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->records().size(), 3u);
  EXPECT_EQ(again->records()[2]["trial"], 2);
  // Every record names the SIMD target it was computed with, as read back.
  EXPECT_EQ(again->records()[2]["simd_target"], SimdTargetName());
  EXPECT_NE(SimdTargetName(), "none");
  {
    std::ofstream f(path, std::ios::app);
    f << "not json\n";
  }
  auto bad = ResultLog::Open(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(":4:"), std::string::npos) << bad.status().message();
  fs::remove(path);

  const std::string dir = test_util::TestPath("study_tasks", "results");
  fs::remove_all(dir);
  ASSERT_TRUE(PrepareResultDir(dir, {{"seed", 1}}).ok());
  EXPECT_TRUE(PrepareResultDir(dir, {{"seed", 1}}).ok());
  auto other = PrepareResultDir(dir, {{"seed", 2}});
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.message().find("different configuration"), std::string::npos);
  fs::remove_all(dir);
}

TEST(StudyResumeTest, ResultFileStemIsAPathPartAndStable) {
  EXPECT_NE(ResultFileStem("f16/int4"), ResultFileStem("f16_int4"));
  EXPECT_EQ(ResultFileStem("f16/int4").find('/'), std::string::npos);
  // The shipped results folders carry these names, and scripts/render_findings.py
  // maps them back to the schemes' spellings with the same three pinned.
  EXPECT_EQ(ResultFileStem("int4+rot"), "int4_rot-2093aa04");
  EXPECT_EQ(ResultFileStem("f16/int4"), "f16_int4-1f9d758c");
  EXPECT_EQ(ResultFileStem("policy:docs/study/policies/int4_layer0.txt"),
            "policy_docs_study_policies_int4_layer0.txt-2b2511d7");
}

// The needle stage end to end: f16 first, cells written per file, a killed
// run (a cell's last line lost) resumes with only the missing trial, a wider
// grid reuses the cells it shares, and schemes other than f16 skip the
// (task, context) pairs f16 fails.
TEST_F(StudyTasksTest, NeedleStudyResumesAndSkipsWhereF16Fails) {
  const std::string dir = test_util::TestPath("study_tasks", "needle");
  fs::remove_all(dir);
  NeedleOptions o;
  o.tasks = {NeedleTask::kSingleRepeat};
  o.contexts = {600};
  o.depths = {0.5};
  o.trials = 3;
  std::vector<NeedleScheme> schemes;
  for (const char* type : {"f16", "int4"}) {
    schemes.push_back(
        {type, [this, type]() -> StatusOr<std::unique_ptr<KvCache>> { return Cache(type, 600); }});
  }
  // Progress counts recorded trials too; the files hold one line per trial
  // run, so their lengths tell what ran.
  NeedleProgress last;
  std::vector<int64_t> dones;  // of the last run, for the last scheme that reported
  auto count = [&](const NeedleProgress& p) {
    if (p.scheme != last.scheme) dones.clear();
    last = p;
    dones.push_back(p.done);
  };
  auto lines = [](const std::string& path) {
    std::ifstream in(path);
    return std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n');
  };
  auto first = RunNeedleStudy(model_, schemes, o, dir, count);
  ASSERT_TRUE(first.ok()) << first.status().message();
  const nlohmann::json& j = *first;
  ASSERT_EQ(j["schemes"].size(), 2u);
  EXPECT_EQ(j["schemes"][0]["name"], "f16");
  ASSERT_EQ(j["schemes"][0]["cells"].size(), 1u);
  EXPECT_EQ(j["schemes"][0]["cells"][0]["trials"], 3);
  // A random model recalls nothing: f16 fails, so int4 runs no cell.
  EXPECT_EQ(j["schemes"][0]["cells"][0]["correct"], 0);
  EXPECT_TRUE(j["schemes"][1]["cells"].empty());
  EXPECT_FALSE(j["per_task"][0]["model_can_do"].get<bool>());
  EXPECT_NE(j["statement"].get<std::string>().find("cannot do it"), std::string::npos);
  EXPECT_GT(j["tokens_from_shared_prefix"].get<int64_t>(), 0);
  EXPECT_EQ(last.scheme, "f16");
  EXPECT_EQ(last.done, 3);
  EXPECT_EQ(last.total, 3);

  // Cut the cell's last line short, as a kill mid-write would.
  const std::string cell = dir + "/" + ResultFileStem("f16") + "/single_repeat_c600_d0.500.jsonl";
  ASSERT_TRUE(fs::exists(cell));
  const auto size = fs::file_size(cell);
  EXPECT_EQ(lines(cell), 3);
  fs::resize_file(cell, size - 5);
  last = {};
  auto second = RunNeedleStudy(model_, schemes, o, dir, count);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(lines(cell), 3);  // 2 kept + only the lost trial again
  EXPECT_EQ(last.done, 3);
  EXPECT_EQ(dones, (std::vector<int64_t>{2, 3}));  // the recorded trials first, at once
  EXPECT_EQ((*second)["schemes"][0]["cells"], j["schemes"][0]["cells"]);
  // More trials later: only the new ones run.
  o.trials = 4;
  auto more = RunNeedleStudy(model_, schemes, o, dir, count);
  ASSERT_TRUE(more.ok()) << more.status().message();
  EXPECT_EQ(lines(cell), 4);
  EXPECT_EQ(last.done, 4);
  EXPECT_EQ((*more)["schemes"][0]["cells"][0]["trials"], 4);
  // Another grid over the same cell (a depth added) reuses the recorded one.
  o.depths = {0.25, 0.5};
  last = {};
  auto wider = RunNeedleStudy(model_, schemes, o, dir, count);
  ASSERT_TRUE(wider.ok()) << wider.status().message();
  EXPECT_EQ(lines(cell), 4);
  // The second cell's recorded trials are counted before the first cell
  // runs, so every later report is one trial that ran.
  EXPECT_EQ(dones, (std::vector<int64_t>{4, 5, 6, 7, 8}));
  ASSERT_EQ((*wider)["schemes"][0]["cells"].size(), 2u);
  EXPECT_EQ((*wider)["schemes"][0]["cells"][1], (*more)["schemes"][0]["cells"][0]);
  // Another seed is another configuration: refused.
  o.seed = 1;
  EXPECT_FALSE(RunNeedleStudy(model_, schemes, o, dir, count).ok());
  fs::remove_all(dir);
}

// Extension contexts: f16 runs a task there only after passing it at every
// shorter context. The random model fails everything, so the extension
// context is in the grid but no cell runs there; a non-ascending extension
// is refused. (NeedleExtensionOnSmolLM2 covers a task that passes.)
TEST_F(StudyTasksTest, NeedleExtensionSkipsTasksF16Fails) {
  const std::string dir = test_util::TestPath("study_tasks", "needle_extend");
  fs::remove_all(dir);
  NeedleOptions o;
  o.tasks = {NeedleTask::kSingleRepeat};
  o.contexts = {400};
  o.extend_contexts = {600};
  o.depths = {0.5};
  o.trials = 2;
  std::vector<NeedleScheme> schemes = {
      {"f16", [this]() -> StatusOr<std::unique_ptr<KvCache>> { return Cache("f16", 600); }}};
  auto r = RunNeedleStudy(model_, schemes, o, dir);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)["contexts"], nlohmann::json({400, 600}));
  EXPECT_EQ((*r)["extend_contexts"], nlohmann::json({600}));
  ASSERT_EQ((*r)["schemes"][0]["cells"].size(), 1u);
  EXPECT_EQ((*r)["schemes"][0]["cells"][0]["context"], 400);
  EXPECT_FALSE(fs::exists(dir + "/" + ResultFileStem("f16") + "/single_repeat_c600_d0.500.jsonl"));
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{400}, {300}, {700, 650}}) {
    o.extend_contexts = bad;
    auto refused = RunNeedleStudy(model_, schemes, o, dir);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("ascend"), std::string::npos);
  }
  fs::remove_all(dir);
}

// The other half on the real default model, which recalls a needle in
// repeated filler but not 4 values of one key (docs/findings.md, section 5):
// f16 extends single_repeat to the longer context and not multivalue, and
// int8 runs only where f16 passes. Run through RunStudy, the path `kvq study
// --niah-extend-contexts` takes, so the caches it builds must hold the
// extension's prompts (they once held only the shorter contexts'). Skipped
// when set-up has not fetched the model.
TEST(NeedleExtensionOnSmolLM2, ExtendsOnlyTheTasksF16Passes) {
  const std::string path =
      std::string(KVQ_SOURCE_DIR) + "/.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << "model missing: run scripts/setup.sh";
  auto model = LoadModel(path, 2);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const std::string dir = test_util::TestPath("study_tasks", "needle_extend_smollm2");
  fs::remove_all(dir);
  StudyOptions study;
  study.core = false;
  study.threads = 2;
  study.needle.run = true;
  study.needle.dir = dir;
  auto schemes = ParseSchemeList("f16,int8", model->transformer->kv_shape());
  ASSERT_TRUE(schemes.ok()) << schemes.status().message();
  study.needle.schemes = *schemes;
  NeedleOptions& o = study.needle.options;
  o.tasks = {NeedleTask::kSingleRepeat, NeedleTask::kMultiValueRepeat};
  o.contexts = {400};
  o.extend_contexts = {700};
  o.depths = {0.5};
  o.trials = 1;  // one trial a cell: a pass is a correct answer
  o.chat = true;
  auto study_json = RunStudy(*model, test_util::WordText(50), study);
  ASSERT_TRUE(study_json.ok()) << study_json.status().message();
  const nlohmann::json* r = &(*study_json)["needle"];
  std::vector<std::string> f16_cells, int8_cells;
  for (const auto& c : (*r)["schemes"][0]["cells"]) {
    f16_cells.push_back(c["task"].get<std::string>() + "@" +
                        std::to_string(c["context"].get<int>()) + " " +
                        std::to_string(c["correct"].get<int>()));
  }
  for (const auto& c : (*r)["schemes"][1]["cells"]) {
    int8_cells.push_back(c["task"].get<std::string>() + "@" +
                         std::to_string(c["context"].get<int>()));
  }
  EXPECT_EQ(f16_cells, (std::vector<std::string>{"single_repeat@400 1", "multivalue_repeat@400 0",
                                                 "single_repeat@700 1"}));
  EXPECT_EQ(int8_cells, (std::vector<std::string>{"single_repeat@400", "single_repeat@700"}));
  EXPECT_NE(
      (*r)["statement"].get<std::string>().find("single_repeat: f16 >= 90% at contexts 400, 700"),
      std::string::npos)
      << (*r)["statement"];
  fs::remove_all(dir);
}

TEST(StudyGsm8kTest, ParsesReferencesAndLastNumbers) {
  EXPECT_EQ(Gsm8kReference("so 3 + 4 = 7\n#### 1,234"), "1234");
  EXPECT_EQ(Gsm8kReference("no marker 5"), "");
  EXPECT_EQ(LastNumber("She has 3 apples, then 12. The answer is 18."), "18");
  EXPECT_EQ(LastNumber("The answer is $1,250.50"), "1250.50");
  EXPECT_EQ(LastNumber("It is -7."), "-7");
  EXPECT_EQ(LastNumber("5 - 3 = 2"), "2");
  EXPECT_EQ(LastNumber("no numbers"), "");
  EXPECT_TRUE(SameNumber("18", "18.0"));
  EXPECT_TRUE(SameNumber("1250.50", "1250.5"));
  EXPECT_FALSE(SameNumber("18", "19"));
  EXPECT_FALSE(SameNumber("", "0"));
}

// Wilson score interval, checked against the closed form at known points
// (k = 0: [0, z^2 / (n + z^2)]; k = n/2: symmetric about 1/2).
TEST(StudyGsm8kTest, WilsonInterval) {
  const double z = 1.959963984540054;
  auto [lo0, hi0] = WilsonInterval(0, 3);
  EXPECT_NEAR(hi0, z * z / (3 + z * z), 1e-12);
  // The ends at 0/n and n/n are exact, so a rate of 100% lies inside its
  // interval (the formula alone gives 0.9999999999999998 at 300/300).
  for (int64_t n : {1, 3, 50, 250, 300, 1319}) {
    EXPECT_EQ(WilsonInterval(0, n).first, 0.0) << n;
    EXPECT_EQ(WilsonInterval(n, n).second, 1.0) << n;
    EXPECT_NEAR(WilsonInterval(n, n).first, 1.0 - WilsonInterval(0, n).second, 1e-12) << n;
  }
  auto [lo, hi] = WilsonInterval(5, 10);
  EXPECT_NEAR(lo + hi, 1.0, 1e-12);
  EXPECT_NEAR(lo, 0.2365931, 1e-6);  // the textbook value for 5/10
  auto [lo250, hi250] = WilsonInterval(125, 250);
  EXPECT_LT(hi250 - lo250, hi - lo);  // more problems, narrower
}

// Exact McNemar p-values, against exact rational sums (Python's
// fractions.Fraction of sum C(n, i) / 2^n): small counts, the session's own
// split (49 against 25), a one-sided wipe-out, and a split of all 1,319
// problems, where C(n, i) / 2^n underflows doubles unless summed in logs.
TEST(StudyGsm8kTest, McNemarExactP) {
  EXPECT_EQ(McNemarExactP(0, 0), 1.0);
  EXPECT_EQ(McNemarExactP(3, 3), 1.0);
  EXPECT_NEAR(McNemarExactP(5, 0), 0.0625, 1e-12);
  EXPECT_NEAR(McNemarExactP(0, 5), 0.0625, 1e-12);
  EXPECT_NEAR(McNemarExactP(10, 3), 0.09228515625, 1e-12);
  // Relative bounds: lgamma's rounding grows with n (about 1e-13 relative
  // per term at these sizes), far below the 3 digits the reports print.
  EXPECT_NEAR(McNemarExactP(49, 25) / 0.007084252673880493, 1.0, 1e-9);
  EXPECT_NEAR(McNemarExactP(127, 0) / 1.1754943508222875e-38, 1.0, 1e-9);
  EXPECT_NEAR(McNemarExactP(700, 619) / 0.02757369625939718, 1.0, 1e-9);
}

TEST(StudyGsm8kTest, LoadVerifiesTheChecksumAndParses) {
  const std::string data = test_util::TestPath("study_tasks", "test.jsonl"),
                    sums = test_util::TestPath("study_tasks", "SHA256SUMS");
  {
    std::ofstream f(data);
    f << "{\"question\": \"1 + 1?\", \"answer\": \"1 + 1 = 2\\n#### 2\"}\n"
         "{\"question\": \"Big?\", \"answer\": \"#### 1,000\"}\n";
  }
  {
    std::ofstream f(sums);
    f << "0000000000000000000000000000000000000000000000000000000000000000  "
      << fs::path(data).filename().string() << "\n";
  }
  auto bad = LoadGsm8k(data, sums);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sha256"), std::string::npos);
  auto unchecked = LoadGsm8k(data, "");
  ASSERT_TRUE(unchecked.ok()) << unchecked.status().message();
  ASSERT_EQ(unchecked->size(), 2u);
  EXPECT_EQ((*unchecked)[1].reference, "1000");
  {
    std::ofstream f(data, std::ios::app);
    f << "{\"question\": \"x\"}\n";
  }
  EXPECT_FALSE(LoadGsm8k(data, "").ok());
  fs::remove(data);
  fs::remove(sums);
}

// The shared GSM8K split, when present: its published digest and 1,319 problems.
TEST(StudyGsm8kTest, SharedSplitMatchesItsChecksum) {
  const fs::path dir = fs::path(KVQ_SOURCE_DIR) / ".." / "shared" / "data" / "gsm8k";
  if (!fs::exists(dir / "test.jsonl")) GTEST_SKIP() << "no " << dir.string();
  auto data = LoadGsm8k((dir / "test.jsonl").string(), (dir / "SHA256SUMS").string());
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->size(), 1319u);
  EXPECT_EQ((*data)[0].reference, "18");
}

// The GSM8K stage: the same problems per scheme, resumable per problem.
TEST_F(StudyTasksTest, Gsm8kStudyScoresAndResumes) {
  const std::string data_path = test_util::TestPath("study_tasks", "gsm.jsonl"),
                    dir = test_util::TestPath("study_tasks", "gsm8k");
  fs::remove_all(dir);
  {
    std::ofstream f(data_path);
    for (int i = 0; i < 3; ++i) {
      f << "{\"question\": \"What is " << i << " + 1?\", \"answer\": \"#### " << i + 1 << "\"}\n";
    }
  }
  auto data = LoadGsm8k(data_path, "");
  ASSERT_TRUE(data.ok());
  std::vector<Gsm8kScheme> schemes;
  for (const char* type : {"f16", "int2"}) {
    schemes.push_back(
        {type, [this, type]() -> StatusOr<std::unique_ptr<KvCache>> { return Cache(type, 640); }});
  }
  Gsm8kOptions o;
  o.problems = 2;
  o.max_new_tokens = 6;
  o.chat = false;
  o.batch = 2;
  int64_t events = 0;
  auto first = RunGsm8kStudy(model_, *data, schemes, o, dir, data_path,
                             [&](const Gsm8kProgress&) { ++events; });
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_EQ((*first)["schemes"].size(), 2u);
  const auto& f16 = (*first)["schemes"][0];
  EXPECT_EQ(f16["problems"], 2);
  EXPECT_GE(f16["wilson95_high"].get<double>(), f16["accuracy"].get<double>());
  EXPECT_EQ(events, 2 * (1 + 2));  // per scheme: the start and each problem
  // One pair, f16 against int2, whose four counts partition the problems
  // and agree with each scheme's own count.
  ASSERT_EQ((*first)["paired"].size(), 1u);
  const auto& pair = (*first)["paired"][0];
  EXPECT_EQ(pair["a"], "f16");
  EXPECT_EQ(pair["b"], "int2");
  const int64_t only_a = pair["only_a_correct"], only_b = pair["only_b_correct"],
                both = pair["both_correct"], neither = pair["neither_correct"];
  EXPECT_EQ(only_a + only_b + both + neither, 2);
  EXPECT_EQ(only_a + both, f16["correct"].get<int64_t>());
  EXPECT_EQ(only_b + both, (*first)["schemes"][1]["correct"].get<int64_t>());
  EXPECT_EQ(pair["mcnemar_exact_p"].get<double>(), McNemarExactP(only_a, only_b));
  EXPECT_EQ(pair["same_simd_target"], true);  // both answered in this process
  EXPECT_EQ((*first)["decode"].get<std::string>().rfind("batch-invariant", 0), 0u);
  // Rerun: nothing new; one more problem: only it runs, per scheme.
  events = 0;
  auto again = RunGsm8kStudy(model_, *data, schemes, o, dir, data_path,
                             [&](const Gsm8kProgress&) { ++events; });
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(events, 2);
  EXPECT_EQ((*again)["schemes"], (*first)["schemes"]);
  o.problems = 3;
  events = 0;
  auto more = RunGsm8kStudy(model_, *data, schemes, o, dir, data_path,
                            [&](const Gsm8kProgress&) { ++events; });
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(events, 2 * (1 + 1));
  EXPECT_EQ((*more)["schemes"][1]["problems"], 3);
  // int2's answers as if made on another SIMD target: the pair says so.
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("int2", 0) != 0) continue;
    StatusOr<std::string> read = ReadTextFile(e.path().string());
    ASSERT_TRUE(read.ok()) << read.status().message();
    std::string text = *read;
    const std::string own = "\"simd_target\":\"" + SimdTargetName() + "\"";
    for (size_t at; (at = text.find(own)) != std::string::npos;) {
      text.replace(at, own.size(), "\"simd_target\":\"ELSEWHERE\"");
    }
    ASSERT_TRUE(WriteTextFile(e.path().string(), text).ok());
  }
  auto moved = RunGsm8kStudy(model_, *data, schemes, o, dir, data_path, nullptr);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ((*moved)["schemes"][1]["simd_targets"]["ELSEWHERE"], 3);
  EXPECT_EQ((*moved)["paired"][0]["same_simd_target"], false);
  o.max_new_tokens = 7;  // another configuration
  EXPECT_FALSE(RunGsm8kStudy(model_, *data, schemes, o, dir, data_path, nullptr).ok());
  o.max_new_tokens = 6;
  // The decode batch is not part of the configuration (the answers do not
  // depend on it): a run resumes with another.
  o.batch = 3;
  auto rebatched = RunGsm8kStudy(model_, *data, schemes, o, dir, data_path, nullptr);
  ASSERT_TRUE(rebatched.ok()) << rebatched.status().message();
  EXPECT_EQ((*rebatched)["schemes"], (*moved)["schemes"]);
  EXPECT_EQ((*rebatched)["decode_batch"], 3);
  fs::remove_all(dir);
  fs::remove(data_path);
}

// Schemes named by their K and V type alike (f16, int2, ...).
std::vector<SchemeSpec> Specs(const std::vector<std::string>& names) {
  std::vector<SchemeSpec> out;
  for (const std::string& n : names) out.push_back({n, n, n, false, ""});
  return out;
}

int LogprobFiles(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".logprobs";
  return n;
}

// KL by context length: f16 is the zero baseline, a 2-bit cache is not; a
// rerun measures nothing, new lengths and schemes measure only themselves
// (f16 re-runs for its log-probs without a second record), and another
// configuration is refused.
TEST_F(StudyTasksTest, ContextKlMeasuresEachLengthOnceAndResumes) {
  const std::string dir = test_util::TestPath("study_tasks", "context_kl");
  fs::remove_all(dir);
  std::string text;
  for (int i = 0; i < 1200; ++i) text += static_cast<char>('a' + (i * 7 + i / 13) % 26);
  ContextKlOptions o;
  o.lengths = {128, 64};
  o.positions = 100;
  int64_t events = 0;  // point events: a point starts, and the final report
  std::vector<std::pair<int64_t, int64_t>> tokens;  // (fed, total) inside points
  ContextKlProgress last;
  auto count = [&](const ContextKlProgress& p) {
    if (p.tokens_total > 0) {
      tokens.emplace_back(p.tokens_fed, p.tokens_total);
      return;
    }
    ++events;
    last = p;
  };
  auto first = RunContextKlStudy(model_, text, "digest", Specs({"f16", "int2"}), o, dir, count);
  ASSERT_TRUE(first.ok()) << first.status().message();
  const nlohmann::json& j = *first;
  EXPECT_EQ(j["lengths"], nlohmann::json({64, 128}));
  ASSERT_EQ(j["schemes"].size(), 2u);
  const auto& f16 = j["schemes"][0];
  const auto& int2 = j["schemes"][1];
  EXPECT_TRUE(f16["baseline"].get<bool>());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(f16["points"][i]["kl_mean"], 0.0);
    EXPECT_EQ(f16["points"][i]["top1_agreement"], 1.0);
    EXPECT_GT(int2["points"][i]["kl_mean"].get<double>(), 0.0);
    EXPECT_GE(int2["points"][i]["kl_p99"].get<double>(),
              int2["points"][i]["kl_mean"].get<double>());
  }
  // 64: windows of 31 scored positions, ceil(100 / 31) = 4; 128: 2 of 63.
  EXPECT_EQ(int2["points"][0]["windows"], 4);
  EXPECT_EQ(int2["points"][0]["positions"], 4 * 31);
  EXPECT_EQ(int2["points"][1]["positions"], 2 * 63);
  EXPECT_EQ(ContextKlWindows(64, 100, 1200 / 64 * 64), 4);
  EXPECT_EQ(ContextKlWindows(512, 100000, 1024), 2);  // the text bounds it
  EXPECT_EQ(int2["nominal_bits"], 2);
  EXPECT_EQ(j["best_2bit"], "int2");
  EXPECT_EQ(events, 4 + 1);
  // Inside each point, a token event per forward chunk (one per window at the
  // default batch of 512): f16 and int2 at 64 (4 windows), then at 128 (2).
  using Fed = std::vector<std::pair<int64_t, int64_t>>;
  const Fed at64 = {{64, 256}, {128, 256}, {192, 256}, {256, 256}};
  const Fed at128 = {{128, 256}, {256, 256}};
  Fed expected;
  for (const Fed* point : {&at64, &at64, &at128, &at128}) {
    expected.insert(expected.end(), point->begin(), point->end());
  }
  EXPECT_EQ(tokens, expected);
  EXPECT_EQ(last.done, 4);
  EXPECT_EQ(last.total, 4);

  events = 0;
  auto again = RunContextKlStudy(model_, text, "digest", Specs({"f16", "int2"}), o, dir, count);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(events, 1);  // only the final report
  EXPECT_EQ((*again)["schemes"], j["schemes"]);

  o.lengths = {64, 96, 128};
  events = 0;
  auto longer =
      RunContextKlStudy(model_, text, "digest", Specs({"f16", "int2", "int4"}), o, dir, count);
  ASSERT_TRUE(longer.ok()) << longer.status().message();
  EXPECT_EQ(events, 3 * 2 + 1 + 1);  // f16 + int4 at 64 and 128, all three at 96
  EXPECT_EQ((*longer)["schemes"][1]["points"][0], int2["points"][0]);
  std::ifstream f16_log(dir + "/" + ResultFileStem("f16") + ".jsonl");
  EXPECT_EQ(
      std::count(std::istreambuf_iterator<char>(f16_log), std::istreambuf_iterator<char>(), '\n'),
      3);
  EXPECT_EQ(LogprobFiles(dir), 0);  // scratch removed

  o.positions = 50;  // another configuration
  EXPECT_FALSE(RunContextKlStudy(model_, text, "digest", Specs({"f16"}), o, dir, nullptr).ok());
  o.positions = 100;
  o.lengths = {1000};  // beyond the model's 640
  auto too_long = RunContextKlStudy(model_, text, "digest", Specs({"f16"}), o, dir, nullptr);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("640"), std::string::npos);
  o.lengths = {63};
  EXPECT_FALSE(RunContextKlStudy(model_, text, "digest", Specs({"f16"}), o, dir, nullptr).ok());
  EXPECT_FALSE(RunContextKlStudy(model_, text, "digest", Specs({"int2"}), o, dir, nullptr).ok());
  fs::remove_all(dir);
}

// A run stopped after its f16 baseline (here by a scheme that cannot be built)
// keeps the baseline's log-probs, and the next run measures the other schemes
// against them instead of remaking them; a baseline file cut short is remade.
TEST_F(StudyTasksTest, ContextKlReusesACompleteBaselineAfterAStop) {
  const std::string dir = test_util::TestPath("study_tasks", "context_kl_reuse");
  fs::remove_all(dir);
  std::string text;
  for (int i = 0; i < 1200; ++i) text += static_cast<char>('a' + (i * 5 + i / 11) % 26);
  ContextKlOptions o;
  o.lengths = {64};
  o.positions = 60;
  std::vector<std::string> measured;
  auto record = [&](const ContextKlProgress& p) {
    if (p.done < p.total && p.tokens_total == 0) measured.push_back(p.scheme);
  };
  EXPECT_FALSE(
      RunContextKlStudy(model_, text, "digest", Specs({"f16", "no-such-type"}), o, dir, record)
          .ok());
  EXPECT_EQ(measured, std::vector<std::string>({"f16", "no-such-type"}));
  const std::string baseline = dir + "/f16-64-" + SimdTargetName() + ".logprobs";
  ASSERT_TRUE(fs::exists(baseline));

  measured.clear();
  auto resumed = RunContextKlStudy(model_, text, "digest", Specs({"f16", "int2"}), o, dir, record);
  ASSERT_TRUE(resumed.ok()) << resumed.status().message();
  EXPECT_EQ(measured, std::vector<std::string>({"int2"}));  // f16 not remade
  EXPECT_GT((*resumed)["schemes"][1]["points"][0]["kl_mean"].get<double>(), 0.0);
  EXPECT_EQ(LogprobFiles(dir), 0);

  // The same stop at another length, then the baseline loses its last byte:
  // it is remade, and int4 measured against the remade one.
  o.lengths = {96};
  measured.clear();
  EXPECT_FALSE(
      RunContextKlStudy(model_, text, "digest", Specs({"f16", "no-such-type"}), o, dir, record)
          .ok());
  const std::string cut = dir + "/f16-96-" + SimdTargetName() + ".logprobs";
  ASSERT_TRUE(fs::exists(cut));
  fs::resize_file(cut, fs::file_size(cut) - 1);
  measured.clear();
  auto remade = RunContextKlStudy(model_, text, "digest", Specs({"f16", "int4"}), o, dir, record);
  ASSERT_TRUE(remade.ok()) << remade.status().message();
  EXPECT_EQ(measured, std::vector<std::string>({"f16", "int4"}));
  EXPECT_EQ(LogprobFiles(dir), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvq
