// Thread-count helpers around OpenMP, so no layer reads the environment.
#pragma once

namespace kvq {

// Hardware threads available to this process.
int AvailableThreads();

}  // namespace kvq
