#include "base/threads.h"

#include <omp.h>

namespace kvq {

int AvailableThreads() { return omp_get_num_procs(); }

}  // namespace kvq
