// Status implementation and the abort path of TANDEM_CHECK.
#include "core/status.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace tandem {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kIoError: return "I/O error";
    case StatusCode::kCorrupt: return "corrupt input";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kOutOfRange: return "out of range";
    case StatusCode::kResourceExhausted: return "resource exhausted";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status& Status::with_context(const std::string& context) & {
  if (!ok() && !context.empty()) message_ = context + ": " + message_;
  return *this;
}

Status&& Status::with_context(const std::string& context) && {
  if (!ok() && !context.empty()) message_ = context + ": " + message_;
  return std::move(*this);
}

namespace detail {
void check_failed(const char* file, int line, const char* cond, const char* fmt, ...) {
  std::fprintf(stderr, "tandem: internal check failed at %s:%d: %s", file, line, cond);
  if (fmt && *fmt) {
    std::fputs(": ", stderr);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
  }
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace tandem
