// Which SIMD target the Highway kernels dispatch to, and a cap on it.
//
// Kernels of different targets round differently (lane counts change the
// order of sums), and one changed rounding can change a greedy answer. A long
// study that resumes on another machine pins the target its records were
// made on, so the records stay comparable.
#pragma once

#include <string>

#include "base/status.h"

namespace kvq::ops {

// The target the kernels dispatch to now ("AVX3_DL", "AVX3", "AVX2", ...).
std::string SimdTargetName();

// The targets this CPU supports and this build compiled, best first.
std::string SupportedSimdTargetNames();

// Makes `name` the best target the kernels may dispatch to: every better one
// is disabled for the rest of the process. An error, changing nothing, if
// the name is unknown or this CPU or build lacks it. Call it before any
// kernel runs; it changes process-wide dispatch (Highway's own state).
Status CapSimdTarget(const std::string& name);

}  // namespace kvq::ops
