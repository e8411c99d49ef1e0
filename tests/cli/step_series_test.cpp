// StepSeries: every step's value on short runs; bounded memory and an honest stride on long ones.
#include "cli/step_series.h"

#include <gtest/gtest.h>

namespace memfit::cli {
namespace {

TEST(StepSeries, KeepsEveryStepUntilFullThenEveryStrideTh) {
  StepSeries s;
  for (int i = 0; i < 1000; ++i) s.add(i);
  EXPECT_EQ(s.stride(), 1);
  ASSERT_EQ(s.kept().size(), 1000u);
  EXPECT_EQ(s.kept()[999], 999);

  StepSeries big;
  const std::int64_t n = 5 * static_cast<std::int64_t>(StepSeries::kMaxKept) + 3;
  for (std::int64_t i = 0; i < n; ++i) big.add(static_cast<double>(i));
  EXPECT_LE(big.kept().size(), StepSeries::kMaxKept);
  EXPECT_EQ(big.stride(), 8);  // 5 * kMax steps fit at stride 8, not at 4
  for (std::size_t k = 0; k < big.kept().size(); ++k) {
    ASSERT_EQ(big.kept()[k], static_cast<double>(k) * 8) << k;  // kept value k is step k*stride
  }
  EXPECT_EQ(big.kept().size(), static_cast<std::size_t>((n - 1) / 8 + 1));
  EXPECT_EQ(big.first(), 0);
  EXPECT_EQ(big.last(), static_cast<double>(n - 1));
}

TEST(StepSeries, SteadyStepSecondsIsTheMedianAfterTheFirst) {
  StepSeries s;
  EXPECT_EQ(steady_step_seconds(s), 0);
  s.add(9.0);  // the warm-up step is left out
  EXPECT_EQ(steady_step_seconds(s), 0);
  s.add(3.0);
  EXPECT_EQ(steady_step_seconds(s), 3.0);
  s.add(1.0);
  EXPECT_EQ(steady_step_seconds(s), 2.0);  // even count: the mean of the middle two
  s.add(2.0);
  EXPECT_EQ(steady_step_seconds(s), 2.0);
}

}  // namespace
}  // namespace memfit::cli
