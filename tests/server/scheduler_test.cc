#include "server/scheduler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "engine/generate.h"
#include "engine/loaded_model.h"
#include "kv/kv_factory.h"
#include "server/test_model.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

struct Output {
  std::string text;
  RequestEvent final;
};

// Everything a channel received so far (the scheduler runs on this thread).
Output Drain(RequestChannel& channel) {
  Output out;
  std::vector<RequestEvent> events;
  channel.Pop(&events, std::chrono::milliseconds(0));
  for (RequestEvent& e : events) {
    out.text += e.text;
    if (e.final) out.final = e;
  }
  return out;
}

class SchedulerTest : public TinyServerModelTest {
 protected:
  void SetUp() override {
    TinyServerModelTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_NO_FATAL_FAILURE(LoadTinyModel(2));
  }
  // A paged f16 cache of `blocks` blocks of 16 tokens.
  std::unique_ptr<KvCache> NewCache(int64_t blocks) {
    KvCacheOptions options;
    options.max_tokens = 256;
    options.block_tokens = 16;
    auto layout = ComputeKvLayout(model_.transformer->kv_shape(), options);
    EXPECT_TRUE(layout.ok());
    options.memory_bytes = layout->side_bytes + static_cast<size_t>(blocks) * layout->block_bytes;
    auto cache = MakeKvCache(model_.transformer->kv_shape(), options);
    EXPECT_TRUE(cache.ok()) << cache.status().message();
    EXPECT_EQ((*cache)->Usage().blocks_total, blocks);
    return std::move(cache).value();
  }
  std::unique_ptr<Scheduler> NewScheduler(KvCache& cache, int64_t max_seqs = 8,
                                          int64_t batched_tokens = 512) {
    SchedulerOptions options;
    options.max_num_seqs = max_seqs;
    options.max_num_batched_tokens = batched_tokens;
    options.max_model_len = 256;
    options.block_tokens = 16;
    auto s = Scheduler::Create(*model_.transformer, *model_.tokenizer, cache, options);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return std::move(s).value();
  }
  ServeRequest Request(const std::string& prompt, int64_t max_tokens) {
    ServeRequest r;
    auto ids = BuildPrompt(model_, prompt, false);
    EXPECT_TRUE(ids.ok());
    r.prompt = *ids;
    r.max_tokens = max_tokens;
    return r;
  }
  // Steps until idle; returns the number of steps.
  int RunAll(Scheduler& s, StepReport* total = nullptr) {
    int steps = 0;
    while (s.HasWork() && steps < 10000) {
      StepReport report;
      EXPECT_TRUE(s.Step(&report).ok());
      if (total != nullptr) {
        total->preemptions += report.preemptions;
        total->generated_tokens += report.generated_tokens;
        total->prompt_tokens += report.prompt_tokens;
        total->batch_sequences = std::max(total->batch_sequences, report.batch_sequences);
      }
      ++steps;
    }
    return steps;
  }
};

// One request alone goes through the same Forward calls as Generate (whole
// prompt, then one token per step), so greedy output is identical.
TEST_F(SchedulerTest, GreedyMatchesGenerate) {
  auto cache = NewCache(32);
  GenerateOptions gen;
  gen.max_new_tokens = 20;
  std::string expected;
  ASSERT_TRUE(Generate(
                  model_, *cache, "The quick brown fox", gen,
                  [&](std::string_view t) { expected += t; }, nullptr)
                  .ok());
  auto scheduler = NewScheduler(*cache);
  auto channel = std::make_shared<RequestChannel>();
  scheduler->Add(Request("The quick brown fox", 20), channel, Clock::now());
  RunAll(*scheduler);
  Output out = Drain(*channel);
  EXPECT_TRUE(out.final.final);
  EXPECT_EQ(out.text, expected);
  EXPECT_EQ(cache->Usage().blocks_used, 0);
}

TEST_F(SchedulerTest, BatchesAndReleasesEverything) {
  auto cache = NewCache(64);
  auto scheduler = NewScheduler(*cache, 4);
  std::vector<std::shared_ptr<RequestChannel>> channels;
  for (int i = 0; i < 6; ++i) {
    ServeRequest r = Request("Request number " + std::to_string(i) + " says", 5 + i);
    r.stop_at_eos = false;  // exact token counts
    channels.push_back(std::make_shared<RequestChannel>());
    ASSERT_TRUE(scheduler->Validate(r).ok());
    scheduler->Add(r, channels.back(), Clock::now());
  }
  StepReport total;
  RunAll(*scheduler, &total);
  EXPECT_EQ(total.batch_sequences, 4);  // max_num_seqs bounds the batch
  for (int i = 0; i < 6; ++i) {
    Output out = Drain(*channels[i]);
    EXPECT_EQ(out.final.finish_reason, "length");
    EXPECT_EQ(out.final.completion_tokens, 5 + i);
  }
  EXPECT_EQ(total.generated_tokens, 5 + 6 + 7 + 8 + 9 + 10);
  EXPECT_EQ(cache->Usage().blocks_used, 0);
}

// Long prompts are split into chunks of max_num_batched_tokens, and decodes
// of running sequences keep going in the same steps.
TEST_F(SchedulerTest, ChunkedPrefillKeepsDecoding) {
  auto cache = NewCache(64);
  auto scheduler = NewScheduler(*cache, 4, /*batched_tokens=*/8);
  auto short_channel = std::make_shared<RequestChannel>();
  ServeRequest first = Request("Hi", 30);
  first.stop_at_eos = false;
  scheduler->Add(first, short_channel, Clock::now());
  StepReport report;
  ASSERT_TRUE(scheduler->Step(&report).ok());  // prefill of the short prompt
  std::string long_prompt;
  for (int i = 0; i < 20; ++i) long_prompt += "word" + std::to_string(i) + " ";
  ServeRequest second = Request(long_prompt, 3);
  ASSERT_GT(second.prompt.size(), 40u);
  auto long_channel = std::make_shared<RequestChannel>();
  scheduler->Add(second, long_channel, Clock::now());
  int steps_with_both = 0;
  while (scheduler->HasWork()) {
    ASSERT_TRUE(scheduler->Step(&report).ok());
    EXPECT_LE(report.prompt_tokens + report.generated_tokens, 8 + 1);
    if (report.prompt_tokens > 0 && report.batch_sequences == 2) ++steps_with_both;
  }
  // The long prompt needs >= 40 / 7 chunks, each beside a decode.
  EXPECT_GE(steps_with_both, 5);
  EXPECT_EQ(Drain(*short_channel).final.completion_tokens, 30);
  EXPECT_EQ(Drain(*long_channel).final.finish_reason, "length");
  EXPECT_EQ(cache->Usage().blocks_used, 0);
}

// Too few blocks for every sequence to grow: the newest is preempted and
// recomputed; every request still finishes with all its tokens.
TEST_F(SchedulerTest, PreemptsNewestWhenBlocksRunOut) {
  auto cache = NewCache(6);  // 96 tokens
  auto scheduler = NewScheduler(*cache, 4);
  std::vector<std::shared_ptr<RequestChannel>> channels;
  for (int i = 0; i < 3; ++i) {
    ServeRequest r = Request("Sequence " + std::to_string(i), 40);  // ~3 blocks each
    r.stop_at_eos = false;
    ASSERT_TRUE(scheduler->Validate(r).ok());
    channels.push_back(std::make_shared<RequestChannel>());
    scheduler->Add(r, channels.back(), Clock::now());
  }
  StepReport total;
  RunAll(*scheduler, &total);
  EXPECT_GT(total.preemptions, 0);
  for (auto& channel : channels) {
    Output out = Drain(*channel);
    EXPECT_EQ(out.final.finish_reason, "length");
    EXPECT_EQ(out.final.completion_tokens, 40);
  }
  EXPECT_EQ(cache->Usage().blocks_used, 0);
}

// A streaming cache (f16 residual windows and sinks charged per sequence;
// this test model's head_dim of 16 is too small for KIVI's per-channel
// groups). Admission and preemption count the windows, every request
// finishes with all its tokens, and the cache drains to zero.
TEST_F(SchedulerTest, StreamingCacheCountsItsWindows) {
  KvCacheOptions options;
  options.k_type = options.v_type = "bf16-r32-s2";
  options.block_tokens = 16;
  options.max_tokens = 256;
  auto layout = ComputeKvLayout(model_.transformer->kv_shape(), options);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  ASSERT_GT(layout->staging_blocks, 0);
  // Room for two sequences of 64 tokens with their windows, not three.
  options.memory_bytes = layout->side_bytes + 2 * layout->SequenceBytes(64) + layout->block_bytes;
  auto cache = MakeKvCache(model_.transformer->kv_shape(), options);
  ASSERT_TRUE(cache.ok()) << cache.status().message();
  auto scheduler = NewScheduler(**cache, 4);
  EXPECT_EQ(scheduler->options().block_tokens, (*cache)->Usage().block_tokens);
  std::vector<std::shared_ptr<RequestChannel>> channels;
  for (int i = 0; i < 3; ++i) {
    ServeRequest r = Request("Sequence " + std::to_string(i), 50);
    r.stop_at_eos = false;
    ASSERT_TRUE(scheduler->Validate(r).ok());
    channels.push_back(std::make_shared<RequestChannel>());
    scheduler->Add(r, channels.back(), Clock::now());
  }
  StepReport total;
  RunAll(*scheduler, &total);
  EXPECT_GE(total.batch_sequences, 2);  // short prompts start together; growth preempts
  for (auto& channel : channels) {
    Output out = Drain(*channel);
    EXPECT_EQ(out.final.finish_reason, "length") << out.final.error;
    EXPECT_EQ(out.final.completion_tokens, 50);
  }
  EXPECT_EQ((*cache)->Usage().blocks_used, 0);
}

TEST_F(SchedulerTest, CancelFreesBlocks) {
  auto cache = NewCache(32);
  auto scheduler = NewScheduler(*cache);
  auto channel = std::make_shared<RequestChannel>();
  ServeRequest r = Request("Cancel me", 100);
  r.stop_at_eos = false;
  scheduler->Add(r, channel, Clock::now());
  StepReport report;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(scheduler->Step(&report).ok());
  EXPECT_GT(cache->Usage().blocks_used, 0);
  channel->Cancel();
  ASSERT_TRUE(scheduler->Step(&report).ok());
  EXPECT_EQ(cache->Usage().blocks_used, 0);
  EXPECT_FALSE(scheduler->HasWork());
  EXPECT_EQ(Drain(*channel).final.finish_reason, "cancelled");
}

TEST_F(SchedulerTest, StopStringEndsAndIsNotReturned) {
  auto cache = NewCache(32);
  auto scheduler = NewScheduler(*cache);
  auto channel = std::make_shared<RequestChannel>();
  ServeRequest r = Request("Once upon a time", 24);
  r.stop_at_eos = false;
  scheduler->Add(r, channel, Clock::now());
  RunAll(*scheduler);
  const std::string full = Drain(*channel).text;
  ASSERT_GE(full.size(), 8u);
  // Stop at a piece from the middle of the greedy output.
  const std::string stop = full.substr(full.size() / 2, 3);
  r.stop = {stop};
  auto stopped = std::make_shared<RequestChannel>();
  scheduler->Add(r, stopped, Clock::now());
  RunAll(*scheduler);
  Output out = Drain(*stopped);
  EXPECT_EQ(out.final.finish_reason, "stop");
  EXPECT_EQ(out.text, full.substr(0, full.find(stop)));
}

TEST_F(SchedulerTest, ValidateRejectsWhatCanNeverRun) {
  auto cache = NewCache(4);  // 64 tokens
  auto scheduler = NewScheduler(*cache);
  ServeRequest r = Request("Hello", 1);
  EXPECT_TRUE(scheduler->Validate(r).ok());
  r.max_tokens = 0;
  EXPECT_FALSE(scheduler->Validate(r).ok());
  r.max_tokens = 300;  // over max_model_len 256
  EXPECT_NE(scheduler->Validate(r).message().find("maximum context length"), std::string::npos);
  r.max_tokens = 100;  // fits the context, not the 64-token cache
  EXPECT_NE(scheduler->Validate(r).message().find("blocks"), std::string::npos);
  r.prompt.clear();
  EXPECT_FALSE(scheduler->Validate(r).ok());
}

}  // namespace
}  // namespace kvq
