// A model ready to run: transformer + tokenizer, loaded from a GGUF file or a
// Hugging Face folder (or the default model, engine/default_model.h, when no
// path is given).
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "model/tokenizer.h"
#include "model/transformer.h"

namespace kvq {

struct LoadedModel {
  std::string path;
  std::unique_ptr<Transformer> transformer;
  std::unique_ptr<Tokenizer> tokenizer;
};

// Empty `path` means the default model (engine/default_model.h). `arith`
// as Transformer::Create.
StatusOr<LoadedModel> LoadModel(const std::string& path, int num_threads,
                                ops::DecodeArith arith = ops::DecodeArith::kInt8Dot);

}  // namespace kvq
