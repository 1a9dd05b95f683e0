// How long a counted task (trials, problems, schemes) has left, from the
// rate of the steps that took time: a resumed run reports the items it had
// recorded in bursts microseconds apart, which would otherwise count as work
// done at an impossible rate.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kvq {

class TimeLeft {
 public:
  // `done` items at `seconds` (monotonic). A count lower than the last one
  // starts over: it is a new task.
  void Observe(double seconds, int64_t done);
  // Seconds to reach `total` at the rate measured so far; nullopt until one
  // increment has taken time.
  std::optional<double> Seconds(int64_t total) const;

  // Steps closer together than this are recorded items being replayed, not work.
  static constexpr double kMinStepSeconds = 0.01;

 private:
  double last_seconds_ = 0;
  int64_t last_done_ = -1;
  double work_seconds_ = 0;
  int64_t work_items_ = 0;
};

// "45 s", "12 min", "3 h 05 min".
std::string FormatDuration(double seconds);

}  // namespace kvq
