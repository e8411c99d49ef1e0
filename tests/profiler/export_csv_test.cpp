#include <gtest/gtest.h>

#include <string>

#include "profiler/report.h"
#include "tests/profiler/export_testutil.h"

namespace memfit {
namespace {

using exporttest::parse_csv;
using exporttest::RecordingBuilder;
using exporttest::sample_report;

TEST(TimelineCsv, HeaderHasTimeEveryCategoryTotalsPhaseAndBlock) {
  const auto rows = parse_csv(timeline_csv(sample_report()));
  ASSERT_FALSE(rows.empty());
  std::vector<std::string> want = {"time_ms"};
  for (std::size_t c = 0; c < kCategoryCount; ++c)
    want.push_back(category_name(static_cast<Category>(c)));
  for (const char* s : {"allocated", "reserved", "phase", "block"}) want.push_back(s);
  EXPECT_EQ(rows[0], want);
}

TEST(TimelineCsv, OneRowPerEventWhoseCategoriesAddUpToAllocated) {
  const ProfileReport r = sample_report("h0");
  const Recording& rec = r.recording;
  const auto rows = parse_csv(timeline_csv(r));
  ASSERT_EQ(rows.size(), rec.events.size() + 1);
  double last_t = -1;
  std::size_t max_allocated = 0;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    const auto& row = rows[i];
    ASSERT_EQ(row.size(), kCategoryCount + 5) << "row " << i;
    const double t = std::stod(row[0]);
    EXPECT_GE(t, last_t);
    last_t = t;
    std::size_t sum = 0;
    for (std::size_t c = 0; c < kCategoryCount; ++c) sum += std::stoull(row[1 + c]);
    const std::size_t allocated = std::stoull(row[kCategoryCount + 1]);
    EXPECT_EQ(sum, allocated) << "row " << i;
    EXPECT_EQ(allocated, rec.events[i - 1].allocated);
    EXPECT_EQ(std::stoull(row[kCategoryCount + 2]), rec.events[i - 1].reserved);
    max_allocated = std::max(max_allocated, allocated);
  }
  EXPECT_EQ(max_allocated, rec.peak.allocated);
  // The last row is the state at the end.
  EXPECT_EQ(std::stoull(rows.back()[kCategoryCount + 1]), rec.current_allocated);
}

TEST(TimelineCsv, NamesWithSeparatorsQuotesAndNewlinesRoundTrip) {
  const std::string block = "block, \"with\" a\nnewline";
  const ProfileReport r = sample_report(block);
  const auto rows = parse_csv(timeline_csv(r));
  bool saw_block = false, saw_phase = false;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), kCategoryCount + 5) << "row " << i;
    saw_block = saw_block || rows[i][kCategoryCount + 4] == block;
    saw_phase = saw_phase || rows[i][kCategoryCount + 3] == "forward, \"quoted\"";
  }
  EXPECT_TRUE(saw_block);
  EXPECT_TRUE(saw_phase);
}

TEST(TimelineCsv, StartsFromTheBaseWhenEarlyEventsWereDropped) {
  Recording rec = RecordingBuilder()
                      .segment_alloc(0x1000, 1 << 20)
                      .alloc(0x1000, 4096, Category::kParameter)
                      .alloc(0x2000, 8192, Category::kActivation)
                      .free(0x2000)
                      .build();
  // Drop the first two events as the Recorder's ring would: fold them into the base.
  rec.base_by_category[category_index(Category::kParameter)] = 4096;
  rec.base_allocated = 4096;
  rec.base_reserved = 1 << 20;
  rec.events.erase(rec.events.begin(), rec.events.begin() + 2);
  rec.dropped_events = 2;
  ProfileReport r;
  r.recording = rec;
  const auto rows = parse_csv(timeline_csv(r));
  ASSERT_EQ(rows.size(), 4u);
  const std::size_t param = 1 + category_index(Category::kParameter);
  const std::size_t act = 1 + category_index(Category::kActivation);
  EXPECT_EQ(rows[1][param], "4096");
  EXPECT_EQ(rows[1][act], "8192");
  EXPECT_EQ(rows[2][act], "0");
  EXPECT_EQ(rows[3][param], "4096");
}

}  // namespace
}  // namespace memfit
