// Placeholder until the command lands; replace this whole file.
#include "tools/commands.h"

namespace kvq {

void RegisterSynthCommand(CLI::App& app, CommandContext& ctx) {
  app.add_subcommand("synth", "(not implemented yet)")->callback([&ctx] { ctx.exit_code = 2; });
}

}  // namespace kvq
