#include "ops/simd_target.h"

#include <hwy/targets.h>

#include <cstdint>
#include <vector>

namespace kvq::ops {

std::string SimdTargetName() {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  return targets.empty() ? "none" : hwy::TargetName(targets.front());
}

std::string SupportedSimdTargetNames() {
  std::string names;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (!names.empty()) names += ", ";
    names += hwy::TargetName(target);
  }
  return names;
}

Status CapSimdTarget(const std::string& name) {
  // Highway orders targets best first (the lowest bit is the best target).
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  int64_t better = 0;
  for (int64_t target : targets) {
    if (name == hwy::TargetName(target)) {
      if (better != 0) hwy::DisableTargets(better);
      return Status::Ok();
    }
    better |= target;
  }
  return Status::Error("SIMD target '" + name + "' is not available here (this CPU and build: " +
                       SupportedSimdTargetNames() + ")");
}

}  // namespace kvq::ops
