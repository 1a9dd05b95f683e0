// Each kvq subcommand lives in its own cmd_<name>.cc and registers itself on
// the CLI here. A command's callback returns the process exit code through
// `exit_code`; errors are printed to stderr as "kvq <cmd>: <message>".
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

namespace kvq {

struct CommandContext {
  int exit_code = 0;
};

// Prints "kvq COMMAND: MESSAGE" to stderr and returns the exit code 1.
inline int CommandError(const char* command, const std::string& message) {
  std::fprintf(stderr, "kvq %s: %s\n", command, message.c_str());
  return 1;
}

// Checks every numeric flag shares (tools/flag_checks.cc).
// -t/--threads: 0 = all cores, else 1..kMaxThreads. More threads than
// that only cost memory and start-up (and 100000 exhausts the process).
inline constexpr int kMaxThreads = 1024;
CLI::Validator ThreadsCheck();
// A finite number in [min, max]: CLI::Range alone lets NaN through (every
// comparison with NaN is false).
CLI::Validator FiniteRange(double min, double max);
// --poll-us: how long the model's idle threads poll for work before they
// sleep (ThreadPool); `*poll_us` starts at the pool's default.
void AddPollFlag(CLI::App& cmd, int* poll_us);

void RegisterInfoCommand(CLI::App& app, CommandContext& ctx);
void RegisterTokenizeCommand(CLI::App& app, CommandContext& ctx);
void RegisterSynthCommand(CLI::App& app, CommandContext& ctx);
void RegisterGenerateCommand(CLI::App& app, CommandContext& ctx);
void RegisterBenchCommand(CLI::App& app, CommandContext& ctx);
void RegisterPerplexityCommand(CLI::App& app, CommandContext& ctx);
void RegisterPlanCommand(CLI::App& app, CommandContext& ctx);
void RegisterServeCommand(CLI::App& app, CommandContext& ctx);
void RegisterStudyCommand(CLI::App& app, CommandContext& ctx);
void RegisterTuneCommand(CLI::App& app, CommandContext& ctx);
void RegisterCalibrateCommand(CLI::App& app, CommandContext& ctx);
void RegisterHelpCommand(CLI::App& app, CommandContext& ctx);

}  // namespace kvq
