// Subcommand registration for the tandem CLI. Each cmd_<name>.cc defines add_<name>_command(), which adds a CLI11
// subcommand whose callback stores the process exit code in `exit_code` (0 ok, 1 runtime error, 2 usage error).
#pragma once

#include <CLI/CLI.hpp>

namespace tandem::cli {

void add_info_command(CLI::App& app, int& exit_code);
void add_tokenize_command(CLI::App& app, int& exit_code);
void add_logits_command(CLI::App& app, int& exit_code);
void add_generate_command(CLI::App& app, int& exit_code);
void add_chat_command(CLI::App& app, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);

struct SessionFlags;
// The interactive chat loop (`tandem chat` and `tandem generate --chat`).
int run_chat(const SessionFlags& flags, const std::string& system);

}  // namespace tandem::cli
