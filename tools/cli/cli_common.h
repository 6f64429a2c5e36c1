// Helpers shared by the CLI subcommands: id lists, device selection, error reporting.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace CLI {
class App;
}

namespace tandem::cli {

// "2,17,9" (spaces allowed) -> ids; a clear error for anything else.
Result<std::vector<int32_t>> parse_ids(const std::string& text);
// Prints "tandem <command>: <status>" to stderr and returns exit code 1.
int fail(const char* command, const Status& status);
// Backend for "--device cpu|cuda|cuda:N" with `threads` CPU threads (0 = all cores).
Result<std::unique_ptr<Backend>> open_backend(const std::string& device, int threads);
// `--prefill-chunk N` on `cmd` (prompt tokens per target forward; `longer` names what runs in chunks), and the
// check of its range, for the commands that take it (generate, chat, bench).
void add_prefill_chunk_option(CLI::App* cmd, int* chunk, const char* longer);
Status check_prefill_chunk(int chunk);
// A progress bar on stderr for long loads ("loading target  [#####     ] 52%  1.2/2.3 GiB"), only on a terminal.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label) : label_(std::move(label)) {}
  void update(uint64_t done, uint64_t total);
  void finish();

 private:
  std::string label_;
  int last_percent_ = -1;
  bool drawn_ = false;
};

}  // namespace tandem::cli
