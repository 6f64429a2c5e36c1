// tandem: command-line entry point. Parses the subcommand, runs it, and maps errors to exit codes.
#include <cstdio>

#include "commands.h"
#include "core/log.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem: fast, exact Gemma 4 inference with the Gemma 4 assistant drafter (MTP speculative decoding)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tandem 0.1.0");
  bool verbose = false, quiet = false;
  app.add_flag("-v,--verbose", verbose, "Print debug logging");
  app.add_flag("-q,--quiet", quiet, "Print errors only");
  app.parse_complete_callback([&] {
    if (verbose) tandem::set_log_level(tandem::LogLevel::kDebug);
    if (quiet) tandem::set_log_level(tandem::LogLevel::kError);
  });
  app.footer("Run `tandem <command> --help` for the options and examples of each command.");
  app.fallthrough();  // -v / -q also after the subcommand (`tandem bench ... -v`); subcommands inherit it

  int exit_code = 0;
  tandem::cli::add_info_command(app, exit_code);
  tandem::cli::add_generate_command(app, exit_code);
  tandem::cli::add_chat_command(app, exit_code);
  tandem::cli::add_bench_command(app, exit_code);
  tandem::cli::add_logits_command(app, exit_code);
  tandem::cli::add_tokenize_command(app, exit_code);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
