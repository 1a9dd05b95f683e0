#include "base/status.h"

#include <gtest/gtest.h>

namespace kvq {
namespace {

StatusOr<int> ParsePositive(int x) {
  if (x <= 0) return Status::Error("not positive: " + std::to_string(x));
  return x;
}

StatusOr<int> Doubled(int x) {
  KVQ_ASSIGN_OR_RETURN(int v, ParsePositive(x));
  return 2 * v;
}

TEST(Status, OkAndErrorCarryMessages) {
  EXPECT_TRUE(Status::Ok().ok());
  Status err = Status::Error("bad").WithContext("file.gguf");
  EXPECT_FALSE(err.ok());
  EXPECT_EQ(err.message(), "file.gguf: bad");
}

TEST(Status, AssignOrReturnPropagates) {
  EXPECT_EQ(*Doubled(3), 6);
  auto failed = Doubled(-1);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().message(), "not positive: -1");
}

}  // namespace
}  // namespace kvq
