#include "study/study_niah.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <random>
#include <set>

#include "engine/chat_template.h"
#include "study/study.h"
#include "study/study_decode.h"
#include "study/study_resume.h"

namespace kvq {
namespace {

using Json = nlohmann::json;

// Keys are "adjective-noun". Asked keys take the first half of the
// adjectives and distractors the second, so a distractor can never carry the
// asked key.
constexpr const char* kAdjectives[] = {
    "amber", "brave", "calm",   "dusty", "eager", "frosty", "gentle", "hollow",
    "ivory", "jolly", "keen",   "lunar", "misty", "noble",  "olive",  "proud",
    "quiet", "rusty", "silent", "tawny", "upper", "vivid",  "wild",   "young",
    "zesty", "bold",  "crisp",  "dim",   "early", "faint",  "grand",  "humble"};
constexpr const char* kNouns[] = {
    "river",  "falcon", "meadow", "lantern", "harbor", "pebble", "canyon",  "orchard",
    "violin", "comet",  "garden", "island",  "kettle", "marble", "needle",  "oak",
    "parrot", "quarry", "saddle", "tiger",   "tunnel", "valley", "walrus",  "willow",
    "anchor", "bridge", "cellar", "desert",  "ember",  "forest", "glacier", "hammer"};
constexpr int kAskedAdjectives = 16;

// The repeated filler ("repeat" haystack): plain sentences that hold no
// numbers, cycled.
constexpr const char* kFiller[] = {
    " The river runs down to the sea.", " The hills are quiet at noon.",
    " A bird sings on the old wall.", " The road turns left at the farm.",
    " Rain falls and the day goes on."};

constexpr int kDistractors = 3;  // multikey_repeat
constexpr int kValues = 4;       // multivalue_repeat

std::string Key(std::mt19937_64& rng, bool asked) {
  const int a = static_cast<int>(rng() % kAskedAdjectives) + (asked ? 0 : kAskedAdjectives);
  const int n = static_cast<int>(rng() % (sizeof(kNouns) / sizeof(kNouns[0])));
  return std::string(kAdjectives[a]) + "-" + kNouns[n];
}

std::string Value(std::mt19937_64& rng) { return std::to_string(1000000 + rng() % 9000000); }

std::string NeedleSentence(const std::string& key, const std::string& value) {
  return " One special number for " + key + " is " + value + ".";
}

// splitmix64 over the words: a seed per (task, context, depth, trial) that
// does not depend on which other cells run.
uint64_t Mix(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  uint64_t h = seed;
  for (uint64_t w : {a, b, c}) {
    h += 0x9e3779b97f4a7c15ULL + w;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  return h;
}

// The text around the haystack: instruction before, question after, the
// answer's opening words last (after the assistant header in chat).
struct Frame {
  std::vector<int32_t> head, tail;
};

StatusOr<Frame> BuildFrame(const LoadedModel& model, const std::string& key, bool multivalue,
                           bool chat) {
  const Tokenizer& tok = *model.tokenizer;
  const std::string instruction =
      "Below is a long text with some special numbers hidden in it. Read it, remember the "
      "numbers, and answer the question after it.\n\n";
  const std::string question =
      multivalue ? "\n\nQuestion: What are all the special numbers for " + key + "?"
                 : "\n\nQuestion: What is the special number for " + key + "?";
  const std::string answer = multivalue ? " The special numbers for " + key + " are"
                                        : " The special number for " + key + " is";
  EncodeOptions plain;
  EncodeOptions special;
  special.parse_special = true;
  bool bos = tok.add_bos() && tok.bos_id() >= 0;
  Frame f;
  std::string head_text, tail_text;
  if (chat) {
    KVQ_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::FromJinja(tok.chat_template()));
    const std::string marker = "\x01\x02HAYSTACK\x02\x01";
    const std::string rendered =
        tmpl.Render({{"user", instruction + marker + question}}, /*add_generation_prompt=*/true);
    const size_t at = rendered.find(marker);
    if (at == std::string::npos) return Status::Error("chat template lost the user message");
    if (!tmpl.bos_text.empty()) bos = false;  // the template writes BOS itself
    head_text = rendered.substr(0, at);
    tail_text = rendered.substr(at + marker.size()) + answer.substr(1);
    if (bos) f.head.push_back(tok.bos_id());
    const std::vector<int32_t> h = tok.Encode(head_text, special);
    f.head.insert(f.head.end(), h.begin(), h.end());
    f.tail = tok.Encode(tail_text, special);
  } else {
    if (bos) f.head.push_back(tok.bos_id());
    const std::vector<int32_t> h = tok.Encode(instruction, plain);
    f.head.insert(f.head.end(), h.begin(), h.end());
    f.tail = tok.Encode(question + answer, plain);
  }
  return f;
}

// Filler sentences (tokens) until at least `n` tokens; boundaries[i] = the
// token index where sentence i starts.
struct Filler {
  std::vector<int32_t> tokens;
  std::vector<int64_t> boundaries;
};

Filler BuildFiller(const LoadedModel& model, NeedleTask task, int64_t n, uint64_t cell_seed) {
  Filler f;
  std::mt19937_64 rng(cell_seed);
  for (size_t i = 0; static_cast<int64_t>(f.tokens.size()) < n; ++i) {
    const std::string sentence =
        task == NeedleTask::kSingleNeedle
            ? NeedleSentence(Key(rng, false), Value(rng))
            : std::string(kFiller[i % (sizeof(kFiller) / sizeof(kFiller[0]))]);
    const std::vector<int32_t> t = model.tokenizer->Encode(sentence);
    f.boundaries.push_back(static_cast<int64_t>(f.tokens.size()));
    f.tokens.insert(f.tokens.end(), t.begin(), t.end());
  }
  f.tokens.resize(static_cast<size_t>(std::max<int64_t>(n, 0)));
  while (!f.boundaries.empty() && f.boundaries.back() > n) f.boundaries.pop_back();
  if (f.boundaries.empty() || f.boundaries.back() != n) f.boundaries.push_back(n);
  return f;
}

int64_t NearestBoundary(const std::vector<int64_t>& boundaries, double target) {
  int64_t best = boundaries.front();
  for (int64_t b : boundaries) {
    if (std::fabs(static_cast<double>(b) - target) < std::fabs(static_cast<double>(best) - target))
      best = b;
  }
  return best;
}

// Runs of digits in `text`; `complete` counts only those followed by
// another character (a run at the very end may still grow).
std::vector<std::string> DigitRuns(const std::string& text, bool complete_only) {
  std::vector<std::string> runs;
  size_t i = 0;
  while (i < text.size()) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    if (!complete_only || j < text.size()) runs.push_back(text.substr(i, j - i));
    i = j;
  }
  return runs;
}

}  // namespace

const char* NeedleTaskName(NeedleTask task) {
  switch (task) {
    case NeedleTask::kSingleNeedle:
      return "single_needle";
    case NeedleTask::kMultiKeyRepeat:
      return "multikey_repeat";
    case NeedleTask::kMultiValueRepeat:
      return "multivalue_repeat";
    default:
      return "single_repeat";
  }
}

StatusOr<NeedleTask> ParseNeedleTask(const std::string& name) {
  for (NeedleTask t : {NeedleTask::kSingleRepeat, NeedleTask::kSingleNeedle,
                       NeedleTask::kMultiKeyRepeat, NeedleTask::kMultiValueRepeat}) {
    if (name == NeedleTaskName(t)) return t;
  }
  return Status::Error("unknown needle task '" + name + "' (known: " + AllNeedleTasks() + ")");
}

std::string AllNeedleTasks() {
  return "single_repeat,single_needle,multikey_repeat,multivalue_repeat";
}

int NeedleAnswerTokens(NeedleTask task) {
  // 7 digits may be 7 tokens (Qwen2 and Llama-3 split digits) plus a space
  // and a period; a list of 4 adds separators.
  return task == NeedleTask::kMultiValueRepeat ? 48 : 12;
}

StatusOr<NeedlePrompt> BuildNeedlePrompt(const LoadedModel& model, NeedleTask task, int64_t context,
                                         double depth, int trial, uint64_t seed, bool chat) {
  const uint64_t task_id = static_cast<uint64_t>(task) + 1;
  const uint64_t cell_seed = Mix(seed, task_id, static_cast<uint64_t>(context));
  const uint64_t depth_id = static_cast<uint64_t>(std::llround(depth * 1e6));
  std::mt19937_64 trial_rng(Mix(seed ^ 0x9e3779b97f4a7c15ULL, task_id * 1000003ULL + depth_id,
                                static_cast<uint64_t>(context), static_cast<uint64_t>(trial)));
  std::mt19937_64 cell_rng(Mix(cell_seed, depth_id, 17));
  NeedlePrompt p;
  p.key = Key(trial_rng, true);
  const bool multivalue = task == NeedleTask::kMultiValueRepeat;
  std::set<std::string> used;
  for (int i = 0; i < (multivalue ? kValues : 1); ++i) {
    std::string v = Value(trial_rng);
    while (used.count(v)) v = Value(trial_rng);
    used.insert(v);
    p.values.push_back(v);
  }
  // (boundary position, sentence) of every inserted needle; the asked one first.
  std::vector<std::pair<double, std::vector<int32_t>>> inserts;
  const Tokenizer& tok = *model.tokenizer;
  inserts.push_back({-1.0, tok.Encode(NeedleSentence(p.key, p.values[0]))});
  if (task == NeedleTask::kMultiKeyRepeat) {
    for (int i = 0; i < kDistractors; ++i) {
      std::uniform_real_distribution<double> where(0.0, 1.0);
      const double at = where(cell_rng);
      inserts.push_back({at, tok.Encode(NeedleSentence(Key(cell_rng, false), Value(cell_rng)))});
    }
  }
  for (size_t i = 1; i < p.values.size(); ++i) {  // later values after the first
    std::uniform_real_distribution<double> where(depth, 1.0);
    inserts.push_back({where(cell_rng), tok.Encode(NeedleSentence(p.key, p.values[i]))});
  }
  KVQ_ASSIGN_OR_RETURN(Frame frame, BuildFrame(model, p.key, multivalue, chat));
  int64_t fixed = static_cast<int64_t>(frame.head.size() + frame.tail.size());
  for (const auto& [at, t] : inserts) fixed += static_cast<int64_t>(t.size());
  const int64_t n_filler = context - NeedleAnswerTokens(task) - fixed;
  if (n_filler < 1) {
    return Status::Error("needle prompt of " + std::to_string(context) +
                         " tokens is too short for the instruction, needles and question (" +
                         std::to_string(fixed + NeedleAnswerTokens(task)) + " tokens)");
  }
  const Filler filler = BuildFiller(model, task, n_filler, cell_seed);
  // Positions: the asked needle at depth; the others where drawn. A stable
  // sort keeps the asked needle before any other at the same boundary.
  std::vector<std::pair<int64_t, size_t>> order;  // (filler position, insert index)
  for (size_t i = 0; i < inserts.size(); ++i) {
    const double frac = i == 0 ? depth : inserts[i].first;
    order.push_back({NearestBoundary(filler.boundaries, frac * n_filler), i});
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  p.tokens = frame.head;
  int64_t copied = 0;
  for (const auto& [pos, index] : order) {
    p.tokens.insert(p.tokens.end(), filler.tokens.begin() + copied, filler.tokens.begin() + pos);
    copied = pos;
    if (index == 0) p.needle_position = static_cast<int64_t>(p.tokens.size());
    p.tokens.insert(p.tokens.end(), inserts[index].second.begin(), inserts[index].second.end());
  }
  p.tokens.insert(p.tokens.end(), filler.tokens.begin() + copied, filler.tokens.end());
  p.tokens.insert(p.tokens.end(), frame.tail.begin(), frame.tail.end());
  return p;
}

bool NeedleAnswerCorrect(const std::string& answer, const std::vector<std::string>& values) {
  const std::vector<std::string> runs = DigitRuns(answer, false);
  if (runs.size() < values.size() || values.empty()) return false;
  std::multiset<std::string> want(values.begin(), values.end());
  std::multiset<std::string> got(runs.begin(), runs.begin() + values.size());
  return want == got;
}

}  // namespace kvq
