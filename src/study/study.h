// kvq study: for one model and text, capture the real K/V, measure their
// structure (outlier channels, k_proj bias, attention sinks, statistics),
// fake-quantize them (the write-up's experiment as written and corrected),
// run every cache scheme end to end (perplexity, KL, top-1, passkey recall,
// bytes), optionally needle-in-a-haystack and GSM8K per scheme, and return
// every number as the JSON object docs/study.md documents. The CLI prints a table
// from it and the report renders it.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/loaded_model.h"
#include "eval/calibrate.h"
#include "study/study_context_kl.h"
#include "study/study_e2e.h"
#include "study/study_gsm8k.h"
#include "study/study_niah.h"

namespace kvq {

// Version 2: the per-channel statistics are named for what they hold
// (`*_channel_mean_abs`, `k_pre_rope_outlier_consistency`), the fake-quant
// rows are the write-up's as written plus the corrected ones, with claims.
inline constexpr int kStudyVersion = 2;

struct StudyOptions {
  std::string model_path;  // for the JSON header
  std::string text_path;
  std::string command;  // argv joined
  bool quick = false;
  int64_t context = 1024;         // perplexity window (tokens)
  int64_t chunks = 4;             // perplexity windows (0 = the whole text)
  int64_t capture_tokens = 1024;  // tokens captured for sections 1-3
  int64_t batch = 512;            // tokens per forward call
  std::vector<SchemeSpec> schemes;
  RecallOptions recall;
  std::vector<int> fake_quant_bits = {2, 4};
  int64_t token_group = 32;          // per-channel statistics block (KIVI's G)
  std::string dump_path;             // --dump: captured tensors as safetensors ("" = none)
  std::string baseline_logits_path;  // scratch file for the f16 run's log-probs
  // KVQuant schemes need a calibration (kvq calibrate). With calibration_path
  // the study uses that file; otherwise it calibrates before the end-to-end
  // runs (gradient-free "q2" weights) on calibration_text, or, when that is
  // empty, on the study text after the perplexity windows (the JSON's
  // "calibration" says which), and keeps the file at
  // calibration_scratch_path for the run.
  std::string calibration_path;
  std::string calibration_text;
  std::string calibration_text_path;  // for the JSON
  std::string calibration_scratch_path;
  CalibrateOptions calibration;  // tokens, window, bits, outliers
  std::vector<int64_t> memory_contexts = {512, 1024, 2048, 4096, 8192, 16384, 32768};
  int threads = 1;
  // Stages: capture, outliers, fake quantization and end to end ("core"),
  // then optionally the needle-in-a-haystack, GSM8K and context-KL stages, each with its
  // own schemes (f16 is added first) and a results directory to resume from.
  bool core = true;
  // Where stage 4 records each scheme's result and resumes from ("" = keep
  // nothing between runs).
  std::string end_to_end_dir;
  struct NeedleStage {
    bool run = false;
    NeedleOptions options;
    std::vector<SchemeSpec> schemes;
    std::string dir;
  } needle;
  struct Gsm8kStage {
    bool run = false;
    Gsm8kOptions options;
    std::vector<SchemeSpec> schemes;
    std::string data_path, sha256sums_path;  // sums "" = unchecked
    std::string dir;
  } gsm8k;
  struct ContextKlStage {  // KL vs f16 by context length
    bool run = false;
    ContextKlOptions options;
    std::vector<SchemeSpec> schemes;
    std::string dir;
  } context_kl;
};

struct StudyEvent {
  std::string stage;   // "capture", "outliers", "fake_quant", "scheme 3/10 int4"
  std::string detail;  // e.g. "perplexity", "recall"
  int64_t done = 0, total = 0;
};

// Checks the options against the model and text before any heavy work
// (context fits, text long enough, schemes known).
Status ValidateStudy(const LoadedModel& model, const std::vector<int32_t>& text_tokens,
                     const StudyOptions& options);

StatusOr<nlohmann::json> RunStudy(LoadedModel& model, const std::string& text,
                                  const StudyOptions& options,
                                  const std::function<void(const StudyEvent&)>& progress = nullptr);

// The held-out text `kvq study` uses without -f: .deps/corpus/test.txt in the
// working directory, else beside the binary's source tree; "" if absent.
std::string DefaultStudyTextPath();
// .deps/corpus/NAME found the same way; "" if absent.
std::string DefaultCorpusPath(const std::string& name);
// The validation split when `study_text_path` is the default test split (so
// KVQuant calibrates on held-out text of the same corpus), else "".
std::string DefaultCalibrationTextPath(const std::string& study_text_path);

// The GSM8K test split kvq's sessions share: ../shared/data/gsm8k/test.jsonl
// from the working directory, the binary's source tree or the source dir; ""
// if absent.
std::string DefaultGsm8kPath();

// A finite number, or null (JSON has no NaN / inf).
nlohmann::json JsonNumber(double x);

}  // namespace kvq
