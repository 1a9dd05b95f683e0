// A model's study directory (docs/study/<model>/) as one study JSON: the
// core run's study.json plus the sections the long stages write to their own
// files beside it (bench/study_long.sh: needle.json, gsm8k.json,
// context_kl.json), so `kvq study --compare` and the report see all of them.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"

namespace kvq {

// The long stages' files and the section each holds, in report order.
inline constexpr const char* kStageFiles[][2] = {
    {"needle.json", "needle"}, {"gsm8k.json", "gsm8k"}, {"context_kl.json", "context_kl"}};

// `path` a study JSON file: it, parsed. `path` a directory: its study.json
// (required) with every stage file's section added. A stage file must name
// the same model file and study version, and must not hold a section that
// study.json (or another file) already has: two sources for one section
// are an error, not a silent choice.
StatusOr<nlohmann::json> LoadStudy(const std::string& path);

}  // namespace kvq
