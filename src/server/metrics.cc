#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

#include "server/scheduler.h"

namespace kvq {
namespace {

std::string Number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

void Gauge(const std::string& name, const std::string& help, double value, std::string* out) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " +
          Number(value) + "\n";
}

void Counter(const std::string& name, const std::string& help, double value, std::string* out) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " +
          Number(value) + "\n";
}

// Latencies from 1 ms to 60 s: a CPU server's decode step is 10-500 ms and
// a queued request's first token can take tens of seconds.
std::vector<double> LatencyBounds() {
  return {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60};
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}

void Histogram::Observe(double value) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (value <= bounds_[i]) {
      ++counts_[i];
      break;
    }
  }
  sum_ += value;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    *out +=
        name + "_bucket{le=\"" + Number(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  *out += name + "_sum " + Number(sum_) + "\n";
  *out += name + "_count " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics()
    : ttft_(LatencyBounds()),
      itl_(LatencyBounds()),
      batch_size_({1, 2, 4, 8, 16, 32, 64, 128, 256}) {}

void ServerMetrics::RecordStep(const StepReport& report, int64_t running, int64_t waiting,
                               const KvUsage& usage) {
  std::lock_guard<std::mutex> lock(mutex_);
  running_ = running;
  waiting_ = waiting;
  usage_ = usage;
  prompt_tokens_ += report.prompt_tokens;
  generation_tokens_ += report.generated_tokens;
  preemptions_ += report.preemptions;
  prefix_queries_ += report.prefix_cache_queries;
  prefix_hits_ += report.prefix_cache_hits;
  if (report.batch_sequences > 0) {
    ++steps_;
    batch_size_.Observe(static_cast<double>(report.batch_sequences));
  }
  for (double t : report.time_to_first_token) ttft_.Observe(t);
  for (double t : report.inter_token_latency) itl_.Observe(t);
  for (const std::string& reason : report.finish_reasons) CountFinishLocked(reason);
}

void ServerMetrics::RecordRejected() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++rejected_;
}

void ServerMetrics::RecordFinished(const std::string& finish_reason, int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int64_t i = 0; i < n; ++i) CountFinishLocked(finish_reason);
}

void ServerMetrics::CountFinishLocked(const std::string& finish_reason) {
  for (auto& [reason, count] : finished_) {
    if (reason == finish_reason) {
      ++count;
      return;
    }
  }
  finished_.emplace_back(finish_reason, 1);
}

int64_t ServerMetrics::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return running_;
}

int64_t ServerMetrics::waiting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_;
}

std::string ServerMetrics::Render() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  Gauge("kvq_kv_blocks_total", "KV cache blocks in the budget.", usage_.blocks_total, &out);
  Gauge("kvq_kv_blocks_used", "KV cache blocks held by sequences.", usage_.blocks_used, &out);
  Gauge("kvq_kv_block_bytes", "Bytes of one KV cache block (all layers, K and V).",
        static_cast<double>(usage_.block_bytes), &out);
  Gauge("kvq_kv_bytes_used", "KV cache bytes in use (used blocks and side data).",
        static_cast<double>(usage_.bytes_used), &out);
  Gauge("kvq_kv_bytes_reserved", "KV cache bytes allocated for the budget.",
        static_cast<double>(usage_.bytes_reserved), &out);
  Gauge("kvq_kv_usage_ratio", "Fraction of KV cache blocks in use.",
        usage_.blocks_total > 0 ? static_cast<double>(usage_.blocks_used) / usage_.blocks_total : 0,
        &out);
  Gauge("kvq_kv_blocks_cached",
        "KV cache blocks kept only as cached prefixes (counted free; evicted when needed).",
        usage_.blocks_cached, &out);
  Gauge("kvq_kv_blocks_saved_by_sharing",
        "KV cache blocks sequences would hold without shared prefixes, minus those in use.",
        std::max<int64_t>(0, usage_.blocks_logical - usage_.blocks_used), &out);
  Gauge("kvq_num_requests_running", "Requests in the running batch.", running_, &out);
  Gauge("kvq_num_requests_waiting", "Requests waiting for admission.", waiting_, &out);
  Counter("kvq_prompt_tokens_total",
          "Prompt tokens run through the model (recomputation included).", prompt_tokens_, &out);
  Counter("kvq_generation_tokens_total", "Tokens generated.", generation_tokens_, &out);
  Counter("kvq_num_preemptions_total", "Sequences preempted for KV blocks (recomputed later).",
          preemptions_, &out);
  // vLLM's prefix_cache_queries / prefix_cache_hits, in tokens.
  Counter("kvq_prefix_cache_queries_total",
          "Prompt tokens looked up in the prefix cache at admission.", prefix_queries_, &out);
  Counter("kvq_prefix_cache_hits_total",
          "Prompt tokens found in the prefix cache (reused, not computed).", prefix_hits_, &out);
  Counter("kvq_requests_rejected_total", "Requests refused with 429/503 (queue full, shutdown).",
          rejected_, &out);
  Counter("kvq_engine_steps_total", "Forward passes run by the scheduler.", steps_, &out);
  out += "# HELP kvq_request_success_total Finished requests by finish reason.\n";
  out += "# TYPE kvq_request_success_total counter\n";
  for (const auto& [reason, count] : finished_) {
    out += "kvq_request_success_total{finished_reason=\"" + reason + "\"} " +
           std::to_string(count) + "\n";
  }
  ttft_.Render("kvq_time_to_first_token_seconds", "Time from arrival to the first token.", &out);
  itl_.Render("kvq_inter_token_latency_seconds", "Time between consecutive tokens of a request.",
              &out);
  batch_size_.Render("kvq_batch_sequences", "Sequences in one forward pass.", &out);
  return out;
}

}  // namespace kvq
