// Status and StatusOr: how every fallible kvq call reports failure.
// The library never throws across its API and never exits; callers decide.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace kvq {

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  static Status Ok() { return Status(); }
  static Status Error(std::string message) {
    Status s;
    s.failed_ = true;
    s.message_ = std::move(message);
    if (s.message_.empty()) s.message_ = "unknown error";
    return s;
  }
  bool ok() const { return !failed_; }
  const std::string& message() const { return message_; }
  // Prepends context ("model.gguf: " + message) so errors name their source.
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Error(context + ": " + message_);
  }

 private:
  bool failed_ = false;
  std::string message_;
};

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "StatusOr built from an OK status has no value");
    if (status_.ok()) status_ = Status::Error("internal: OK status without value");
  }
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace kvq

// Early-return helpers. KVQ_ASSIGN_OR_RETURN(auto x, Expr()) declares x.
#define KVQ_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::kvq::Status kvq_status_ = (expr);        \
    if (!kvq_status_.ok()) return kvq_status_; \
  } while (0)

#define KVQ_CONCAT_INNER_(a, b) a##b
#define KVQ_CONCAT_(a, b) KVQ_CONCAT_INNER_(a, b)
#define KVQ_ASSIGN_OR_RETURN(lhs, expr) \
  KVQ_ASSIGN_OR_RETURN_IMPL_(KVQ_CONCAT_(kvq_statusor_, __LINE__), lhs, expr)
#define KVQ_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
