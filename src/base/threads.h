// Thread-count helpers, so no layer reads the environment.
#pragma once

#include <cstdint>

namespace kvq {

// Hardware threads available to this process.
int AvailableThreads();

}  // namespace kvq

namespace kvq {

// Peak resident set size of this process in bytes (VmHWM), 0 if unknown.
int64_t PeakRssBytes();

}  // namespace kvq
