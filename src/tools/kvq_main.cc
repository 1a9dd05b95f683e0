// kvq command-line entry point: parses flags, calls the engine, prints.
#include <CLI/CLI.hpp>

#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvq: KV-cache quantization engine and lab"};
  app.require_subcommand(1);
  kvq::CommandContext ctx;
  kvq::RegisterInfoCommand(app, ctx);
  kvq::RegisterTokenizeCommand(app, ctx);
  kvq::RegisterSynthCommand(app, ctx);
  kvq::RegisterGenerateCommand(app, ctx);
  kvq::RegisterBenchCommand(app, ctx);
  kvq::RegisterPerplexityCommand(app, ctx);
  kvq::RegisterPlanCommand(app, ctx);
  kvq::RegisterCalibrateCommand(app, ctx);
  kvq::RegisterServeCommand(app, ctx);
  kvq::RegisterStudyCommand(app, ctx);
  kvq::RegisterTuneCommand(app, ctx);
  CLI11_PARSE(app, argc, argv);
  return ctx.exit_code;
}
