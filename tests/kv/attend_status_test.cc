// Attend reports misuse as a Status (it used to assert, and zero-fill the
// output in release builds); --kv-rotate's Hadamard statuses are checked.
#include <gtest/gtest.h>

#include <vector>

#include "kv/kv_factory.h"

namespace kvq {
namespace {

TEST(AttendStatus, MisuseIsAnErrorNamingIt) {
  const KvShape shape(2, 4, 2, 64);
  for (bool rotate : {false, true}) {
    KvCacheOptions options;
    options.k_type = options.v_type = "int4";
    options.rotate = rotate;
    options.max_tokens = 64;
    auto cache = MakeKvCache(shape, options);
    ASSERT_TRUE(cache.ok()) << cache.status().message();
    ASSERT_TRUE((*cache)->AddSequence(0).ok());
    std::vector<float> kv(3 * 2 * 64, 0.5f), q(3 * 4 * 64, 0.25f), out(q.size());
    ASSERT_TRUE((*cache)->Append(0, 0, 3, kv.data(), kv.data(), kv.data()).ok());
    EXPECT_TRUE((*cache)->Attend(0, 0, 3, q.data(), 0.125f, out.data()).ok());
    const Status unknown = (*cache)->Attend(7, 0, 1, q.data(), 0.125f, out.data());
    ASSERT_FALSE(unknown.ok());
    EXPECT_NE(unknown.message().find("sequence 7"), std::string::npos) << unknown.message();
    EXPECT_FALSE((*cache)->Attend(0, 2, 1, q.data(), 0.125f, out.data()).ok());  // no layer 2
    EXPECT_FALSE((*cache)->Attend(0, 1, 1, q.data(), 0.125f, out.data()).ok());  // layer 1 empty
    const Status too_many = (*cache)->Attend(0, 0, 4, q.data(), 0.125f, out.data());
    ASSERT_FALSE(too_many.ok());
    EXPECT_NE(too_many.message().find("4 queries for 3 stored"), std::string::npos)
        << too_many.message();
  }
}

}  // namespace
}  // namespace kvq
