// CLI helpers (see cli_common.h).
#include "cli_common.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include "core/strings.h"
#include "spec/generator.h"

namespace tandem::cli {

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  for (const std::string& raw : split(text, ',')) {
    std::string s;
    for (char c : raw)
      if (c != ' ' && c != '\t' && c != '\n') s += c;
    if (s.empty()) {
      if (raw.empty() && text.find_first_not_of(" \t\n,") == std::string::npos) continue;
      return invalid_argument("--ids: empty entry in \"" + text + "\"");
    }
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno != 0 || end != s.c_str() + s.size() || v < 0 || v > 0x7fffffff)
      return invalid_argument("--ids: \"" + s + "\" is not a token id (expected comma-separated non-negative integers)");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return invalid_argument("--ids: no token ids given");
  return ids;
}

int fail(const char* command, const Status& status) {
  std::fprintf(stderr, "tandem %s: %s\n", command, status.to_string().c_str());
  return 1;
}

void add_prefill_chunk_option(CLI::App* cmd, int* chunk, const char* longer) {
  const std::string help =
      strfmt("Prompt tokens per target forward, 1..%d (a longer %s runs in chunks)", kMaxPrefillChunk, longer);
  cmd->add_option("--prefill-chunk", *chunk, help)->capture_default_str();
}

Status check_prefill_chunk(int chunk) {
  if (chunk < 1 || chunk > kMaxPrefillChunk)
    return invalid_argument(strfmt("--prefill-chunk must be 1..%d (got %d)", kMaxPrefillChunk, chunk));
  return ok_status();
}

Result<std::unique_ptr<Backend>> open_backend(const std::string& device, int threads) {
  if (device == "cpu") return make_cpu_backend(threads);
  return make_backend(device);
}

void ProgressBar::update(uint64_t done, uint64_t total) {
  if (!isatty(STDERR_FILENO) || total == 0) return;
  int pct = static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total));
  if (pct == last_percent_) return;
  last_percent_ = pct;
  const int width = 30, fill = pct * width / 100;
  std::fprintf(stderr, "\r%-16s [%s%s] %3d%%  %s / %s", label_.c_str(), std::string(static_cast<size_t>(fill), '#').c_str(),
               std::string(static_cast<size_t>(width - fill), ' ').c_str(), pct, human_bytes(done).c_str(),
               human_bytes(total).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace tandem::cli
