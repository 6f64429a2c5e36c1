// `tandem info`: prints the resolved architecture of a checkpoint directory (being written; see issue 2).
#include <cstdio>

#include "commands.h"

namespace tandem::cli {

void add_info_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("info", "Print the resolved architecture of a checkpoint");
  auto* model = new std::string;
  cmd->add_option("--model", *model, "Checkpoint directory")->required();
  cmd->callback([&exit_code, model] {
    std::fprintf(stderr, "tandem info: not available in this build yet (%s)\n", model->c_str());
    exit_code = 1;
  });
}

}  // namespace tandem::cli
