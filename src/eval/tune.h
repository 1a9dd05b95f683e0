// kvq tune: per-layer K/V bit widths that minimize KV bytes per token under a
// KL-divergence budget on calibration text (the idea of KVTuner, arXiv
// 2502.04420, with a simpler search).
//
// Search (documented in docs/ARCHITECTURE.md, "kvq tune"):
//  1. Baseline: the f16 cache's next-token log-probs on the calibration
//     windows (the perplexity convention, eval/perplexity.h).
//  2. Sensitivity: every (layer, K or V, candidate type) alone, the rest at
//     the first (most precise) candidate: measured mean KL vs the baseline.
//  3. Greedy descent: start from the most precise policy; repeatedly take the
//     single step down (one layer's K or V to its next cheaper candidate)
//     with the least predicted KL increase per byte saved, the prediction
//     being the sum of the chosen entries' sensitivities (KL adds to first
//     order for small perturbations). Every accepted step is measured for
//     real; a step whose measured KL exceeds the budget is undone and that
//     (layer, K/V) is frozen. Stops when no step is left.
// Every measured point is returned (the explored frontier).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/loaded_model.h"
#include "kv/kv_factory.h"

namespace kvq {

struct TuneOptions {
  // Candidate cache types, most precise first (each a codec or scheme name
  // valid for K and for V, e.g. "f16,int8,int4,int2" or KIVI's halves).
  std::vector<std::string> k_candidates = {"f16", "int8", "int4-c32-asym-r128",
                                           "int2-c32-asym-r128"};
  std::vector<std::string> v_candidates = {"f16", "int8", "int4-g32-asym-r128",
                                           "int2-g32-asym-r128"};
  double kl_budget = 0.01;  // mean KL(f16 || policy), nats per token
  int64_t context = 512;    // calibration window (perplexity convention)
  int64_t windows = 4;      // calibration windows
  KvCacheOptions cache;     // block size, threads (types come from the search)
  std::string work_dir;     // for the baseline log-probs file
};

struct TunePoint {
  std::string policy;  // --kv-policy text
  double bytes_per_token = 0;
  double predicted_kl = 0;
  double measured_kl = -1;  // -1: not measured
  double top1_percent = 0;
  bool accepted = false;
  std::string step;  // what changed, e.g. "layer 2 V int8 -> int4-g32-asym-r128"
};

struct TuneResult {
  std::vector<TunePoint> frontier;  // in search order
  TunePoint best;                   // the cheapest accepted policy
  double f16_bytes_per_token = 0;
  double baseline_ppl = 0;
  int64_t evaluations = 0;
  double seconds = 0;
};

// Policy text for per-layer (K type, V type).
std::string PolicyText(const std::vector<KvLayerTypes>& layers);

StatusOr<TuneResult> RunTune(LoadedModel& model, const std::string& text,
                             const TuneOptions& options,
                             const std::function<void(const std::string&)>& progress = nullptr);

}  // namespace kvq
