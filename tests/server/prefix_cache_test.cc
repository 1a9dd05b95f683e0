// Prefix caching in the scheduler (scheduler.h, KvCache's prefix interface):
// hits skip prefill, a partly reused block is copied on write and the cached
// one stays intact, idle cached blocks are evicted least recently used
// (a prefix's tail first), a cancelled request that shares blocks leaves
// the others untouched, and greedy outputs are the same with and without
// sharing for every cache type that shares.
//
// Output identity: the shared runs below prefill at least 32 tokens after
// the reused prefix, like the unshared runs prefill the whole prompt, so
// both go through the same batched matmul kernel (ops::Matmul switches
// kernels at 32 rows) and attention computes each query row in the same
// order; the K/V of the prefix are then the same bits either way. Only the
// whole-prompt hit (one token left to run) takes the n = 1 kernels, as
// every decode step does.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/loaded_model.h"
#include "kv/codec.h"
#include "kv/kv_factory.h"
#include "kv/paged_cache.h"
#include "server/scheduler.h"
#include "server/test_model.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBlockTokens = 16;

struct Totals {
  int64_t prompt_tokens = 0, generated = 0, preemptions = 0, hits = 0, queries = 0;
  int64_t max_batch = 0, max_saved = 0;
};

std::string Text(RequestChannel& channel, std::string* finish = nullptr) {
  std::vector<RequestEvent> events;
  channel.Pop(&events, std::chrono::milliseconds(0));
  std::string text;
  for (const RequestEvent& e : events) {
    text += e.text;
    if (e.final && finish != nullptr) *finish = e.finish_reason;
  }
  return text;
}

class PrefixCacheTest : public TinyServerModelTest {
 protected:
  void SetUp() override {
    TinyServerModelTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_NO_FATAL_FAILURE(LoadTinyModel(2));
    // A "system prompt" of exactly 4.5 blocks, and distinct user turns of
    // 40 tokens each (>= 32, see the top of the file).
    system_ = Tokens(72, 0);
  }
  std::vector<int32_t> Tokens(size_t n, int offset) { return FixtureTokens(model_, n, offset); }
  std::vector<int32_t> WithSystem(int user) {
    std::vector<int32_t> p = system_;
    const std::vector<int32_t> turn = Tokens(40, user + 1);
    p.insert(p.end(), turn.begin(), turn.end());
    return p;
  }
  std::unique_ptr<KvCache> NewCache(int64_t blocks, const std::string& type = "f16") {
    KvCacheOptions options;
    options.k_type = options.v_type = type;
    options.max_tokens = 256;
    options.block_tokens = kBlockTokens;
    auto layout = ComputeKvLayout(model_.transformer->kv_shape(), options);
    if (!layout.ok()) return nullptr;
    options.memory_bytes = layout->side_bytes + static_cast<size_t>(blocks) * layout->block_bytes;
    auto cache = MakeKvCache(model_.transformer->kv_shape(), options);
    if (!cache.ok()) return nullptr;
    return std::move(cache).value();
  }
  std::unique_ptr<Scheduler> NewScheduler(KvCache& cache, bool prefix, int64_t max_seqs = 8) {
    SchedulerOptions options;
    options.max_num_seqs = max_seqs;
    options.max_num_batched_tokens = 512;
    options.max_model_len = 256;
    options.block_tokens = kBlockTokens;
    options.enable_prefix_caching = prefix;
    auto s = Scheduler::Create(*model_.transformer, *model_.tokenizer, cache, options);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return std::move(s).value();
  }
  static ServeRequest Request(const std::vector<int32_t>& prompt, int64_t max_tokens) {
    ServeRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.stop_at_eos = false;  // exact token counts
    return r;
  }
  static void Step(Scheduler& s, KvCache& cache, Totals* t) {
    StepReport report;
    ASSERT_TRUE(s.Step(&report).ok());
    t->prompt_tokens += report.prompt_tokens;
    t->generated += report.generated_tokens;
    t->preemptions += report.preemptions;
    t->hits += report.prefix_cache_hits;
    t->queries += report.prefix_cache_queries;
    t->max_batch = std::max(t->max_batch, report.batch_sequences);
    const KvUsage u = cache.Usage();
    t->max_saved = std::max(t->max_saved, u.blocks_logical - u.blocks_used);
  }
  static Totals RunAll(Scheduler& s, KvCache& cache) {
    Totals t;
    for (int i = 0; s.HasWork() && i < 10000; ++i) Step(s, cache, &t);
    return t;
  }
  // Runs one request to its end; returns its text.
  static std::string RunOne(Scheduler& s, KvCache& cache, const std::vector<int32_t>& prompt,
                            int64_t max_tokens, Totals* totals = nullptr) {
    auto channel = std::make_shared<RequestChannel>();
    s.Add(Request(prompt, max_tokens), channel, Clock::now());
    const Totals t = RunAll(s, cache);
    if (totals != nullptr) *totals = t;
    std::string finish;
    std::string text = Text(*channel, &finish);
    EXPECT_EQ(finish, "length");
    return text;
  }
  static void ExpectConsistent(KvCache& cache) {
    auto* paged = dynamic_cast<PagedKvCache*>(&cache);
    ASSERT_NE(paged, nullptr);
    EXPECT_TRUE(paged->allocator().CheckInvariants().ok())
        << paged->allocator().CheckInvariants().message();
  }

  std::vector<int32_t> system_;
};

// A second request with the same system prompt reuses its 4 full blocks and
// prefills only the rest; its greedy output is that of an unshared run.
TEST_F(PrefixCacheTest, HitSkipsPrefillWithIdenticalOutput) {
  auto plain_cache = NewCache(64), shared_cache = NewCache(64);
  auto plain = NewScheduler(*plain_cache, false), shared = NewScheduler(*shared_cache, true);
  EXPECT_FALSE(plain->prefix_caching());
  ASSERT_TRUE(shared->prefix_caching()) << shared->prefix_caching_note();
  for (int user = 0; user < 3; ++user) {
    const std::vector<int32_t> prompt = WithSystem(user);
    Totals t;
    const std::string expected = RunOne(*plain, *plain_cache, prompt, 12);
    EXPECT_EQ(RunOne(*shared, *shared_cache, prompt, 12, &t), expected) << "user " << user;
    EXPECT_EQ(t.queries, static_cast<int64_t>(prompt.size()));
    // The first request finds nothing; later ones the system prompt's full
    // blocks (72 tokens = 4 full blocks + half of one shared with the turn).
    EXPECT_EQ(t.hits, user == 0 ? 0 : 4 * kBlockTokens) << "user " << user;
    EXPECT_EQ(t.prompt_tokens, static_cast<int64_t>(prompt.size()) - t.hits);
    EXPECT_EQ(shared_cache->Usage().blocks_used, 0);
    EXPECT_GT(shared_cache->Usage().blocks_cached, 0);
    ExpectConsistent(*shared_cache);
  }
  // Off: nothing is kept.
  EXPECT_EQ(plain_cache->Usage().blocks_cached, 0);
}

// The whole prompt is cached (block-aligned): the last prompt token is run
// again for its logits, in a copy of the cached last block; the cached block
// stays intact, so a third run reads the same prefix.
TEST_F(PrefixCacheTest, WholePromptHitCopiesTheSharedLastBlock) {
  const std::vector<int32_t> prompt = Tokens(5 * kBlockTokens, 7);
  auto plain_cache = NewCache(64), shared_cache = NewCache(64);
  auto plain = NewScheduler(*plain_cache, false), shared = NewScheduler(*shared_cache, true);
  const std::string expected = RunOne(*plain, *plain_cache, prompt, 10);
  EXPECT_EQ(RunOne(*shared, *shared_cache, prompt, 10), expected);
  for (int run = 0; run < 2; ++run) {
    Totals t;
    EXPECT_EQ(RunOne(*shared, *shared_cache, prompt, 10, &t), expected) << "run " << run;
    EXPECT_EQ(t.hits, 5 * kBlockTokens - 1);
    EXPECT_EQ(t.prompt_tokens, 0);  // the last prompt token runs as a decode step
    ExpectConsistent(*shared_cache);
  }
}

// Two live sequences share a prompt's blocks (reference count 2): memory
// is saved while both run, the second runs the last prompt token again in a
// copy of the shared fifth block (copy-on-write), the first keeps writing its
// own blocks, and both outputs match an unshared run.
TEST_F(PrefixCacheTest, ConcurrentSharingCopiesTheSharedLastBlock) {
  auto plain_cache = NewCache(64), shared_cache = NewCache(64);
  auto plain = NewScheduler(*plain_cache, false), shared = NewScheduler(*shared_cache, true);
  const std::vector<int32_t> prompt = Tokens(5 * kBlockTokens, 3);
  const std::string expected = RunOne(*plain, *plain_cache, prompt, 20);
  auto first = std::make_shared<RequestChannel>(), second = std::make_shared<RequestChannel>();
  shared->Add(Request(prompt, 20), first, Clock::now());
  Totals t;
  Step(*shared, *shared_cache, &t);  // the first prefills and publishes 5 full blocks
  auto* paged = dynamic_cast<PagedKvCache*>(shared_cache.get());
  ASSERT_NE(paged, nullptr);
  const std::vector<BlockId> before = paged->BlockTable(0);
  ASSERT_EQ(before.size(), 5u);
  shared->Add(Request(prompt, 20), second, Clock::now());
  Step(*shared, *shared_cache, &t);
  EXPECT_EQ(t.hits, 5 * kBlockTokens - 1);
  const std::vector<BlockId> ta = paged->BlockTable(0), tb = paged->BlockTable(1);
  ASSERT_EQ(ta.size(), 6u);  // the first crossed into a sixth block
  ASSERT_EQ(tb.size(), 5u);
  for (size_t j = 0; j < 5; ++j) EXPECT_EQ(ta[j], before[j]) << "block " << j;
  for (size_t j = 0; j < 4; ++j) EXPECT_EQ(ta[j], tb[j]) << "block " << j;
  EXPECT_NE(ta[4], tb[4]);  // copied before the second wrote token 79 into it
  const Totals rest = RunAll(*shared, *shared_cache);
  EXPECT_GE(std::max(t.max_saved, rest.max_saved), 4);
  EXPECT_EQ(Text(*first), expected);
  EXPECT_EQ(Text(*second), expected);
  EXPECT_EQ(shared_cache->Usage().blocks_used, 0);
  ExpectConsistent(*shared_cache);
}

// Cancelling a request that shares blocks frees only what it alone holds:
// the other finishes with its unshared output and the cache drains.
TEST_F(PrefixCacheTest, CancelOfASharingRequestKeepsTheOther) {
  auto plain_cache = NewCache(64), shared_cache = NewCache(64);
  auto plain = NewScheduler(*plain_cache, false), shared = NewScheduler(*shared_cache, true);
  const std::vector<int32_t> pa = WithSystem(0), pb = WithSystem(1);
  const std::string expected = RunOne(*plain, *plain_cache, pb, 30);
  auto a = std::make_shared<RequestChannel>(), b = std::make_shared<RequestChannel>();
  shared->Add(Request(pa, 100), a, Clock::now());
  Totals t;
  Step(*shared, *shared_cache, &t);
  shared->Add(Request(pb, 30), b, Clock::now());
  for (int i = 0; i < 3; ++i) Step(*shared, *shared_cache, &t);
  EXPECT_EQ(t.hits, 4 * kBlockTokens);
  EXPECT_GT(shared_cache->Usage().blocks_logical, shared_cache->Usage().blocks_used);
  a->Cancel();
  const int64_t used_before = shared_cache->Usage().blocks_used;
  Step(*shared, *shared_cache, &t);
  // The shared blocks stay with the survivor; only the canceller's own go.
  EXPECT_LT(shared_cache->Usage().blocks_used, used_before);
  EXPECT_EQ(shared_cache->Usage().sequences, 1);
  ExpectConsistent(*shared_cache);
  RunAll(*shared, *shared_cache);
  std::string finish;
  Text(*a, &finish);
  EXPECT_EQ(finish, "cancelled");
  EXPECT_EQ(Text(*b), expected);
  EXPECT_EQ(shared_cache->Usage().blocks_used, 0);
  ExpectConsistent(*shared_cache);
}

// A cache of 29 blocks, 80-token prompts generating 7 tokens (6 blocks
// each, the 5 prompt blocks kept): the sixth request finds 4 free blocks and
// evicts 2 idle cached ones, the least recently released first, and of a
// released prefix its tail before its head, so the first prompt keeps its
// first 3 blocks.
TEST_F(PrefixCacheTest, EvictsLeastRecentlyUsedUnderPressure) {
  auto plain_cache = NewCache(29), shared_cache = NewCache(29);
  auto plain = NewScheduler(*plain_cache, false), shared = NewScheduler(*shared_cache, true);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> expected;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(Tokens(5 * kBlockTokens, 20 + i));
    expected.push_back(RunOne(*plain, *plain_cache, prompts.back(), 7));
    EXPECT_EQ(RunOne(*shared, *shared_cache, prompts.back(), 7), expected.back()) << i;
    ExpectConsistent(*shared_cache);
  }
  EXPECT_EQ(shared_cache->Usage().blocks_used, 0);
  EXPECT_EQ(shared_cache->Usage().blocks_cached, 6 * 5 - 2);
  Totals t;
  EXPECT_EQ(RunOne(*shared, *shared_cache, prompts[0], 7, &t), expected[0]);
  EXPECT_EQ(t.hits, 3 * kBlockTokens);  // its head survived; 32 tokens prefilled
  EXPECT_EQ(RunOne(*shared, *shared_cache, prompts[5], 7, &t), expected[5]);
  EXPECT_EQ(t.hits, 5 * kBlockTokens - 1);
  // Pressure from running sequences: more than fit at once beside the
  // cached blocks; all finish with their tokens, evicting cached blocks.
  std::vector<std::shared_ptr<RequestChannel>> channels;
  for (int i = 0; i < 4; ++i) {
    channels.push_back(std::make_shared<RequestChannel>());
    shared->Add(Request(Tokens(40, 40 + i), 20), channels.back(), Clock::now());
  }
  const Totals busy = RunAll(*shared, *shared_cache);
  EXPECT_GE(busy.max_batch, 2);
  for (auto& c : channels) {
    std::string finish;
    Text(*c, &finish);
    EXPECT_EQ(finish, "length");
  }
  EXPECT_EQ(shared_cache->Usage().blocks_used, 0);
  ExpectConsistent(*shared_cache);
}

// Every cache type that shares prefixes gives the same greedy outputs with
// and without sharing over a mixed workload (system-prompt hits, a whole
// prompt hit, a batch of three); a type that cannot share says why and
// serves with caching off.
TEST_F(PrefixCacheTest, IdenticalOutputForEveryCacheTypeThatShares) {
  const int64_t head_dim = model_.transformer->kv_shape().head_dim;
  std::vector<std::string> types = AllKvCodecNames(head_dim);
  for (const std::string& t : AllKvStreamingCodecNames(head_dim)) types.push_back(t);
  types.push_back("bf16-r32-s2");  // streaming samples valid at this head_dim of 16
  types.push_back("f16-r8");
  int shared_types = 0, refused_types = 0;
  for (const std::string& type : types) {
    SCOPED_TRACE(type);
    auto plain_cache = NewCache(64, type), shared_cache = NewCache(64, type);
    if (plain_cache == nullptr || shared_cache == nullptr) continue;  // needs a file, etc.
    auto plain = NewScheduler(*plain_cache, false), shared = NewScheduler(*shared_cache, true);
    if (!shared->prefix_caching()) {
      EXPECT_NE(shared->prefix_caching_note().find("f16"), std::string::npos)
          << shared->prefix_caching_note();
      EXPECT_NE(shared_cache->PrefixCachingUnsupported(), "");
      ++refused_types;
      continue;
    }
    ++shared_types;
    auto run = [&](Scheduler& s, KvCache& cache, int64_t* hits) {
      std::vector<std::string> out;
      for (int user = 0; user < 2; ++user) {
        Totals t;
        out.push_back(RunOne(s, cache, WithSystem(user), 8, &t));
        *hits += t.hits;
      }
      Totals t;
      out.push_back(RunOne(s, cache, WithSystem(0), 8, &t));  // whole prompt minus one
      *hits += t.hits;
      std::vector<std::shared_ptr<RequestChannel>> channels;
      for (int user = 2; user < 5; ++user) {
        channels.push_back(std::make_shared<RequestChannel>());
        s.Add(Request(WithSystem(user), 8), channels.back(), Clock::now());
      }
      *hits += RunAll(s, cache).hits;
      for (auto& c : channels) out.push_back(Text(*c));
      return out;
    };
    int64_t plain_hits = 0, shared_hits = 0;
    const std::vector<std::string> expected = run(*plain, *plain_cache, &plain_hits);
    EXPECT_EQ(run(*shared, *shared_cache, &shared_hits), expected);
    EXPECT_EQ(plain_hits, 0);
    EXPECT_GT(shared_hits, 0);
    ExpectConsistent(*shared_cache);
  }
  EXPECT_GE(shared_types, 3);   // f32, f16, bf16 at least
  EXPECT_GE(refused_types, 1);  // every streaming sample
}

}  // namespace
}  // namespace kvq
