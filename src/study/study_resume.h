// Resumable results for the long study stages (needle in a haystack, GSM8K):
// each cell's results are JSON lines appended to one file and flushed line
// by line, so a killed run loses at most the line it was writing and a rerun
// continues where it stopped. A directory's configuration is recorded once
// (config.json) and a rerun with a different one is refused rather than
// mixing results.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "ops/simd_target.h"

namespace kvq {

// Creates `dir` (and parents) if needed; writes `config` to dir/config.json
// the first time; afterwards the file must hold exactly `config`.
Status PrepareResultDir(const std::string& dir, const nlohmann::json& config);

// One results file of JSON lines.
class ResultLog {
 public:
  // Reads every complete line of `path` (absent = none). A trailing line
  // without its newline (a write cut short) is dropped from the file; a
  // complete line that is not a JSON object is an error naming the file and
  // line.
  static StatusOr<ResultLog> Open(const std::string& path);

  const std::vector<nlohmann::json>& records() const { return records_; }
  // Appends one record as a line and flushes it to the file, stamped with
  // "simd_target" (SimdTargetName()): a run may resume on another machine,
  // and kernels of different SIMD targets round differently, which can
  // change a greedy answer.
  Status Append(const nlohmann::json& record);

 private:
  std::string path_;
  std::vector<nlohmann::json> records_;
};

using ops::SimdTargetName;

// A file-name-safe name for a scheme spec or cell: [A-Za-z0-9._-] kept,
// anything else '_', plus 8 hex digits of a hash of the original (so
// "f16/int4" and "f16_int4" stay apart).
std::string ResultFileStem(const std::string& name);

}  // namespace kvq
