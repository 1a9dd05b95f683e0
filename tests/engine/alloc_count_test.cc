// Run state is allocated once (issue 18): after a warm-up, decoding a token
// through Transformer::Forward and the paged cache makes no heap
// allocation. This binary replaces the global operator new with one that
// counts while a test asks it to (every thread's allocations, pool
// workers included) and otherwise just forwards to malloc.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "engine/loaded_model.h"
#include "kv/kv_factory.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};

void* CountedAlloc(size_t bytes) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
  }
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* CountedAlignedAlloc(size_t bytes, std::align_val_t align) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
  }
  const size_t a = static_cast<size_t>(align);
  void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(size_t bytes) { return CountedAlloc(bytes); }
void* operator new[](size_t bytes) { return CountedAlloc(bytes); }
void* operator new(size_t bytes, std::align_val_t a) { return CountedAlignedAlloc(bytes, a); }
void* operator new[](size_t bytes, std::align_val_t a) { return CountedAlignedAlloc(bytes, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }

namespace kvq {
namespace {

struct Case {
  const char* type;
  bool rotate;
};

// Prefill 100 tokens, decode 40 to warm up, then count the allocations of
// the next 140 decode steps (crossing KIVI's 128-token key flush at 256).
long DecodeAllocations(LoadedModel& model, const Case& c) {
  KvCacheOptions options;
  options.k_type = options.v_type = c.type;
  options.rotate = c.rotate;
  options.max_tokens = 512;
  options.num_threads = 2;
  auto cache = MakeKvCache(model.transformer->kv_shape(), options);
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  if (!cache.ok()) return -1;
  EXPECT_TRUE((*cache)->AddSequence(0).ok());
  std::vector<BatchSequence> batch{{0, std::vector<int32_t>(100), false}};
  for (size_t i = 0; i < 100; ++i) batch[0].tokens[i] = static_cast<int32_t>(i * 37 % 8000);
  std::vector<float> logits;
  EXPECT_TRUE(model.transformer->Forward(batch, **cache, &logits).ok());
  batch[0].tokens.resize(1);
  long counted = 0;
  for (int step = 0; step < 180; ++step) {
    batch[0].tokens[0] = (step * 101 + 7) % 8000;
    if (step == 40) g_counting.store(true);
    const Status forward = model.transformer->Forward(batch, **cache, &logits);
    g_counting.store(false);
    EXPECT_TRUE(forward.ok()) << forward.message();
    if (step >= 40) {
      counted += g_allocations.exchange(0);
      g_counting.store(true);
    }
  }
  g_counting.store(false);
  return counted;
}

TEST(RunState, DecodeStepsAllocateNothing) {
  auto loaded = LoadModel(std::string(KVQ_SOURCE_DIR) + "/models/kvq-tiny-qwen2", 2);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  LoadedModel model = std::move(loaded).value();
  g_allocations.store(0);
  // A decode that allocated would show up here (the test can fail): a
  // std::vector made while counting is counted.
  g_counting.store(true);
  { std::vector<int> probe(3); }
  g_counting.store(false);
  ASSERT_EQ(g_allocations.exchange(0), 1);
  for (const Case& c :
       {Case{"f16", false}, Case{"f32", false}, Case{"bf16", false}, Case{"fp8_e4m3", false},
        Case{"int8", false}, Case{"int4", false}, Case{"int2-g64-sym", false}, Case{"q4_0", false},
        Case{"int4", true}, Case{"q4_0", true}, Case{"iq4_nl-norot", false}, Case{"f16-s4", false},
        Case{"int4-g32-asym-r128", false}, Case{"kivi2", false}, Case{"kivi4", false},
        Case{"quarot2", false}, Case{"int4-s1-a4", false},
        Case{"quarot-int2-clip96-r16-a2", false}}) {
    EXPECT_EQ(DecodeAllocations(model, c), 0) << c.type << (c.rotate ? "+rot" : "");
  }
}

}  // namespace
}  // namespace kvq
