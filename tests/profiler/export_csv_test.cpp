#include <gtest/gtest.h>

#include <string>

#include "profiler/report.h"
#include "tests/profiler/export_testutil.h"

namespace memfit {
namespace {

using exporttest::parse_csv;
using exporttest::RecordingBuilder;
using exporttest::sample_report;

constexpr std::size_t kColumns = 2 * kCategoryCount + 6;
constexpr std::size_t kHostCol = kCategoryCount + 3;  // host_<first category>
constexpr std::size_t kPhaseCol = 2 * kCategoryCount + 4;

TEST(TimelineCsv, HeaderHasTimeEveryCategoryTotalsHostPhaseAndBlock) {
  const auto rows = parse_csv(timeline_csv(sample_report()));
  ASSERT_FALSE(rows.empty());
  std::vector<std::string> want = {"time_ms"};
  for (std::size_t c = 0; c < kCategoryCount; ++c)
    want.push_back(category_name(static_cast<Category>(c)));
  for (const char* s : {"allocated", "reserved"}) want.push_back(s);
  for (std::size_t c = 0; c < kCategoryCount; ++c)
    want.push_back(std::string("host_") + category_name(static_cast<Category>(c)));
  for (const char* s : {"host_pinned", "phase", "block"}) want.push_back(s);
  EXPECT_EQ(rows[0], want);
  EXPECT_EQ(want.size(), kColumns);
}

TEST(TimelineCsv, HostRegionsAreRowsInTimeOrderBesideTheDevicesState) {
  RecordingBuilder b;
  b.segment_alloc(0x10000, 4 << 20)
      .alloc(0x10000, 1 << 20, Category::kParameter, "", "embedding")
      .host(Category::kOptimizerState, 3000)
      .host(Category::kGradient, 1000)
      .alloc(0x110000, 512 << 10, Category::kActivation, "forward", "h0")
      .host(Category::kActivation, 500)
      .host(Category::kGradient, 1000, false);
  ProfileReport r;
  r.recording = b.build();
  const auto rows = parse_csv(timeline_csv(r));
  ASSERT_EQ(rows.size(), 1 + r.recording.events.size() + 4);
  const std::size_t act = kHostCol + category_index(Category::kActivation);
  const std::size_t grad = kHostCol + category_index(Category::kGradient);
  const std::size_t opt = kHostCol + category_index(Category::kOptimizerState);
  // Rows after the header: segment, parameter, 2 host, activation, 2 host.
  EXPECT_EQ(rows[3][opt], "3000");
  EXPECT_EQ(rows[3][grad], "0");
  ASSERT_EQ(rows[4][grad], "1000");
  EXPECT_EQ(rows[4][kHostCol + kCategoryCount], "4000");            // host_pinned
  EXPECT_EQ(rows[4][kCategoryCount + 1], std::to_string(1 << 20));  // the device's allocated
  EXPECT_EQ(rows[4][kPhaseCol], "");                                // a host row: no phase
  EXPECT_EQ(rows[5][kPhaseCol], "forward");
  EXPECT_EQ(rows[5][kHostCol + kCategoryCount], "4000");  // a device row repeats the host's
  EXPECT_EQ(rows[6][act], "500");
  EXPECT_EQ(rows.back()[grad], "0");
  EXPECT_EQ(rows.back()[kHostCol + kCategoryCount], "3500");
  double last = -1;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), kColumns);
    EXPECT_GE(std::stod(rows[i][0]), last);
    last = std::stod(rows[i][0]);
  }
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
    ASSERT_EQ(row.size(), kColumns) << "row " << i;
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
    ASSERT_EQ(rows[i].size(), kColumns) << "row " << i;
    saw_block = saw_block || rows[i][kPhaseCol + 1] == block;
    saw_phase = saw_phase || rows[i][kPhaseCol] == "forward, \"quoted\"";
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
