// `kvq calibrate`: offline statistics for KVQuant's NUQ codecs
// (kv/kv_calibration.h has the file format). The model runs over calibration
// text in windows of `context` tokens with an f32 cache; every layer's
// pre-RoPE K, V and (for the sensitivity weights) q are captured, then:
//   1. per (layer, KV head, channel): the pre-RoPE key range between the
//      outlier thresholds (KeyChannelRanges);
//   2. per (layer, bits, K/V): 2^bits levels by weighted k-means over the
//      rows split exactly as the codec splits them (FitNuqLevels).
// Position 0 of each window is left out: the schemes keep the first token in
// f16 (an attention sink, often far outside the other tokens' range).
//
// Sensitivity (the k-means weights). KVQuant weights each activation by its
// diagonal Fisher information (squared gradient of the loss). The
// gradient-free fallback used here ("method: q2") weights key channel c of a
// KV head by the expected squared query component that multiplies a key
// error in c: a score is q_rot(i) . R(t) k(t), so an error dk in the pre-RoPE
// key changes it by (R(i - t) q(i)) . dk with q(i) the pre-RoPE query. The
// weight is E[(R(i - t) q(i))_c^2] over the query heads sharing the KV head,
// the query positions i and the causal key positions t <= i (uniformly), which
// the RoPE pair structure makes a closed form per query:
//   channel a of pair (a, b):  C q_a^2 + S q_b^2 - 2 X q_a q_b
//   channel b:                 C q_b^2 + S q_a^2 + 2 X q_a q_b
// with C, S, X the means of cos^2, sin^2 and sin*cos of theta * delta over
// delta = 0..i. Values are weighted uniformly (attention mass is not used).
// In both cases the k-means objective is in the original units (the codec's
// scale squared multiplies each weight). With `fisher_path` (written by
// tools/train/kvquant_fisher.py from the PyTorch reference model over the
// same windows; "method: fisher") every K and V element is weighted by its
// own squared gradient of the summed next-token NLL instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/loaded_model.h"
#include "kv/kv_calibration.h"

namespace kvq {

struct CalibrateOptions {
  std::vector<int> bits{2, 3, 4};
  int64_t tokens = 4096;  // calibration tokens to use (whole windows, at least one)
  int64_t context = 512;  // window length
  int64_t outlier_percent = 1;
  bool qnorm = false;
  // "q2": key channels weighted as above; "uniform": every value alike
  // (plain k-means in original units, for comparison).
  std::string weights = "q2";
  std::string fisher_path;  // squared gradients per K/V element (optional)
  // OSCAR's rotations per (layer, KV head) (kv_calibration.h,
  // FitOscarRotation), from the post-RoPE K, V and q of the same windows:
  //   "qqt_sst" (OSCAR's validated choice): K from E[q qᵀ] over the query
  //             heads of the KV head, V from E[w v vᵀ], w = k E[q qᵀ] kᵀ
  //             per token normalized to mean 1 (the attention a key draws);
  //   "ktk_vtv": K from E[k kᵀ], V from E[v vᵀ] (the rows' own covariance);
  //   "none":    no rotations (the file then serves only kvquant*).
  // Per KV head rather than OSCAR v1's one per layer: its v2 format moved to
  // per head (KV heads of one layer can want near-orthogonal rotations) and
  // the cache holds one codec per (layer, KV head) anyway.
  std::string rotation = "qqt_sst";
};

struct CalibrateResult {
  KvCalibration calibration;
  int64_t windows = 0;
};

StatusOr<CalibrateResult> CalibrateKv(LoadedModel& model, const std::string& text,
                                      const CalibrateOptions& options);
// The same over tokens already tokenized as PerplexityTokens does (BOS first
// if the model adds one); each window's first token is replaced by BOS.
StatusOr<CalibrateResult> CalibrateKvTokens(LoadedModel& model, const std::vector<int32_t>& tokens,
                                            const CalibrateOptions& options);

}  // namespace kvq
