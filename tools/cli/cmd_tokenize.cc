// `tandem tokenize`: encodes text with a Hugging Face tokenizer.json and prints the ids (being written; issue 5).
#include <cstdio>

#include "commands.h"

namespace tandem::cli {

void add_tokenize_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("tokenize", "Encode text with a checkpoint's tokenizer and print the token ids");
  cmd->allow_extras();
  cmd->callback([&exit_code] {
    std::fprintf(stderr, "tandem tokenize: not available in this build yet\n");
    exit_code = 1;
  });
}

}  // namespace tandem::cli
