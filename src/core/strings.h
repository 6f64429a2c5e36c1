// Small string helpers: printf-style formatting (g++ 12 has no <format>), joining, human-readable sizes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string join(const std::vector<std::string>& parts, std::string_view sep);
std::vector<std::string> split(std::string_view s, char sep);
bool starts_with(std::string_view s, std::string_view prefix);
bool ends_with(std::string_view s, std::string_view suffix);
// "1.50 GiB", "12.0 MiB", "512 B"
std::string human_bytes(uint64_t bytes);
// "1.23 B", "45.6 M", "789 K"
std::string human_count(uint64_t n);

}  // namespace tandem
