// The study JSON's sections, built from the engine's results (docs/study.md
// documents every field). Internal to study/study*.cc.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "model/tokenizer.h"
#include "study/study_claims.h"
#include "study/study_e2e.h"
#include "study/study_outliers.h"
#include "study/study_quant.h"

namespace kvq {

nlohmann::json JsonMatrix(const std::vector<std::vector<double>>& m);
nlohmann::json JsonVector(const std::vector<double>& v);

// `token_ids`: the captured tokens (sinks name theirs); `tokenizer` decodes
// them for the JSON (nullptr: ids only).
nlohmann::json OutliersJson(const std::vector<LayerOutliers>& layers, int64_t tokens,
                            const std::vector<int32_t>& token_ids, const Tokenizer* tokenizer,
                            const std::vector<std::vector<double>>& k_bias_norms);

nlohmann::json FakeQuantJson(const std::vector<FakeQuantRow>& rows, int64_t tokens,
                             int64_t kivi_group, int64_t head_dim);

nlohmann::json SchemeJson(const SchemeResult& r);

}  // namespace kvq
