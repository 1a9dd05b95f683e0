#include "server/metrics.h"

#include <gtest/gtest.h>

#include "server/scheduler.h"

namespace kvq {
namespace {

TEST(MetricsTest, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1});
  for (double v : {0.05, 0.1, 0.5, 3.0}) h.Observe(v);
  std::string out;
  h.Render("x_seconds", "help", &out);
  EXPECT_NE(out.find("# TYPE x_seconds histogram\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_bucket{le=\"0.1\"} 2\n"), std::string::npos);  // 0.05 and 0.1
  EXPECT_NE(out.find("x_seconds_bucket{le=\"1\"} 3\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_bucket{le=\"+Inf\"} 4\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_sum 3.65\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_count 4\n"), std::string::npos);
}

TEST(MetricsTest, StepsAccumulateAndGaugesFollowTheLastStep) {
  ServerMetrics m;
  StepReport step;
  step.prompt_tokens = 7;
  step.generated_tokens = 2;
  step.preemptions = 1;
  step.batch_sequences = 2;
  step.time_to_first_token = {0.2};
  step.finish_reasons = {"stop"};
  step.prefix_cache_queries = 100;
  step.prefix_cache_hits = 64;
  KvUsage usage;
  usage.blocks_total = 10;
  usage.blocks_used = 4;
  usage.blocks_cached = 3;
  usage.blocks_logical = 9;
  m.RecordStep(step, 2, 3, usage);
  m.RecordStep(step, 1, 0, usage);
  m.RecordRejected();
  const std::string out = m.Render();
  EXPECT_NE(out.find("kvq_kv_blocks_total 10\n"), std::string::npos);
  EXPECT_NE(out.find("kvq_kv_blocks_used 4\n"), std::string::npos);
  EXPECT_NE(out.find("kvq_num_requests_running 1\n"), std::string::npos);
  EXPECT_NE(out.find("kvq_num_requests_waiting 0\n"), std::string::npos);
  EXPECT_NE(out.find("kvq_prompt_tokens_total 14\n"), std::string::npos);
  EXPECT_NE(out.find("kvq_generation_tokens_total 4\n"), std::string::npos);
  EXPECT_NE(out.find("kvq_num_preemptions_total 2\n"), std::string::npos);
  EXPECT_NE(out.find("kvq_requests_rejected_total 1\n"), std::string::npos);
  EXPECT_NE(out.find("kvq_request_success_total{finished_reason=\"stop\"} 2\n"), std::string::npos);
  EXPECT_NE(out.find("kvq_time_to_first_token_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(out.find("kvq_prefix_cache_queries_total 200\n"), std::string::npos);
  EXPECT_NE(out.find("kvq_prefix_cache_hits_total 128\n"), std::string::npos);
  EXPECT_NE(out.find("kvq_kv_blocks_cached 3\n"), std::string::npos);
  EXPECT_NE(out.find("kvq_kv_blocks_saved_by_sharing 5\n"), std::string::npos);
}

}  // namespace
}  // namespace kvq
