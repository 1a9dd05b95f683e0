// Offline calibration for KVQuant-style codecs (codec_nuq.cc): per-channel
// key normalization (pre-RoPE) and per-layer non-uniform codebooks, written
// by `kvq calibrate` as one safetensors file and read by the cache.
//
// File layout (every tensor F32; L layers, H KV heads, D head_dim):
//   k.channel_offset     [L, H, D]  centre of each pre-RoPE key channel's
//                                   inlier range (between the outlier
//                                   thresholds, the p/2 and 1 - p/2
//                                   quantiles for p = outlier_percent %)
//   k.channel_scale      [L, H, D]  half that range: y = (k - offset) / scale
//                                   puts the inliers in [-1, 1]
//   nuq{B}.k.levels      [L, 2^B]   sorted codebook levels in the normalized
//   nuq{B}.v.levels      [L, 2^B]   domain, one set per requested bit width B
//   fp8.k_scale          [L]        version 2 (optional): vLLM's per-tensor fp8 E4M3 scale of
//   fp8.v_scale          [L]        each layer's (post-RoPE) K and V: amax / 448 over
//                                   every calibration token, as llm-compressor
//                                   computes the k_scale/v_scale vLLM loads
//                                   (fp8_e4m3-tcal reads them; docs/export.md)
//   oscar.k.rotation     [L, H, D, D]  (version 2, when `rotation` is set)
//   oscar.v.rotation     [L, H, D, D]  OSCAR's calibrated orthogonal
//                                   rotations M per (layer, KV head), row-major:
//                                   the cache stores M x (codec_oscar.cc)
// Metadata ("__metadata__" strings): format = "kvq-kvquant-calibration/2"
// (version 1 files, without the optional fp8 and rotation tensors, are still
// read), num_layers, num_heads, num_kv_heads, head_dim, bits ("2,3,4"),
// tokens, outlier_percent, method, qnorm ("0"/"1"), model, rotation (the
// objective the rotations were fitted with, "qqt_sst" or "ktk_vtv"; "" = none).
//
// LoadKvCalibration also reads a vLLM KV-scale file (tensors
// `model.layers.N.self_attn.k_scale` / `.v_scale`, what `kvq calibrate
// --export vllm` writes and vLLM loads from a checkpoint): only the fp8
// scales are then set (scales_only), and only num_layers is checked.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "kv/kv_cache.h"

namespace kvq {

inline constexpr char kKvCalibrationFormat[] = "kvq-kvquant-calibration/2";
inline constexpr char kKvCalibrationFormatV1[] = "kvq-kvquant-calibration/1";

struct KvCalibration {
  std::string source;  // the file it came from (error messages)
  int64_t num_layers = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t tokens = 0;           // calibration tokens the statistics saw
  int64_t outlier_percent = 1;  // quantiles the channel ranges were cut at
  std::string method;           // how levels were weighted (see eval/calibrate.h)
  bool qnorm = false;           // levels rescaled to keep the calibration mean/std
  std::string model;
  std::vector<float> k_offset, k_scale;  // [num_layers, num_kv_heads, head_dim] each
  struct Codebooks {
    std::vector<float> k, v;  // [num_layers, 2^bits] each, sorted
  };
  std::map<int, Codebooks> codebooks;  // by bit width
  // vLLM's per-tensor fp8 E4M3 scales, [num_layers] each; empty when the
  // file has none (version 1). Finite and > 0 when present.
  std::vector<float> fp8_k_scale, fp8_v_scale;
  // Read from a vLLM KV-scale file: no codebooks, channel ranges, heads or
  // head_dim (those are 0), only num_layers and the fp8 scales.
  bool scales_only = false;
  // OSCAR rotations, [num_layers, num_kv_heads, head_dim, head_dim] each
  // (empty when rotation_objective is empty: format-1 files).
  std::string rotation_objective;
  std::vector<float> k_rotation, v_rotation;
  int format_version = 2;  // of the file it was loaded from

  std::string BitsList() const;  // "2,3,4"
  // The model shape the file was made for must be `shape`'s; errors name
  // each mismatching field and both values.
  Status CheckShape(const KvShape& shape) const;
  // The codebooks of `bits`, or an error naming the bit widths present.
  StatusOr<const Codebooks*> ForBits(int bits) const;
};

// vLLM's checkpoint names of layer l's scales ("model.layers.3.self_attn.k_scale").
std::string VllmKvScaleName(int64_t layer, bool is_v);
// llm-compressor's static fp8 scale of a tensor with absolute maximum amax:
// amax / 448 in f32 (compressed-tensors calculate_qparams: max / (range / 2)),
// a zero scale replaced by f32 epsilon. Non-finite amax gives a non-finite scale.
float Fp8E4M3TensorScale(float amax);

// Reads and validates a calibration file (every tensor present with its
// shape, scales positive, levels finite and sorted, rotations orthogonal),
// or a vLLM KV-scale file (see the top; every k_scale/v_scale finite and > 0,
// else an error naming it).
StatusOr<KvCalibration> LoadKvCalibration(const std::string& path);
Status SaveKvCalibration(const KvCalibration& calibration, const std::string& path);
// Writes the fp8 scales as vLLM reads them from a checkpoint: one F32 [1]
// tensor per layer and K/V named VllmKvScaleName (docs/export.md). Error if
// the calibration has no fp8 scales or one is not finite and > 0.
Status SaveVllmKvScales(const KvCalibration& calibration, const std::string& path);

// Weighted 1-D k-means (Lloyd's algorithm): k centres minimizing
// sum_i w_i (x_i - nearest centre)^2. Sorts the points once; each iteration
// then finds the cells by binary search and their weighted means by prefix
// sums (O(k log n)). Starts from the weighted quantiles (j + 1/2) / k and
// stops when no centre moves or after max_iterations. Returns k sorted
// centres (an empty cell keeps its previous centre). values, weights: [n].
std::vector<double> WeightedKMeans1D(const std::vector<float>& values,
                                     const std::vector<float>& weights, int k,
                                     int max_iterations = 200);

// Pre-RoPE key channel ranges of one layer: for each (KV head, channel) the
// p/2 and 1 - p/2 quantiles (p = outlier_percent %, at least the extreme
// values when p = 0) give offset = their midpoint and scale = half their
// distance (at least 2^-14, so constant channels stay well defined).
// k: [n, kv_heads, head_dim]; offset, scale: [kv_heads, head_dim].
void KeyChannelRanges(const float* k, int64_t n, int64_t kv_heads, int64_t head_dim,
                      int64_t outlier_percent, float* offset, float* scale);

// One layer's K or V rows and how to weight their errors.
struct NuqFitInput {
  int bits = 3;
  bool is_v = false;
  int64_t outlier_percent = 1;
  int64_t n = 0, kv_heads = 0, head_dim = 0;
  const float* x = nullptr;  // [n, kv_heads, head_dim]
  // K: the channel normalization the codec will use ([kv_heads, head_dim]).
  const float* k_offset = nullptr;
  const float* k_scale = nullptr;
  // Sensitivity per (KV head, channel) ([kv_heads, head_dim]), or null for
  // uniform. K: E[q_c^2]-style weights, so the k-means minimizes the
  // expected squared score error.
  const float* channel_weight = nullptr;
  // Or one weight per element (diagonal Fisher information), [n, kv_heads,
  // head_dim]; wins over channel_weight.
  const float* element_weight = nullptr;
  bool qnorm = false;
};
// The 2^bits levels (sorted, normalized domain) for one layer: every row is
// split exactly as the codec will split it (NuqSplitRowRef: outlier slots
// set aside, the rest normalized), the inliers (clamped to [-1, 1]) are the
// k-means points, weighted by channel_weight * scale^2 so the objective is
// the (sensitivity-weighted) error in the original units. With qnorm the
// levels are then shifted and scaled so the dequantized inliers have the
// mean and standard deviation of the originals (KVQuant's Q-Norm).
StatusOr<std::vector<float>> FitNuqLevels(const NuqFitInput& in);

// ---- OSCAR (arXiv:2605.17757) rotations ----
// Eigen-decomposition of a symmetric matrix a [n, n] (row-major, double) by
// cyclic Jacobi rotations: eigenvalues ascending (as LAPACK's syevd, which
// OSCAR's torch.linalg.eigh calls) and the matching unit eigenvectors as
// the columns of vectors [n, n].
void SymmetricEigen(const std::vector<double>& a, int64_t n, std::vector<double>* values,
                    std::vector<double>* vectors);
// Largest |M Mᵀ - I| entry of m [n, n]: how far from orthogonal it is.
double OrthogonalityError(const float* m, int64_t n);
// OSCAR's rotation from an attention-aware covariance cov [dim, dim] (dim a
// power of two up to 256): U its eigenvectors (ascending), H the normalized
// Sylvester Hadamard matrix (no signs), P the bit-reversal permutation of
// the eigenvalues sorted in descending order; OSCAR stores x U H P (row
// vectors), so m = (U H P)ᵀ = Pᵀ H Uᵀ, row-major [dim, dim], stored = m x.
// U decorrelates, so H gives every rotated coordinate the same variance
// (tr(cov) / dim): no coordinate concentrates an outlier direction, which a
// data-free Hadamard does when outlier channels move together. P only
// reorders the rotated coordinates: with one quantization group per row
// (OSCAR's group 128 at head_dim 128) it does not change the codes.
StatusOr<std::vector<float>> FitOscarRotation(const std::vector<double>& cov, int64_t dim);

}  // namespace kvq
