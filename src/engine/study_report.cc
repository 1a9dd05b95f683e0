// Placeholder until the report lands (another branch replaces this file):
// --report fails with a clear message instead of writing a partial page.
#include "engine/study_report.h"

namespace kvq {

Status WriteStudyReport(const nlohmann::json& /*study*/, const std::string& path) {
  return Status::Error(path + ": report not built yet (the HTML report is not part of this build)");
}

}  // namespace kvq
