#include "eval/tune.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <limits>

#include "eval/perplexity.h"
#include "kv/kv_policy.h"

namespace kvq {
namespace {

struct Measured {
  double kl = 0, top1 = 0, ppl = 0;
};

// Bytes per token of the policy's blocks (every layer, K and V, scales
// included; the per-sequence f16 windows are a constant, not per token).
StatusOr<double> BytesPerToken(const KvShape& shape, const TuneOptions& options,
                               const std::vector<KvLayerTypes>& layers) {
  KvCacheOptions cache = options.cache;
  cache.max_tokens = options.context;
  cache.policy = PolicyText(layers);
  KVQ_ASSIGN_OR_RETURN(const KvLayout layout, ComputeKvLayout(shape, cache));
  return layout.BytesPerToken();
}

// Perplexity run with the policy's cache; saves the log-probs to `save` or
// compares them with `base`.
StatusOr<Measured> Measure(LoadedModel& model, const std::string& text, const TuneOptions& options,
                           const std::vector<KvLayerTypes>& layers, const std::string& save,
                           const std::string& base) {
  KvCacheOptions cache_options = options.cache;
  cache_options.max_tokens = options.context;
  cache_options.memory_bytes = 0;
  cache_options.policy = PolicyText(layers);
  KVQ_ASSIGN_OR_RETURN(auto cache, MakeKvCache(model.transformer->kv_shape(), cache_options));
  PerplexityOptions p;
  p.context = options.context;
  p.batch = options.context;
  p.max_windows = options.windows;
  p.save_logits_path = save;
  p.save_logits_f32 = true;  // f16 storage alone would add ~1e-6 nats of KL
  p.kl_base_path = base;
  KVQ_ASSIGN_OR_RETURN(const PerplexityResult r, RunPerplexity(model, *cache, text, p));
  Measured m;
  m.ppl = r.ppl;
  if (r.kl) {
    m.kl = r.kl->mean;
    m.top1 = r.kl->top1_percent;
  }
  return m;
}

}  // namespace

std::string PolicyText(const std::vector<KvLayerTypes>& layers) {
  std::string text;
  for (size_t l = 0; l < layers.size(); ++l) {
    text += std::to_string(l) + ": " + layers[l].k_type + "/" + layers[l].v_type + "\n";
  }
  return text;
}

StatusOr<TuneResult> RunTune(LoadedModel& model, const std::string& text,
                             const TuneOptions& options,
                             const std::function<void(const std::string&)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  if (options.k_candidates.empty() || options.v_candidates.empty()) {
    return Status::Error("tune: no candidate types");
  }
  if (!(options.kl_budget > 0)) return Status::Error("tune: the KL budget must be positive");
  if (options.work_dir.empty()) return Status::Error("tune: no work folder for the baseline");
  const KvShape shape = model.transformer->kv_shape();
  const int64_t num_layers = shape.num_layers;
  const std::vector<std::string>* candidates[2] = {&options.k_candidates, &options.v_candidates};
  // Every candidate must be a valid type for this model before any run.
  for (int kv = 0; kv < 2; ++kv) {
    for (const std::string& c : *candidates[kv]) {
      std::vector<KvLayerTypes> probe(static_cast<size_t>(num_layers), {"f16", "f16"});
      (kv == 0 ? probe[0].k_type : probe[0].v_type) = c;
      auto bytes = BytesPerToken(shape, options, probe);
      if (!bytes.ok()) return bytes.status().WithContext("tune candidate '" + c + "'");
    }
  }
  TuneResult result;
  const std::string base_path = options.work_dir + "/tune-base.logits";
  std::vector<KvLayerTypes> f16(static_cast<size_t>(num_layers), {"f16", "f16"});
  KVQ_ASSIGN_OR_RETURN(result.f16_bytes_per_token, BytesPerToken(shape, options, f16));
  say("baseline: f16 cache, " + std::to_string(options.windows) + " windows of " +
      std::to_string(options.context) + " tokens");
  KVQ_ASSIGN_OR_RETURN(const Measured base, Measure(model, text, options, f16, base_path, ""));
  result.baseline_ppl = base.ppl;
  ++result.evaluations;

  // level[l][kv]: index into the candidates; sensitivity[l][kv][c]: KL of
  // that one change alone (0 at c = 0 by definition of the starting point).
  const size_t layers = static_cast<size_t>(num_layers);
  std::vector<std::array<size_t, 2>> level(layers, {0, 0});
  auto policy_of = [&](const std::vector<std::array<size_t, 2>>& lv) {
    std::vector<KvLayerTypes> types(layers);
    for (size_t l = 0; l < layers; ++l) {
      types[l] = {(*candidates[0])[lv[l][0]], (*candidates[1])[lv[l][1]]};
    }
    return types;
  };
  std::vector<std::array<std::vector<double>, 2>> sensitivity(layers);
  for (size_t l = 0; l < layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      sensitivity[l][kv].assign(candidates[kv]->size(), 0.0);
      for (size_t c = 1; c < candidates[kv]->size(); ++c) {
        auto lv = level;
        lv[l][kv] = c;
        KVQ_ASSIGN_OR_RETURN(const Measured m,
                             Measure(model, text, options, policy_of(lv), "", base_path));
        ++result.evaluations;
        sensitivity[l][kv][c] = m.kl;
        say("sensitivity: layer " + std::to_string(l) + (kv == 0 ? " K " : " V ") +
            (*candidates[kv])[c] + ": KL " + std::to_string(m.kl));
      }
    }
  }

  auto predicted = [&](const std::vector<std::array<size_t, 2>>& lv) {
    double kl = 0;
    for (size_t l = 0; l < layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) kl += sensitivity[l][kv][lv[l][kv]];
    }
    return kl;
  };
  KVQ_ASSIGN_OR_RETURN(const Measured start_point,
                       Measure(model, text, options, policy_of(level), "", base_path));
  ++result.evaluations;
  TunePoint current;
  current.policy = PolicyText(policy_of(level));
  KVQ_ASSIGN_OR_RETURN(current.bytes_per_token, BytesPerToken(shape, options, policy_of(level)));
  current.measured_kl = start_point.kl;
  current.top1_percent = start_point.top1;
  current.accepted = start_point.kl <= options.kl_budget;
  current.step = "start: the first candidate everywhere";
  result.frontier.push_back(current);
  if (!current.accepted) {
    return Status::Error("tune: the most precise candidates already exceed the KL budget (" +
                         std::to_string(start_point.kl) + " > " +
                         std::to_string(options.kl_budget) + ")");
  }
  result.best = current;

  std::vector<std::array<bool, 2>> frozen(layers, {false, false});
  while (true) {
    // The step down with the least predicted KL per byte saved.
    double best_ratio = std::numeric_limits<double>::infinity();
    size_t best_layer = 0;
    int best_kv = -1;
    double best_bytes = 0;
    for (size_t l = 0; l < layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        if (frozen[l][kv] || level[l][kv] + 1 >= candidates[kv]->size()) continue;
        auto lv = level;
        ++lv[l][kv];
        KVQ_ASSIGN_OR_RETURN(const double bytes, BytesPerToken(shape, options, policy_of(lv)));
        const double saved = current.bytes_per_token - bytes;
        if (saved <= 0) continue;  // a "cheaper" candidate that is not: skip it
        const double added =
            std::max(0.0, sensitivity[l][kv][lv[l][kv]] - sensitivity[l][kv][level[l][kv]]);
        if (added / saved < best_ratio) {
          best_ratio = added / saved;
          best_layer = l;
          best_kv = kv;
          best_bytes = bytes;
        }
      }
    }
    if (best_kv < 0) break;
    auto lv = level;
    ++lv[best_layer][best_kv];
    TunePoint point;
    point.policy = PolicyText(policy_of(lv));
    point.bytes_per_token = best_bytes;
    point.predicted_kl = predicted(lv);
    point.step = "layer " + std::to_string(best_layer) + (best_kv == 0 ? " K " : " V ") +
                 (*candidates[best_kv])[level[best_layer][best_kv]] + " -> " +
                 (*candidates[best_kv])[lv[best_layer][best_kv]];
    if (point.predicted_kl > options.kl_budget) {
      // Not worth a run: the sum of sensitivities already exceeds the budget.
      frozen[best_layer][best_kv] = true;
      result.frontier.push_back(point);
      say("skip (predicted KL " + std::to_string(point.predicted_kl) + "): " + point.step);
      continue;
    }
    KVQ_ASSIGN_OR_RETURN(const Measured m,
                         Measure(model, text, options, policy_of(lv), "", base_path));
    ++result.evaluations;
    point.measured_kl = m.kl;
    point.top1_percent = m.top1;
    point.accepted = m.kl <= options.kl_budget;
    result.frontier.push_back(point);
    say(std::string(point.accepted ? "accept" : "reject") + " (KL " + std::to_string(m.kl) + ", " +
        std::to_string(point.bytes_per_token) + " B/token): " + point.step);
    if (point.accepted) {
      level = lv;
      current = point;
      result.best = point;
    } else {
      frozen[best_layer][best_kv] = true;
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace kvq
