#include "model/model_config.h"

namespace kvq {

const char* ArchitectureName(Architecture arch) {
  switch (arch) {
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kLlama:
      return "llama";
  }
  return "?";
}

}  // namespace kvq
