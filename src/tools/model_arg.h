// `-m` as users type it: a GGUF file, a Hugging Face folder, or a hub id
// ("Qwen/Qwen2.5-0.5B") of a model already in the local Hugging Face cache.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "base/status.h"

namespace kvq {

// An existing path is returned as is; an "ORG/NAME" that is not a path is
// looked up in the hub cache (model/hf_cache.h) at the roots the standard
// variables name: HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME. These are
// read here, in the CLI, because they are the user's Hugging Face set-up,
// not kvq settings; the library takes the folders as arguments. Anything
// else is returned unchanged for the loader to reject with its own error.
StatusOr<std::string> ResolveModelArg(const std::string& arg);

// A CLI11 transform for every command's -m option: replaces a hub id by its
// snapshot path at parse time, or fails the parse with the places looked in.
CLI::Validator ModelArgResolver();

// Registers every model-running command's -m,--model option (help text and
// the resolver above) so they cannot drift apart.
CLI::Option* AddModelOption(CLI::App& cmd, std::string* model);

}  // namespace kvq
