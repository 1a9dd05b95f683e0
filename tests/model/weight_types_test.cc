// The io layer's DType and the ops layer's WeightType describe the same
// storage types independently (neither layer may include the other); this
// checks that they agree on every type: name, block size and bytes.
#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include "io/tensor.h"
#include "model/transformer.h"
#include "ops/weights.h"

namespace kvq {
namespace {

TEST(WeightTypesTest, DTypeAndWeightTypeAgree) {
  for (int i = 0; i <= static_cast<int>(DType::kQ6_K); ++i) {
    const DType d = static_cast<DType>(i);
    const ops::WeightType w = ToWeightType(d);
    std::string lower = DTypeName(d);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_EQ(lower, ops::WeightTypeName(w));
    EXPECT_EQ(DTypeBlockSize(d), ops::BlockSize(w)) << lower;
    EXPECT_EQ(DTypeBlockBytes(d), ops::BlockBytes(w)) << lower;
    const int64_t cols = 2 * ops::BlockSize(w) * (ops::BlockSize(w) == 1 ? 256 : 1);
    EXPECT_EQ(static_cast<int64_t>(DTypeBytes(d, 3 * cols)), 3 * ops::RowBytes(w, cols)) << lower;
    EXPECT_EQ(DTypeIsQuantized(d), ops::BlockSize(w) > 1) << lower;
  }
}

}  // namespace
}  // namespace kvq
