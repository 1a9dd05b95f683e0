// kvq command-line entry point: parses flags, calls the engine, prints.
#include <CLI/CLI.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"kvq: KV-cache quantization engine and lab"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
