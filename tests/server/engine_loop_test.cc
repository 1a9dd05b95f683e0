#include "server/engine_loop.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "engine/generate.h"
#include "engine/loaded_model.h"
#include "kv/kv_factory.h"
#include "server/test_model.h"

namespace kvq {
namespace {

// Waits for the final event; returns the text and that event.
std::pair<std::string, RequestEvent> WaitFinal(RequestChannel& channel) {
  std::string text;
  for (int i = 0; i < 600; ++i) {  // 60 s at most
    std::vector<RequestEvent> events;
    channel.Pop(&events, std::chrono::milliseconds(100));
    for (RequestEvent& e : events) {
      text += e.text;
      if (e.final) return {text, e};
    }
  }
  ADD_FAILURE() << "no final event";
  return {text, {}};
}

class EngineLoopTest : public TinyServerModelTest {
 protected:
  void SetUp() override {
    TinyServerModelTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_NO_FATAL_FAILURE(LoadTinyModel(2));
    ASSERT_NO_FATAL_FAILURE(NewDenseCache());
  }
  std::unique_ptr<EngineLoop> NewLoop(int64_t max_waiting) {
    SchedulerOptions options;
    options.max_model_len = 256;
    auto scheduler = Scheduler::Create(*model_.transformer, *model_.tokenizer, *cache_, options);
    EXPECT_TRUE(scheduler.ok());
    EngineLoopOptions loop_options;
    loop_options.max_waiting = max_waiting;
    return std::make_unique<EngineLoop>(std::move(scheduler).value(), *cache_, loop_options);
  }
  ServeRequest Request(int64_t max_tokens) {
    ServeRequest r;
    r.prompt = *BuildPrompt(model_, "Hello there", false);
    r.max_tokens = max_tokens;
    r.stop_at_eos = false;
    return r;
  }
};

TEST_F(EngineLoopTest, ServesConcurrentSubmittersAndDrains) {
  auto loop = NewLoop(16);
  loop->Start();
  std::vector<std::shared_ptr<RequestChannel>> channels;
  for (int i = 0; i < 5; ++i) {
    SubmitResult r = loop->Submit(Request(6 + i));
    ASSERT_EQ(r.outcome, SubmitOutcome::kAccepted);
    channels.push_back(r.channel);
  }
  for (int i = 0; i < 5; ++i) {
    auto [text, final] = WaitFinal(*channels[i]);
    EXPECT_EQ(final.finish_reason, "length");
    EXPECT_EQ(final.completion_tokens, 6 + i);
  }
  EXPECT_TRUE(loop->WaitIdle(std::chrono::seconds(10)));
  loop->Stop();
  EXPECT_EQ(cache_->Usage().blocks_used, 0);
  EXPECT_NE(loop->metrics().Render().find("kvq_generation_tokens_total 40\n"), std::string::npos);
}

TEST_F(EngineLoopTest, BoundedQueueRefusesAndStopCancels) {
  auto loop = NewLoop(2);  // not started: everything stays queued
  SubmitResult a = loop->Submit(Request(4));
  SubmitResult b = loop->Submit(Request(4));
  SubmitResult c = loop->Submit(Request(4));
  EXPECT_EQ(a.outcome, SubmitOutcome::kAccepted);
  EXPECT_EQ(b.outcome, SubmitOutcome::kAccepted);
  EXPECT_EQ(c.outcome, SubmitOutcome::kQueueFull);
  ServeRequest too_long = Request(1000);
  EXPECT_EQ(loop->Submit(too_long).outcome, SubmitOutcome::kInvalid);
  loop->StopAccepting();
  EXPECT_EQ(loop->Submit(Request(4)).outcome, SubmitOutcome::kShuttingDown);
  loop->Stop();
  EXPECT_EQ(WaitFinal(*a.channel).second.finish_reason, "cancelled");
  EXPECT_EQ(WaitFinal(*b.channel).second.finish_reason, "cancelled");
  EXPECT_NE(loop->metrics().Render().find("kvq_requests_rejected_total 2\n"), std::string::npos);
}

TEST_F(EngineLoopTest, CancelledStreamIsReleased) {
  auto loop = NewLoop(4);
  loop->Start();
  SubmitResult r = loop->Submit(Request(200));
  ASSERT_EQ(r.outcome, SubmitOutcome::kAccepted);
  std::vector<RequestEvent> events;
  while (events.empty()) r.channel->Pop(&events, std::chrono::milliseconds(100));
  // The first token is out and 199 are to come: not idle (a shutdown drain
  // that believed otherwise would cancel a running request).
  EXPECT_FALSE(loop->WaitIdle(std::chrono::milliseconds(0)));
  loop->Cancel(r.channel);
  EXPECT_EQ(WaitFinal(*r.channel).second.finish_reason, "cancelled");
  EXPECT_TRUE(loop->WaitIdle(std::chrono::seconds(10)));
  loop->Stop();
  EXPECT_EQ(cache_->Usage().blocks_used, 0);
}

}  // namespace
}  // namespace kvq
