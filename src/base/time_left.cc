#include "base/time_left.h"

#include <cmath>
#include <cstdio>

namespace kvq {

void TimeLeft::Observe(double seconds, int64_t done) {
  if (done < last_done_) *this = TimeLeft();
  if (last_done_ >= 0 && done > last_done_ && seconds - last_seconds_ >= kMinStepSeconds) {
    work_seconds_ += seconds - last_seconds_;
    work_items_ += done - last_done_;
  }
  last_seconds_ = seconds;
  last_done_ = done;
}

std::optional<double> TimeLeft::Seconds(int64_t total) const {
  if (work_items_ == 0) return std::nullopt;
  const int64_t left = total > last_done_ ? total - last_done_ : 0;
  return static_cast<double>(left) * work_seconds_ / static_cast<double>(work_items_);
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  char text[32];
  if (seconds < 60) {
    std::snprintf(text, sizeof(text), "%.0f s", seconds);
  } else if (seconds < 3600) {
    std::snprintf(text, sizeof(text), "%.0f min", std::round(seconds / 60));
  } else {
    const auto minutes = static_cast<long long>(std::round(seconds / 60));
    std::snprintf(text, sizeof(text), "%lld h %02lld min", minutes / 60, minutes % 60);
  }
  return text;
}

}  // namespace kvq
