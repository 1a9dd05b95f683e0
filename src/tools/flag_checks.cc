#include <cmath>
#include <string>

#include "base/thread_pool.h"
#include "tools/commands.h"

namespace kvq {

CLI::Validator ThreadsCheck() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long n = std::strtoll(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || errno != 0 || n < 0 || n > kMaxThreads) {
          return "threads must be 0 (all cores) or 1.." + std::to_string(kMaxThreads) + ", got '" +
                 value + "'";
        }
        return "";
      },
      "0.." + std::to_string(kMaxThreads), "Threads");
}

CLI::Validator FiniteRange(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& value) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || !std::isfinite(x) || x < min || x > max) {
          return "must be a finite number in [" + CLI::detail::to_string(min) + ", " +
                 CLI::detail::to_string(max) + "], got '" + value + "'";
        }
        return "";
      },
      "FLOAT in [" + CLI::detail::to_string(min) + " - " + CLI::detail::to_string(max) + "]",
      "FiniteRange");
}

void AddPollFlag(CLI::App& cmd, int* poll_us) {
  *poll_us = ThreadPool::kDefaultPollMicros;
  cmd.add_option("--poll-us", *poll_us,
                 "Microseconds an idle thread polls for work before it sleeps (default " +
                     std::to_string(ThreadPool::kDefaultPollMicros) +
                     "); 0 suits a machine whose cores are busy with other work")
      ->check(CLI::Range(0, 1000000));
}

}  // namespace kvq
