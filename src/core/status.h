// Status and Result<T>: the error values for everything a user, a file or a request controls.
// A failing Status carries a code and a message with context ("file.safetensors: tensor x: offsets past end").
// Invariant violations (programming errors) use TANDEM_CHECK from check.h instead and abort.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "core/check.h"

namespace tandem {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad flag, bad request field, bad value
  kNotFound,          // missing file, tensor, key
  kIoError,           // open/read/mmap failures
  kCorrupt,           // a file that lies about itself (truncated, bad header, bad JSON)
  kUnsupported,       // valid input tandem does not implement (architecture, dtype, config field)
  kOutOfRange,        // context too long, index past the end
  kResourceExhausted, // out of memory, cache full
  kInternal,          // a bug surfaced as an error rather than an abort
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  [[nodiscard]] bool ok() const { return code_ == StatusCode::kOk; }
  [[nodiscard]] StatusCode code() const { return code_; }
  [[nodiscard]] const std::string& message() const { return message_; }
  // "code: message"
  [[nodiscard]] std::string to_string() const;
  // Prepends "context: " to the message (no-op on ok). Returns *this for chaining.
  Status& with_context(const std::string& context) &;
  Status&& with_context(const std::string& context) &&;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Result<T>: either a value or a failing Status.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}                      // NOLINT(implicit)
  Result(Status status) : status_(std::move(status)) {                // NOLINT(implicit)
    TANDEM_CHECK_MSG(!status_.ok(), "Result constructed from an ok Status without a value");
  }

  [[nodiscard]] bool ok() const { return value_.has_value(); }
  [[nodiscard]] const Status& status() const { return status_; }

  T& value() & { check_ok(); return *value_; }
  const T& value() const& { check_ok(); return *value_; }
  T&& value() && { check_ok(); return std::move(*value_); }
  T* operator->() { check_ok(); return &*value_; }
  const T* operator->() const { check_ok(); return &*value_; }
  T& operator*() & { check_ok(); return *value_; }
  const T& operator*() const& { check_ok(); return *value_; }

 private:
  void check_ok() const { TANDEM_CHECK_MSG(value_.has_value(), "Result has no value: %s", status_.to_string().c_str()); }
  std::optional<T> value_;
  Status status_;
};

}  // namespace tandem

#define TANDEM_CONCAT_INNER_(a, b) a##b
#define TANDEM_CONCAT_(a, b) TANDEM_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) failed.
#define TANDEM_TRY(expr)                            \
  do {                                              \
    ::tandem::Status tandem_try_status_ = (expr);   \
    if (!tandem_try_status_.ok()) return tandem_try_status_; \
  } while (0)

// `lhs` = value of `expr` (a Result<T>), or returns its Status.
#define TANDEM_ASSIGN_OR_RETURN(lhs, expr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL_(TANDEM_CONCAT_(tandem_result_, __LINE__), lhs, expr)
#define TANDEM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
