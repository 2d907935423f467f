// Status and StatusOr<T>: the error type of every sluice API that a user's input can make fail.
//
// A Status is either OK or carries a code and a message. The message is written for the person
// who runs sluice: it names the file, the field and the allowed values ("model.json: field
// 'heads': must be a positive integer, got -4"). Programmer errors are not Statuses: they abort
// through SLUICE_CHECK. Exceptions never cross a sluice API.
//
// Thread safety: value types; safe to copy and to read from several threads.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace sluice {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad input: a file, a flag or a configuration the user supplied
  kNotFound,         // a named file, preset or key does not exist
  kIoError,          // the operating system refused a read or write
  kFailedPrecondition,  // a valid request that cannot be carried out in this state
  kInternal,         // a bug in sluice that was caught without aborting
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK.
  Status WithPrefix(std::string_view prefix) const;

  // "invalid argument: <message>", or "OK".
  std::string ToString() const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status IoError(std::string message);
Status FailedPreconditionError(std::string message);
Status InternalError(std::string message);

// Aborts with file:line and the message. For invariants no input can break.
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              std::string_view message);

#define SLUICE_CHECK(cond)                                             \
  do {                                                                 \
    if (!(cond)) ::sluice::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)
#define SLUICE_CHECK_MSG(cond, msg)                                       \
  do {                                                                    \
    if (!(cond)) ::sluice::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

// Either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const T& value) : value_(value) {}             // NOLINT: implicit by design
  StatusOr(T&& value) : value_(std::move(value)) {}        // NOLINT
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    SLUICE_CHECK_MSG(!status_.ok(), "StatusOr constructed from an OK Status without a value");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  const T& value() const& {
    SLUICE_CHECK_MSG(ok(), status_.ToString());
    return *value_;
  }
  T& value() & {
    SLUICE_CHECK_MSG(ok(), status_.ToString());
    return *value_;
  }
  T&& value() && {
    SLUICE_CHECK_MSG(ok(), status_.ToString());
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

#define SLUICE_CONCAT_INNER(a, b) a##b
#define SLUICE_CONCAT(a, b) SLUICE_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define SLUICE_RETURN_IF_ERROR(expr)                      \
  do {                                                    \
    ::sluice::Status sluice_status_ = (expr);             \
    if (!sluice_status_.ok()) return sluice_status_;      \
  } while (0)

// `lhs` = value of the StatusOr `expr`, or returns its Status.
#define SLUICE_ASSIGN_OR_RETURN(lhs, expr) \
  SLUICE_ASSIGN_OR_RETURN_IMPL(SLUICE_CONCAT(sluice_statusor_, __LINE__), lhs, expr)
#define SLUICE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

}  // namespace sluice
