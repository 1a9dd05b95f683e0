#include "base/time_left.h"

#include <gtest/gtest.h>

namespace kvq {
namespace {

TEST(TimeLeft, UnknownUntilAStepTakesTime) {
  TimeLeft t;
  EXPECT_FALSE(t.Seconds(10).has_value());
  t.Observe(5.0, 1);
  EXPECT_FALSE(t.Seconds(10).has_value());  // the first report has no step before it
  t.Observe(7.0, 2);
  ASSERT_TRUE(t.Seconds(10).has_value());
  EXPECT_DOUBLE_EQ(*t.Seconds(10), 8 * 2.0);
}

TEST(TimeLeft, ReplayedItemsDoNotCountAsWork) {
  TimeLeft t;
  t.Observe(0.0, 0);
  t.Observe(0.0001, 25);  // a resumed cell's recorded trials, all at once
  t.Observe(0.0002, 50);
  t.Observe(100.0002, 51);  // one real trial: 100 s
  t.Observe(100.0003, 56);  // the next cell's recorded trials
  t.Observe(300.0003, 58);  // two real trials: 200 s
  ASSERT_TRUE(t.Seconds(100).has_value());
  EXPECT_NEAR(*t.Seconds(100), 42 * 100.0, 1e-6);
  EXPECT_DOUBLE_EQ(*t.Seconds(58), 0.0);
  EXPECT_DOUBLE_EQ(*t.Seconds(40), 0.0);  // past the total: nothing left, never negative
}

TEST(TimeLeft, StepsThatAddNothingOnlyMoveTheClock) {
  TimeLeft t;
  t.Observe(0.0, 3);
  t.Observe(50.0, 3);  // a report with no new item (a stage line repeated)
  t.Observe(60.0, 4);  // this item took 10 s since the last report, not 60
  EXPECT_DOUBLE_EQ(*t.Seconds(6), 2 * 10.0);
}

TEST(TimeLeft, ALowerCountStartsOver) {
  TimeLeft t;
  t.Observe(0.0, 0);
  t.Observe(1.0, 10);
  t.Observe(2.0, 0);  // the next scheme's count
  EXPECT_FALSE(t.Seconds(10).has_value());
  t.Observe(12.0, 1);
  EXPECT_DOUBLE_EQ(*t.Seconds(10), 9 * 10.0);
}

TEST(FormatDuration, Units) {
  EXPECT_EQ(FormatDuration(0), "0 s");
  EXPECT_EQ(FormatDuration(59.4), "59 s");
  EXPECT_EQ(FormatDuration(60), "1 min");
  EXPECT_EQ(FormatDuration(3599), "60 min");
  EXPECT_EQ(FormatDuration(3600), "1 h 00 min");
  EXPECT_EQ(FormatDuration(5 * 3600 + 7 * 60 + 10), "5 h 07 min");
  EXPECT_EQ(FormatDuration(-1), "?");
  EXPECT_EQ(FormatDuration(1.0 / 0.0), "?");
}

}  // namespace
}  // namespace kvq
