// Batch-invariant serving (SchedulerOptions::batch_invariant): a request's
// tokens and log probabilities, bit for bit, are those it gets alone, while
// other requests arrive before and after it, take the step's token budget,
// force preemptions (so it is recomputed) and share its cached prefix. Checked
// on a dense cache type (f16, prefix caching on) and on a streaming one (bf16
// with a 32-token f16 window and 2 sinks, as KIVI keeps its newest tokens:
// its attention depends on where a prompt's chunks end; the tiny model's
// head_dim of 16 is too small for the integer codecs' groups of 32). The same
// load without the option changes the log probabilities, so the comparison
// can fail.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/loaded_model.h"
#include "kv/kv_factory.h"
#include "server/scheduler.h"
#include "server/test_model.h"

namespace kvq {
namespace {

constexpr int64_t kBlockTokens = 16;
constexpr int64_t kChunk = 40;  // prefill_chunk: prompts of 100 tokens take 3 chunks

// What a request received: its text and every token's log probabilities.
struct Received {
  std::string text, finish;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // per token: its own, then its alternatives'
  bool operator==(const Received&) const = default;
};

Received Drain(RequestChannel& channel) {
  Received out;
  std::vector<RequestEvent> events;
  channel.Pop(&events, std::chrono::milliseconds(0));
  for (const RequestEvent& e : events) {
    out.text += e.text;
    if (e.final) out.finish = e.finish_reason;
    for (const TokenLogprob& t : e.logprobs) {
      out.tokens.push_back(t.token);
      out.logprobs.push_back(t.logprob);
      for (const auto& [id, lp] : t.top) out.logprobs.push_back(lp);
    }
  }
  return out;
}

struct Load {
  int64_t steps = 0, preemptions = 0, prefix_hits = 0, max_batch = 0;
};

class BatchInvariantTest : public TinyServerModelTest {
 protected:
  void SetUp() override {
    TinyServerModelTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_NO_FATAL_FAILURE(LoadTinyModel(2));
  }
  std::vector<int32_t> Tokens(size_t n, int offset) { return FixtureTokens(model_, n, offset); }
  std::unique_ptr<KvCache> NewCache(const std::string& type, int64_t blocks) {
    KvCacheOptions options;
    options.k_type = options.v_type = type;
    options.max_tokens = 256;
    options.block_tokens = kBlockTokens;
    auto layout = ComputeKvLayout(model_.transformer->kv_shape(), options);
    EXPECT_TRUE(layout.ok()) << layout.status().message();
    if (!layout.ok()) return nullptr;
    options.memory_bytes = layout->side_bytes + static_cast<size_t>(blocks) * layout->block_bytes;
    auto cache = MakeKvCache(model_.transformer->kv_shape(), options);
    EXPECT_TRUE(cache.ok()) << cache.status().message();
    return cache.ok() ? std::move(cache).value() : nullptr;
  }
  static SchedulerOptions Options(bool invariant, int64_t chunk = kChunk) {
    SchedulerOptions options;
    options.max_num_seqs = 4;
    options.max_num_batched_tokens = 64;  // a chunk of 40 fits beside 4 decodes, not two chunks
    options.max_model_len = 256;
    options.block_tokens = kBlockTokens;
    options.batch_invariant = invariant;
    options.prefill_chunk = chunk;
    return options;
  }
  std::unique_ptr<Scheduler> NewScheduler(KvCache& cache, bool invariant, int64_t chunk = kChunk) {
    auto s =
        Scheduler::Create(*model_.transformer, *model_.tokenizer, cache, Options(invariant, chunk));
    EXPECT_TRUE(s.ok()) << s.status().message();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  static ServeRequest Request(std::vector<int32_t> prompt, int64_t max_tokens) {
    ServeRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.stop_at_eos = false;  // exact token counts
    r.logprobs = 3;
    return r;
  }
  // The two requests under test: greedy, and sampled with a seed.
  std::vector<ServeRequest> Targets() {
    ServeRequest greedy = Request(Tokens(100, 1), 20);
    ServeRequest sampled = Request(Tokens(37, 2), 24);
    sampled.sampling.temperature = 0.9f;
    sampled.sampling.seed = 7;
    return {greedy, sampled};
  }
  // Each target alone, on a cache that holds everything.
  std::vector<Received> Alone(const std::string& type, bool invariant, int64_t chunk = kChunk) {
    std::vector<Received> out;
    for (const ServeRequest& r : Targets()) {
      auto cache = NewCache(type, 64);
      auto scheduler = NewScheduler(*cache, invariant, chunk);
      auto channel = std::make_shared<RequestChannel>();
      scheduler->Add(r, channel, Clock::now());
      for (int i = 0; scheduler->HasWork() && i < 10000; ++i) {
        StepReport report;
        EXPECT_TRUE(scheduler->Step(&report).ok());
      }
      out.push_back(Drain(*channel));
    }
    return out;
  }
  // The targets among six other requests arriving at several steps, on a
  // cache too small for all of them (so some are preempted and recomputed);
  // one of the others starts with the greedy target's first 64 tokens.
  std::vector<Received> Loaded(const std::string& type, bool invariant, int64_t blocks,
                               Load* load) {
    auto cache = NewCache(type, blocks);
    auto scheduler = NewScheduler(*cache, invariant);
    std::vector<ServeRequest> targets = Targets();
    std::vector<int32_t> shares = targets[0].prompt;
    shares.resize(64);
    const std::vector<int32_t> tail = Tokens(30, 9);
    shares.insert(shares.end(), tail.begin(), tail.end());
    // (step, request, is a target)
    std::vector<std::tuple<int64_t, ServeRequest, int>> arrivals = {
        {0, Request(Tokens(70, 3), 30), -1},
        {0, Request(Tokens(30, 4), 25), -1},
        {2, targets[0], 0},
        {3, Request(Tokens(50, 5), 12), -1},
        {4, targets[1], 1},
        {6, Request(shares, 15), -1},
        {9, Request(Tokens(90, 6), 10), -1},
        {15, Request(Tokens(20, 8), 40), -1}};
    std::vector<std::shared_ptr<RequestChannel>> target_channels(2);
    size_t next = 0;
    for (int64_t step = 0; step < 10000; ++step) {
      for (; next < arrivals.size() && std::get<0>(arrivals[next]) <= step; ++next) {
        auto& [at, request, target] = arrivals[next];
        EXPECT_TRUE(scheduler->Validate(request).ok()) << scheduler->Validate(request).message();
        auto channel = std::make_shared<RequestChannel>();
        if (target >= 0) target_channels[static_cast<size_t>(target)] = channel;
        scheduler->Add(request, channel, Clock::now());
      }
      if (next == arrivals.size() && !scheduler->HasWork()) break;
      StepReport report;
      EXPECT_TRUE(scheduler->Step(&report).ok());
      ++load->steps;
      load->preemptions += report.preemptions;
      load->prefix_hits += report.prefix_cache_hits;
      load->max_batch = std::max(load->max_batch, report.batch_sequences);
    }
    EXPECT_EQ(cache->Usage().sequences, 0);
    return {Drain(*target_channels[0]), Drain(*target_channels[1])};
  }
};

TEST_F(BatchInvariantTest, OutputDoesNotDependOnTheLoad) {
  // f16: 20 blocks hold about two and a half of the requests at full length.
  // bf16 with a 32-token f16 window and 2 sinks keeps rows of its own per sequence, so it gets
  // more.
  const std::map<std::string, int64_t> blocks = {{"f16", 20}, {"bf16-r32-s2", 32}};
  for (const auto& [type, n] : blocks) {
    SCOPED_TRACE(type);
    const std::vector<Received> alone = Alone(type, true);
    ASSERT_EQ(alone.size(), 2u);
    for (const Received& r : alone) {
      EXPECT_EQ(r.finish, "length");
      EXPECT_EQ(r.tokens.size(), r.logprobs.size() / 4);
    }
    EXPECT_EQ(alone[0].tokens.size(), 20u);
    EXPECT_EQ(alone[1].tokens.size(), 24u);
    Load load;
    const std::vector<Received> loaded = Loaded(type, true, n, &load);
    EXPECT_EQ(loaded[0], alone[0]) << "greedy: " << loaded[0].text << " | " << alone[0].text;
    EXPECT_EQ(loaded[1], alone[1]) << "sampled: " << loaded[1].text << " | " << alone[1].text;
    // The load did what it is there for.
    EXPECT_GT(load.preemptions, 0);
    EXPECT_EQ(load.max_batch, 4);
    if (type == "f16") EXPECT_GT(load.prefix_hits, 0);

    // Without the option, the same load moves the log probabilities.
    Load fastest_load;
    const std::vector<Received> fastest = Loaded(type, false, n, &fastest_load);
    EXPECT_NE(fastest, Alone(type, false));
    // Where a prompt's chunks end matters to the f16 window only: that is
    // why the chunks are cut at fixed positions.
    const std::vector<Received> other_chunks = Alone(type, true, 48);
    if (type == "f16") {
      EXPECT_EQ(other_chunks, alone);
    } else {
      EXPECT_NE(other_chunks[0], alone[0]);  // 100 tokens: 48 + 48 + 4, not 40 + 40 + 20
      EXPECT_EQ(other_chunks[1], alone[1]);  // 37 tokens: one chunk either way
    }
  }
}

// fp8 caches set their scales from the first rows they store, so a request
// depends on which came first: batch invariance refuses them and says why.
TEST_F(BatchInvariantTest, RefusesCachesCalibratedByTheFirstRequest) {
  auto cache = NewCache("fp8_e4m3", 32);
  SchedulerOptions options = Options(true);
  auto s = Scheduler::Create(*model_.transformer, *model_.tokenizer, *cache, options);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("batch invariance: KV cache type fp8_e4m3 sets its "
                                      "fp8_e4m3 scales from the first rows it stores"),
            std::string::npos)
      << s.status().message();
  options.batch_invariant = false;
  EXPECT_TRUE(Scheduler::Create(*model_.transformer, *model_.tokenizer, *cache, options).ok());
}

// A chunk must fit beside a full batch of decodes.
TEST_F(BatchInvariantTest, ChunkMustFitTheBudget) {
  auto cache = NewCache("f16", 32);
  SchedulerOptions options = Options(true);
  for (int64_t chunk : {0, 61, 64}) {
    options.prefill_chunk = chunk;
    auto s = Scheduler::Create(*model_.transformer, *model_.tokenizer, *cache, options);
    ASSERT_FALSE(s.ok()) << chunk;
    EXPECT_NE(s.status().message().find("at most max_num_batched_tokens - max_num_seqs (60)"),
              std::string::npos)
        << s.status().message();
  }
  options.prefill_chunk = 60;
  EXPECT_TRUE(Scheduler::Create(*model_.transformer, *model_.tokenizer, *cache, options).ok());
  options.batch_invariant = false;
  options.prefill_chunk = 1000;  // ignored without batch invariance
  EXPECT_TRUE(Scheduler::Create(*model_.transformer, *model_.tokenizer, *cache, options).ok());
}

}  // namespace
}  // namespace kvq
