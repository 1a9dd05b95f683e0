// Server metrics in the Prometheus text exposition format (version 0.0.4).
// The engine thread records; HTTP threads render; one mutex guards both.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kv/kv_cache.h"

namespace kvq {

// Cumulative histogram with fixed upper bounds (seconds), as Prometheus
// expects: bucket i counts observations <= bounds[i]; +Inf counts all.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  void Render(const std::string& name, const std::string& help, std::string* out) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // [bounds.size()], non-cumulative
  double sum_ = 0;
  int64_t count_ = 0;
};

struct StepReport;

class ServerMetrics {
 public:
  ServerMetrics();
  // After each engine step: the step's figures and the queue/cache state.
  void RecordStep(const StepReport& report, int64_t running, int64_t waiting, const KvUsage& usage);
  void RecordRejected();  // 429 / 503 from a full queue or a shutdown
  void RecordFinished(const std::string& finish_reason, int64_t n);  // outside a step
  std::string Render() const;
  // Snapshot for tests and the shutdown drain.
  int64_t running() const;
  int64_t waiting() const;

 private:
  void CountFinishLocked(const std::string& finish_reason);

  mutable std::mutex mutex_;
  int64_t running_ = 0, waiting_ = 0;
  KvUsage usage_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0, preemptions_ = 0, rejected_ = 0;
  int64_t steps_ = 0;
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;
  std::vector<std::pair<std::string, int64_t>> finished_;  // finish reason -> count
  Histogram ttft_, itl_, batch_size_;
};

}  // namespace kvq
