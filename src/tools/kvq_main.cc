// kvq command-line entry point: parses flags, calls the engine, prints.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "ops/simd_target.h"
#include "tools/commands.h"
#include "tools/kv_flags.h"

int main(int argc, char** argv) {
  CLI::App app{"kvq: KV-cache quantization engine and lab"};
  app.require_subcommand(1);
  // Options of the whole program may follow the subcommand too.
  app.fallthrough();
  // Applied while parsing, before the subcommand's kernels run.
  app.add_option_function<std::string>(
         "--simd-target",
         [](const std::string& name) {
           const kvq::Status capped = kvq::ops::CapSimdTarget(name);
           if (!capped.ok()) throw CLI::ValidationError("--simd-target", capped.message());
         },
         "Best SIMD target the kernels may use (e.g. AVX3 on an AVX3_DL CPU), so results "
         "resumed on another machine round as the first ones did. Default: this CPU's best (" +
             kvq::ops::SimdTargetName() + ")")
      ->trigger_on_parse();
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
  kvq::RegisterHelpCommand(app, ctx);
  // -ctk / -ctv (llama.cpp) become --cache-type-k / --cache-type-v first.
  const std::vector<std::string> args = kvq::KvFlagArgs(argc, argv);
  std::vector<const char*> argv_fixed;
  for (const std::string& a : args) argv_fixed.push_back(a.c_str());
  CLI11_PARSE(app, static_cast<int>(argv_fixed.size()), argv_fixed.data());
  return ctx.exit_code;
}
