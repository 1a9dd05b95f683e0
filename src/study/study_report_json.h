// Typed, non-throwing reads of the study JSON for the report (internal to
// study/study_report*.cc). nlohmann's accessors throw on a type mismatch; a
// report of a hand-edited or truncated study must get a clear error instead,
// naming the field ("outliers.layers[2].sink_mass: expected a number").
//
// Convention: an absent member and JSON null both read as "no value" (the
// study writes NaN/inf as null); a present value of the wrong type is an error.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kvq::study_json {

using Json = nlohmann::json;

// "path.key", or "key" at the root.
std::string Join(std::string_view path, std::string_view key);
// "path[index]".
std::string Index(std::string_view path, size_t index);

// obj[key] or nullptr when absent or null; obj must be an object.
StatusOr<const Json*> Member(const Json& obj, std::string_view key, std::string_view path);

// obj[key] as an object / array; nullptr when absent or null.
StatusOr<const Json*> ObjectMember(const Json& obj, std::string_view key, std::string_view path);
StatusOr<const Json*> ArrayMember(const Json& obj, std::string_view key, std::string_view path);

// A number (nullopt for null). `path` names the value in errors.
StatusOr<std::optional<double>> AsNumber(const Json& value, std::string_view path);
StatusOr<std::optional<double>> NumberMember(const Json& obj, std::string_view key,
                                             std::string_view path);
// An integer-valued number within int64 (nullopt when absent or null).
StatusOr<std::optional<int64_t>> IntMember(const Json& obj, std::string_view key,
                                           std::string_view path);
// A string ("" when absent or null).
StatusOr<std::string> StringMember(const Json& obj, std::string_view key, std::string_view path);
// A boolean (false when absent or null).
StatusOr<bool> BoolMember(const Json& obj, std::string_view key, std::string_view path);

// A number as JSON for a chart's data: the number, or null.
inline Json NumberOrNull(const std::optional<double>& x) { return x ? Json(*x) : Json(nullptr); }

}  // namespace kvq::study_json
