#include "study/study_e2e.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <random>

#include "engine/sampler.h"
#include "io/mapped_file.h"
#include "kv/codec_registry.h"

namespace kvq {
namespace {

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

}  // namespace

StatusOr<SchemeSpec> ParseSchemeSpec(const std::string& text) {
  SchemeSpec spec;
  spec.name = Trim(text);
  const std::string policy_prefix = "policy:";
  if (spec.name.compare(0, policy_prefix.size(), policy_prefix) == 0) {
    const std::string path = spec.name.substr(policy_prefix.size());
    if (path.empty()) return Status::Error("scheme '" + spec.name + "': no policy file named");
    auto policy = ReadTextFile(path);
    if (!policy.ok()) return policy.status().WithContext("scheme '" + spec.name + "'");
    spec.policy = std::move(policy).value();
    spec.k_type = spec.v_type = "f16";
    return spec;
  }
  std::string body = spec.name;
  const std::string rot = "+rot";
  if (body.size() > rot.size() && body.compare(body.size() - rot.size(), rot.size(), rot) == 0) {
    spec.rotate = true;
    body.resize(body.size() - rot.size());
  }
  const size_t slash = body.find('/');
  if (slash == std::string::npos) {
    spec.k_type = spec.v_type = body;
  } else {
    spec.k_type = body.substr(0, slash);
    spec.v_type = body.substr(slash + 1);
  }
  if (spec.k_type.empty() || spec.v_type.empty() || spec.v_type.find('/') != std::string::npos ||
      spec.k_type.find('+') != std::string::npos || spec.v_type.find('+') != std::string::npos) {
    return Status::Error("scheme '" + spec.name +
                         "': expected TYPE, KTYPE/VTYPE, optionally with a +rot suffix (e.g. "
                         "int4, f16/int4, int2+rot), or policy:FILE");
  }
  return spec;
}

StatusOr<std::vector<SchemeSpec>> ParseSchemeList(const std::string& list, const KvShape& shape) {
  std::vector<SchemeSpec> specs;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    KVQ_ASSIGN_OR_RETURN(SchemeSpec spec, ParseSchemeSpec(list.substr(start, comma - start)));
    for (const SchemeSpec& s : specs) {
      if (s.name == spec.name) return Status::Error("scheme '" + spec.name + "' listed twice");
    }
    // The planner builds the same layout the cache allocates: an unknown
    // codec name or an impossible rotation fails here, before any model work.
    auto plan = PlanKvType(shape, SchemeCacheOptions(spec, 16, nullptr));
    if (!plan.ok()) return Status::Error("scheme '" + spec.name + "': " + plan.status().message());
    specs.push_back(std::move(spec));
    start = comma + 1;
  }
  if (specs.empty()) return Status::Error("no schemes given");
  return specs;
}

std::string DefaultStudySchemes() { return DefaultKvStudySchemes(); }

KvCacheOptions SchemeCacheOptions(const SchemeSpec& spec, int64_t max_tokens, ThreadPool* pool,
                                  const std::string& calibration_path) {
  KvCacheOptions o;
  o.calibration_path = calibration_path;
  o.k_type = spec.k_type;
  o.v_type = spec.v_type;
  o.rotate = spec.rotate;
  o.policy = spec.policy;
  o.max_tokens = max_tokens;
  o.pool = pool;
  return o;
}

StatusOr<PasskeyPrompt> BuildPasskeyPrompt(const LoadedModel& model,
                                           const std::vector<int32_t>& filler,
                                           int64_t prompt_tokens, double depth,
                                           const std::string& passkey) {
  const Tokenizer& tok = *model.tokenizer;
  const std::vector<int32_t> needle = tok.Encode(" The pass key is " + passkey + ". Remember it.");
  const std::vector<int32_t> question = tok.Encode(" What is the pass key? The pass key is");
  const bool bos = tok.add_bos() && tok.bos_id() >= 0;
  const int64_t fixed = static_cast<int64_t>(needle.size() + question.size()) + (bos ? 1 : 0);
  const int64_t n_filler = prompt_tokens - fixed;
  if (n_filler < 1) {
    return Status::Error("passkey prompt of " + std::to_string(prompt_tokens) +
                         " tokens is too short for the needle and the question (" +
                         std::to_string(fixed) + " tokens)");
  }
  if (static_cast<int64_t>(filler.size()) < n_filler) {
    return Status::Error("the text has " + std::to_string(filler.size()) +
                         " tokens, fewer than the " + std::to_string(n_filler) +
                         " filler tokens a passkey prompt of " + std::to_string(prompt_tokens) +
                         " tokens needs");
  }
  const int64_t at = std::clamp<int64_t>(std::llround(depth * n_filler), 0, n_filler);
  PasskeyPrompt p;
  p.passkey = passkey;
  if (bos) p.tokens.push_back(tok.bos_id());
  p.tokens.insert(p.tokens.end(), filler.begin(), filler.begin() + at);
  p.tokens.insert(p.tokens.end(), needle.begin(), needle.end());
  p.tokens.insert(p.tokens.end(), filler.begin() + at, filler.begin() + n_filler);
  p.tokens.insert(p.tokens.end(), question.begin(), question.end());
  return p;
}

bool PasskeyAnswerCorrect(const std::string& text, const std::string& passkey) {
  size_t i = 0;
  while (i < text.size() && !std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  size_t j = i;
  while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
  return i < text.size() && text.substr(i, j - i) == passkey;
}

StatusOr<std::string> GreedyAnswer(LoadedModel& model, KvCache& cache,
                                   const std::vector<int32_t>& prompt, int answer_tokens) {
  Transformer& t = *model.transformer;
  const int64_t vocab = t.config().vocab_size;
  const SeqId seq = 0;
  KVQ_RETURN_IF_ERROR(cache.AddSequence(seq));
  struct Release {
    KvCache& cache;
    ~Release() { cache.ReleaseSequence(0); }
  } release{cache};
  std::vector<float> logits;  // [1, vocab]
  constexpr int64_t kChunk = 512;
  for (size_t start = 0; start < prompt.size(); start += kChunk) {
    const size_t end = std::min(prompt.size(), start + kChunk);
    KVQ_RETURN_IF_ERROR(t.Forward(
        {{seq, std::vector<int32_t>(prompt.begin() + start, prompt.begin() + end), false}}, cache,
        &logits));
  }
  std::vector<int32_t> answer;
  for (int i = 0; i < answer_tokens; ++i) {
    const int32_t next = ArgMax(logits.data(), vocab);
    if (next == model.tokenizer->eos_id()) break;
    answer.push_back(next);
    if (i + 1 == answer_tokens || cache.Capacity(seq) < 1) break;
    KVQ_RETURN_IF_ERROR(t.Forward({{seq, {next}, false}}, cache, &logits));
  }
  return model.tokenizer->Decode(answer, true);
}

StatusOr<std::vector<RecallCell>> RunPasskeyRecall(
    LoadedModel& model, KvCache& cache, const std::vector<int32_t>& filler,
    const RecallOptions& options, const std::function<void(int64_t, int64_t)>& on_trial) {
  std::vector<RecallCell> cells;
  const int64_t total =
      static_cast<int64_t>(options.contexts.size() * options.depths.size()) * options.trials;
  int64_t done = 0;
  for (size_t ci = 0; ci < options.contexts.size(); ++ci) {
    const int64_t context = options.contexts[ci];
    const int64_t prompt_tokens = context - options.answer_tokens;
    if (static_cast<int64_t>(filler.size()) < prompt_tokens) {
      return Status::Error("passkey test: the text has " + std::to_string(filler.size()) +
                           " tokens, fewer than a " + std::to_string(context) +
                           "-token context needs");
    }
    for (size_t di = 0; di < options.depths.size(); ++di) {
      RecallCell cell;
      cell.context = context;
      cell.depth = options.depths[di];
      for (int trial = 0; trial < options.trials; ++trial) {
        // Seeded per cell and trial only: every scheme sees the same prompts.
        std::mt19937_64 rng(options.seed + 1000003ULL * context + 7919ULL * di + trial);
        const std::string passkey = std::to_string(10000 + rng() % 90000);
        const size_t offset = rng() % (filler.size() - prompt_tokens + 1);
        const std::vector<int32_t> slice(filler.begin() + offset,
                                         filler.begin() + offset + prompt_tokens);
        KVQ_ASSIGN_OR_RETURN(PasskeyPrompt prompt,
                             BuildPasskeyPrompt(model, slice, prompt_tokens, cell.depth, passkey));
        KVQ_ASSIGN_OR_RETURN(std::string answer,
                             GreedyAnswer(model, cache, prompt.tokens, options.answer_tokens));
        cell.correct += PasskeyAnswerCorrect(answer, passkey) ? 1 : 0;
        if (trial == 0) cell.example_answer = answer;
        ++cell.trials;
        if (on_trial) on_trial(++done, total);
      }
      cells.push_back(cell);
    }
  }
  return cells;
}

StatusOr<SchemeResult> RunSchemeEndToEnd(
    LoadedModel& model, const std::string& text, const std::vector<int32_t>& filler,
    const SchemeSpec& spec, const EndToEndOptions& options, bool is_baseline,
    const std::function<void(const SchemeProgress&)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  const KvShape shape = model.transformer->kv_shape();
  const int64_t max_tokens = model.transformer->config().max_position_embeddings;
  SchemeResult r;
  r.spec = spec;
  r.baseline = is_baseline;
  const KvCacheOptions cache_options =
      SchemeCacheOptions(spec, max_tokens, model.transformer->pool(), options.calibration_path);
  KVQ_ASSIGN_OR_RETURN(r.plan, PlanKvType(shape, cache_options));
  SchemeSpec f16{"f16", "f16", "f16", false, ""};
  KVQ_ASSIGN_OR_RETURN(KvTypePlan f16_plan,
                       PlanKvType(shape, SchemeCacheOptions(f16, max_tokens, nullptr)));
  r.bytes_per_token = r.plan.layout.BytesPerToken();
  r.bits_per_value =
      r.bytes_per_token * 8.0 / (2.0 * shape.num_layers * shape.num_kv_heads * shape.head_dim);
  r.compression_vs_f16 = f16_plan.layout.BytesPerToken() / r.bytes_per_token;
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, MakeKvCache(shape, cache_options));

  PerplexityOptions popts = options.perplexity;
  popts.save_logits_path.clear();
  popts.kl_base_path.clear();
  if (is_baseline) {
    popts.save_logits_path = options.baseline_logits_path;
    popts.save_logits_f32 = true;  // f16 storage alone would add ~1e-6 nats of KL
  } else {
    popts.kl_base_path = options.baseline_logits_path;
  }
  auto on_window = [&](const PerplexityProgress& p) {
    if (progress && p.window_done) progress({"perplexity", p.window, p.windows});
  };
  KVQ_ASSIGN_OR_RETURN(r.ppl, RunPerplexity(model, *cache, text, popts, on_window));
  if (is_baseline) {
    r.kl_mean = r.kl_p99 = 0;
    r.top1_agreement = 1;
  } else if (r.ppl.kl) {
    r.kl_mean = r.ppl.kl->mean;
    r.kl_p99 = r.ppl.kl->p99;
    r.top1_agreement = r.ppl.kl->top1_percent / 100.0;
  }
  auto on_trial = [&](int64_t done, int64_t total) {
    if (progress) progress({"recall", done, total});
  };
  KVQ_ASSIGN_OR_RETURN(r.recall, RunPasskeyRecall(model, *cache, filler, options.recall, on_trial));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace kvq
