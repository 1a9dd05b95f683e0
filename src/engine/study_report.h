// The self-contained HTML report of `kvq study` (--report FILE.html),
// rendered from the study JSON (engine/study.h) without recomputing numbers.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"

namespace kvq {

Status WriteStudyReport(const nlohmann::json& study, const std::string& path);

}  // namespace kvq
