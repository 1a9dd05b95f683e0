#include "eval/tune.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>

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

namespace {

// Index into the K (0) or V (1) candidates, per layer.
using Levels = std::vector<std::array<size_t, 2>>;

// A step down the candidate list: one layer's K or V to its next candidate.
struct Step {
  size_t layer = 0;
  int kv = 0;
  double bytes_per_token = 0;  // of the policy after the step
};

// The greedy search of RunTune: sensitivities of each single change, then
// steps down by least predicted KL per byte saved, each measured.
class Tuner {
 public:
  Tuner(LoadedModel& model, const std::string& text, const TuneOptions& options,
        const std::function<void(const std::string&)>& progress)
      : model_(model),
        text_(text),
        options_(options),
        progress_(progress),
        shape_(model.transformer->kv_shape()),
        layers_(static_cast<size_t>(shape_.num_layers)),
        candidates_{&options.k_candidates, &options.v_candidates},
        base_path_(options.work_dir + "/tune-base.logits"),
        level_(layers_, {0, 0}),
        sensitivity_(layers_),
        frozen_(layers_, {false, false}) {}

  // Every candidate must be a valid type for this model before any run.
  Status CheckCandidates() {
    for (int kv = 0; kv < 2; ++kv) {
      for (const std::string& c : *candidates_[kv]) {
        std::vector<KvLayerTypes> probe(layers_, {"f16", "f16"});
        (kv == 0 ? probe[0].k_type : probe[0].v_type) = c;
        auto bytes = BytesPerToken(shape_, options_, probe);
        if (!bytes.ok()) return bytes.status().WithContext("tune candidate '" + c + "'");
      }
    }
    return Status::Ok();
  }

  // The f16 cache's log-probs, the base every later run is compared with.
  Status MeasureBaseline(TuneResult* result) {
    std::vector<KvLayerTypes> f16(layers_, {"f16", "f16"});
    KVQ_ASSIGN_OR_RETURN(result->f16_bytes_per_token, BytesPerToken(shape_, options_, f16));
    Say("baseline: f16 cache, " + std::to_string(options_.windows) + " windows of " +
        std::to_string(options_.context) + " tokens");
    KVQ_ASSIGN_OR_RETURN(const Measured base,
                         Measure(model_, text_, options_, f16, base_path_, ""));
    result->baseline_ppl = base.ppl;
    ++result->evaluations;
    return Status::Ok();
  }

  // sensitivity_[l][kv][c]: KL of that one change alone (0 at c = 0, the
  // starting point).
  Status MeasureSensitivities(TuneResult* result) {
    for (size_t l = 0; l < layers_; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        sensitivity_[l][kv].assign(candidates_[kv]->size(), 0.0);
        for (size_t c = 1; c < candidates_[kv]->size(); ++c) {
          Levels lv = level_;
          lv[l][kv] = c;
          KVQ_ASSIGN_OR_RETURN(const Measured m, MeasureLevels(lv));
          ++result->evaluations;
          sensitivity_[l][kv][c] = m.kl;
          Say("sensitivity: layer " + std::to_string(l) + (kv == 0 ? " K " : " V ") +
              (*candidates_[kv])[c] + ": KL " + std::to_string(m.kl));
        }
      }
    }
    return Status::Ok();
  }

  // The first candidate everywhere, which must fit the budget.
  Status Start(TuneResult* result) {
    KVQ_ASSIGN_OR_RETURN(const Measured start_point, MeasureLevels(level_));
    ++result->evaluations;
    current_.policy = PolicyText(PolicyOf(level_));
    KVQ_ASSIGN_OR_RETURN(current_.bytes_per_token,
                         BytesPerToken(shape_, options_, PolicyOf(level_)));
    current_.measured_kl = start_point.kl;
    current_.top1_percent = start_point.top1;
    current_.accepted = start_point.kl <= options_.kl_budget;
    current_.step = "start: the first candidate everywhere";
    result->frontier.push_back(current_);
    if (!current_.accepted) {
      return Status::Error("tune: the most precise candidates already exceed the KL budget (" +
                           std::to_string(start_point.kl) + " > " +
                           std::to_string(options_.kl_budget) + ")");
    }
    result->best = current_;
    return Status::Ok();
  }

  // Takes steps until none is left; each is skipped (predicted over the
  // budget), accepted or rejected, and a skipped or rejected one freezes its
  // layer's K or V.
  Status Descend(TuneResult* result) {
    while (true) {
      KVQ_ASSIGN_OR_RETURN(const std::optional<Step> step, CheapestStep());
      if (!step) return Status::Ok();
      Levels lv = level_;
      ++lv[step->layer][step->kv];
      TunePoint point;
      point.policy = PolicyText(PolicyOf(lv));
      point.bytes_per_token = step->bytes_per_token;
      point.predicted_kl = PredictedKl(lv);
      point.step = "layer " + std::to_string(step->layer) + (step->kv == 0 ? " K " : " V ") +
                   (*candidates_[step->kv])[level_[step->layer][step->kv]] + " -> " +
                   (*candidates_[step->kv])[lv[step->layer][step->kv]];
      if (point.predicted_kl > options_.kl_budget) {
        // Not worth a run: the sum of sensitivities already exceeds the budget.
        frozen_[step->layer][step->kv] = true;
        result->frontier.push_back(point);
        Say("skip (predicted KL " + std::to_string(point.predicted_kl) + "): " + point.step);
        continue;
      }
      KVQ_ASSIGN_OR_RETURN(const Measured m, MeasureLevels(lv));
      ++result->evaluations;
      point.measured_kl = m.kl;
      point.top1_percent = m.top1;
      point.accepted = m.kl <= options_.kl_budget;
      result->frontier.push_back(point);
      Say(std::string(point.accepted ? "accept" : "reject") + " (KL " + std::to_string(m.kl) +
          ", " + std::to_string(point.bytes_per_token) + " B/token): " + point.step);
      if (point.accepted) {
        level_ = lv;
        current_ = point;
        result->best = point;
      } else {
        frozen_[step->layer][step->kv] = true;
      }
    }
  }

 private:
  void Say(const std::string& line) const {
    if (progress_) progress_(line);
  }

  std::vector<KvLayerTypes> PolicyOf(const Levels& lv) const {
    std::vector<KvLayerTypes> types(layers_);
    for (size_t l = 0; l < layers_; ++l) {
      types[l] = {(*candidates_[0])[lv[l][0]], (*candidates_[1])[lv[l][1]]};
    }
    return types;
  }

  StatusOr<Measured> MeasureLevels(const Levels& lv) {
    return Measure(model_, text_, options_, PolicyOf(lv), "", base_path_);
  }

  double PredictedKl(const Levels& lv) const {
    double kl = 0;
    for (size_t l = 0; l < layers_; ++l) {
      for (int kv = 0; kv < 2; ++kv) kl += sensitivity_[l][kv][lv[l][kv]];
    }
    return kl;
  }

  // The step down with the least predicted KL per byte saved; none when
  // every layer's K and V is frozen or at its last candidate.
  StatusOr<std::optional<Step>> CheapestStep() const {
    double best_ratio = std::numeric_limits<double>::infinity();
    std::optional<Step> best;
    for (size_t l = 0; l < layers_; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        if (frozen_[l][kv] || level_[l][kv] + 1 >= candidates_[kv]->size()) continue;
        Levels lv = level_;
        ++lv[l][kv];
        KVQ_ASSIGN_OR_RETURN(const double bytes, BytesPerToken(shape_, options_, PolicyOf(lv)));
        const double saved = current_.bytes_per_token - bytes;
        if (saved <= 0) continue;  // a "cheaper" candidate that is not: skip it
        const double added =
            std::max(0.0, sensitivity_[l][kv][lv[l][kv]] - sensitivity_[l][kv][level_[l][kv]]);
        if (added / saved < best_ratio) {
          best_ratio = added / saved;
          best = Step{l, kv, bytes};
        }
      }
    }
    return best;
  }

  LoadedModel& model_;
  const std::string& text_;
  const TuneOptions& options_;
  const std::function<void(const std::string&)>& progress_;
  const KvShape shape_;
  const size_t layers_;
  const std::vector<std::string>* candidates_[2];
  const std::string base_path_;
  Levels level_;
  std::vector<std::array<std::vector<double>, 2>> sensitivity_;  // [layer][kv][candidate]
  std::vector<std::array<bool, 2>> frozen_;
  TunePoint current_;  // the last accepted point
};

}  // namespace

StatusOr<TuneResult> RunTune(LoadedModel& model, const std::string& text,
                             const TuneOptions& options,
                             const std::function<void(const std::string&)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  if (options.k_candidates.empty() || options.v_candidates.empty()) {
    return Status::Error("tune: no candidate types");
  }
  if (!(options.kl_budget > 0)) return Status::Error("tune: the KL budget must be positive");
  if (options.work_dir.empty()) return Status::Error("tune: no work folder for the baseline");
  Tuner tuner(model, text, options, progress);
  TuneResult result;
  KVQ_RETURN_IF_ERROR(tuner.CheckCandidates());
  KVQ_RETURN_IF_ERROR(tuner.MeasureBaseline(&result));
  KVQ_RETURN_IF_ERROR(tuner.MeasureSensitivities(&result));
  KVQ_RETURN_IF_ERROR(tuner.Start(&result));
  KVQ_RETURN_IF_ERROR(tuner.Descend(&result));
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace kvq
