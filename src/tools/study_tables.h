// The terminal tables `kvq study` prints from its JSON.
#pragma once

#include <nlohmann/json.hpp>

namespace kvq {

// Every section the study has (a section it did not run is skipped).
void PrintStudyTables(const nlohmann::json& study);

}  // namespace kvq
