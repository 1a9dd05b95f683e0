// kvq help cache-types [--markdown]: the KV cache type reference, generated
// from the codec registry (docs/cache-types.md is its --markdown output).
#include <cstdio>
#include <memory>
#include <string>

#include "kv/codec_registry.h"
#include "tools/commands.h"

namespace kvq {

void RegisterHelpCommand(CLI::App& app, CommandContext& ctx) {
  CLI::App* cmd = app.add_subcommand("help", "Reference pages (cache-types)");
  cmd->require_subcommand(1);
  CLI::App* types = cmd->add_subcommand(
      "cache-types", "Every KV cache type: codec families, bits, schemes and aliases");
  auto markdown = std::make_shared<bool>(false);
  auto dict = std::make_shared<bool>(false);
  auto names = std::make_shared<int64_t>(0);
  types->add_flag("--markdown", *markdown, "Markdown (docs/cache-types.md)");
  types->add_flag("--fuzz-dict", *dict, "A libFuzzer dictionary (fuzz/kv_spec.dict)");
  types
      ->add_option("--names", *names,
                   "Only every registered spelling valid at this head_dim, one per line")
      ->check(CLI::Range(int64_t{1}, kMaxCodecHeadDim));
  types->callback([&ctx, markdown, dict, names] {
    std::string text;
    if (*names > 0) {
      for (const std::string& name : RegisteredKvCacheTypes(*names)) text += name + "\n";
    } else {
      text = *dict ? KvCacheTypesFuzzDictionary() : KvCacheTypesHelp(*markdown);
    }
    std::fputs(text.c_str(), stdout);
    ctx.exit_code = 0;
  });
}

}  // namespace kvq
