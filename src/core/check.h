// TANDEM_CHECK: invariants that only a bug can break. They abort with file:line and a message.
// Never use these for anything a user, a file or a request controls: return a Status instead.
#pragma once

namespace tandem::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
}  // namespace tandem::detail

#define TANDEM_CHECK(cond) \
  do { if (!(cond)) ::tandem::detail::check_failed(__FILE__, __LINE__, #cond, "%s", ""); } while (0)
#define TANDEM_CHECK_MSG(cond, ...) \
  do { if (!(cond)) ::tandem::detail::check_failed(__FILE__, __LINE__, #cond, __VA_ARGS__); } while (0)
