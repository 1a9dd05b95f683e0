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

StatusOr<OpsRope> MakeOpsRope(const ModelConfig& c) {
  ops::RopeScaling scaling;
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    scaling.kind = ops::RopeScaling::Kind::kLlama3;
    scaling.factor = static_cast<float>(c.rope_scaling.factor);
    scaling.low_freq_factor = static_cast<float>(c.rope_scaling.low_freq_factor);
    scaling.high_freq_factor = static_cast<float>(c.rope_scaling.high_freq_factor);
    scaling.original_max_position_embeddings = c.rope_scaling.original_max_position_embeddings;
  }
  OpsRope rope;
  KVQ_ASSIGN_OR_RETURN(rope.inv_freq,
                       ops::RopeInvFreq(c.head_dim, static_cast<float>(c.rope_theta), scaling));
  rope.layout =
      c.rope_layout == RopeLayout::kPairs ? ops::RopeLayout::kPairs : ops::RopeLayout::kHalves;
  return rope;
}

}  // namespace kvq
