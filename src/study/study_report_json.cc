#include "study/study_report_json.h"

#include <cmath>

namespace kvq::study_json {

namespace {

const char* TypeName(const Json& value) { return value.type_name(); }

Status WrongType(std::string_view path, const char* expected, const Json& value) {
  return Status::Error(std::string(path) + ": expected " + expected + ", got " + TypeName(value));
}

}  // namespace

std::string Join(std::string_view path, std::string_view key) {
  if (path.empty()) return std::string(key);
  return std::string(path) + "." + std::string(key);
}

std::string Index(std::string_view path, size_t index) {
  return std::string(path) + "[" + std::to_string(index) + "]";
}

StatusOr<const Json*> Member(const Json& obj, std::string_view key, std::string_view path) {
  if (!obj.is_object()) return WrongType(path.empty() ? "study" : path, "an object", obj);
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return static_cast<const Json*>(nullptr);
  return &*it;
}

StatusOr<const Json*> ObjectMember(const Json& obj, std::string_view key, std::string_view path) {
  KVQ_ASSIGN_OR_RETURN(const Json* member, Member(obj, key, path));
  if (member != nullptr && !member->is_object()) {
    return WrongType(Join(path, key), "an object", *member);
  }
  return member;
}

StatusOr<const Json*> ArrayMember(const Json& obj, std::string_view key, std::string_view path) {
  KVQ_ASSIGN_OR_RETURN(const Json* member, Member(obj, key, path));
  if (member != nullptr && !member->is_array()) {
    return WrongType(Join(path, key), "an array", *member);
  }
  return member;
}

StatusOr<std::optional<double>> AsNumber(const Json& value, std::string_view path) {
  if (value.is_null()) return std::optional<double>();
  if (!value.is_number()) return WrongType(path, "a number", value);
  return std::optional<double>(value.get<double>());
}

StatusOr<std::optional<double>> NumberMember(const Json& obj, std::string_view key,
                                             std::string_view path) {
  KVQ_ASSIGN_OR_RETURN(const Json* member, Member(obj, key, path));
  if (member == nullptr) return std::optional<double>();
  return AsNumber(*member, Join(path, key));
}

StatusOr<std::optional<int64_t>> IntMember(const Json& obj, std::string_view key,
                                           std::string_view path) {
  KVQ_ASSIGN_OR_RETURN(std::optional<double> x, NumberMember(obj, key, path));
  if (!x) return std::optional<int64_t>();
  // 2^62 keeps the cast exact and far from overflow; no count in a study is near it.
  if (*x != std::floor(*x) || std::fabs(*x) > 4.6e18) {
    return Status::Error(Join(path, key) + ": expected an integer, got " + std::to_string(*x));
  }
  return std::optional<int64_t>(static_cast<int64_t>(*x));
}

StatusOr<std::string> StringMember(const Json& obj, std::string_view key, std::string_view path) {
  KVQ_ASSIGN_OR_RETURN(const Json* member, Member(obj, key, path));
  if (member == nullptr) return std::string();
  if (!member->is_string()) return WrongType(Join(path, key), "a string", *member);
  return member->get<std::string>();
}

StatusOr<bool> BoolMember(const Json& obj, std::string_view key, std::string_view path) {
  KVQ_ASSIGN_OR_RETURN(const Json* member, Member(obj, key, path));
  if (member == nullptr) return false;
  if (!member->is_boolean()) return WrongType(Join(path, key), "true or false", *member);
  return member->get<bool>();
}

}  // namespace kvq::study_json
