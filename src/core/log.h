// Logging to stderr with levels. The level is set once from the CLI (--verbose / --quiet).
#pragma once

namespace tandem {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace tandem

#define TANDEM_LOG_DEBUG(...) ::tandem::log_message(::tandem::LogLevel::kDebug, __VA_ARGS__)
#define TANDEM_LOG_INFO(...) ::tandem::log_message(::tandem::LogLevel::kInfo, __VA_ARGS__)
#define TANDEM_LOG_WARN(...) ::tandem::log_message(::tandem::LogLevel::kWarn, __VA_ARGS__)
#define TANDEM_LOG_ERROR(...) ::tandem::log_message(::tandem::LogLevel::kError, __VA_ARGS__)
