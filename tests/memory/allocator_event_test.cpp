// EventClock: cheap steady_clock readings for allocator events.
#include "memory/allocator_event.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace memfit {
namespace {

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TEST(EventClock, TracksSteadyClockAndNeverGoesBack) {
  EventClock clock;
  std::printf("EventClock %s\n", clock.uses_tsc() ? "reads the TSC" : "reads steady_clock");
  std::int64_t prev = clock.now_ns();
  const std::int64_t start = steady_ns();
  long readings = 0, checked = 0;
  // 30 ms: the rate is measured after 1 ms and refined every few ms since.
  while (steady_ns() - start < 30000000) {
    const std::int64_t before = steady_ns();
    const std::int64_t t = clock.now_ns();
    const std::int64_t after = steady_ns();
    ASSERT_GE(t, prev);
    prev = t;
    ++readings;
    if (before - start > 2000000) {
      // Interpolated readings stay within 0.2 ms of steady_clock (the tolerance is for a
      // descheduled thread and the rate's error over a few ms; a wrong scale is off by far
      // more).
      EXPECT_GE(t, before - 200000);
      EXPECT_LE(t, after + 200000);
      ++checked;
    }
  }
  EXPECT_GT(checked, 1000);
  EXPECT_GT(readings, checked);
}

}  // namespace
}  // namespace memfit
