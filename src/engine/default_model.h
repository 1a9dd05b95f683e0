// Where the shipped default model lives, so commands work without -m.
#pragma once

#include <string>

namespace kvq {

// Name of the model folder under models/ that kvq trains and ships.
inline constexpr const char* kDefaultModelName = "kvq-tiny-qwen2";

// models/<kDefaultModelName> found next to the running binary's source tree:
// build/bin/kvq -> ../../models/..., else the source directory recorded at
// build time. Returns an empty string when neither exists.
std::string DefaultModelPath();

}  // namespace kvq
