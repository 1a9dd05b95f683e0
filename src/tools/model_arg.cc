#include "tools/model_arg.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "model/hf_cache.h"

namespace kvq {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

}  // namespace

StatusOr<std::string> ResolveModelArg(const std::string& arg) {
  std::error_code ec;
  if (arg.empty() || std::filesystem::exists(arg, ec) || !LooksLikeHubId(arg)) return arg;
  return ResolveHubModel(
      arg, HubCacheDirs(Env("HF_HUB_CACHE"), Env("HF_HOME"), Env("XDG_CACHE_HOME"), Env("HOME")));
}

CLI::Validator ModelArgResolver() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        StatusOr<std::string> path = ResolveModelArg(value);
        if (!path.ok()) return path.status().message();
        value = *path;
        return "";
      },
      "", "hub id or path");
}

CLI::Option* AddModelOption(CLI::App& cmd, std::string* model) {
  return cmd
      .add_option("-m,--model", *model,
                  "GGUF file, Hugging Face folder, or hub id (ORG/NAME) already in the local "
                  "Hugging Face cache (default: the default model, see README)")
      ->transform(ModelArgResolver());
}

}  // namespace kvq
