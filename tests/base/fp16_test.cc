#include "base/fp16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kvq {
namespace {

// Every one of the 65536 f16 bit patterns must survive f16 -> f32 -> f16
// unchanged (NaNs stay NaN): f32 represents all of them exactly.
TEST(Fp16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    const uint16_t back = F32ToF16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(back))) << h;
    } else {
      EXPECT_EQ(back, h) << "bits " << h << " value " << f;
    }
  }
}

TEST(Fp16, KnownValues) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3C00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xC000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);  // rounds past max finite: inf
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(F32ToF16(5.960464477539063e-08f), 0x0001);    // smallest subnormal
  EXPECT_EQ(F32ToF16(2.98023223876953125e-08f), 0x0000);  // half of it: ties to even (0)
  EXPECT_EQ(F32ToF16(8.940696716308594e-08f), 0x0002);    // 1.5 units: ties to even (2)
  EXPECT_FLOAT_EQ(F16ToF32(0x3555), 0.333251953125f);
}

// Round to nearest even: the value halfway between two halves picks the even one.
TEST(Fp16, RoundsToNearestEven) {
  const float one = 1.0f, ulp = 1.0f / 1024.0f;
  EXPECT_EQ(F32ToF16(one + ulp / 2), 0x3C00);             // tie -> even (1.0)
  EXPECT_EQ(F32ToF16(one + 3 * ulp / 2), 0x3C02);         // tie -> even (1+2ulp)
  EXPECT_EQ(F32ToF16(one + ulp / 2 + ulp / 64), 0x3C01);  // above tie -> up
}

TEST(Bf16, RoundTripAndRounding) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = Bf16ToF32(static_cast<uint16_t>(b));
    if (!std::isnan(f)) EXPECT_EQ(F32ToBf16(f), b);
  }
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0.
  EXPECT_EQ(F32ToBf16(1.00390625f), 0x3F80);
  EXPECT_EQ(F32ToBf16(1.01171875f), 0x3F82);  // halfway 0x3F81/0x3F82 -> even
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
}  // namespace kvq
