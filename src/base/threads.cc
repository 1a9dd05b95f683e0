#include "base/threads.h"

#include <omp.h>

#include <fstream>
#include <string>

namespace kvq {

int AvailableThreads() { return omp_get_num_procs(); }

}  // namespace kvq

namespace kvq {

int64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // kB
  }
  return 0;
}

}  // namespace kvq
