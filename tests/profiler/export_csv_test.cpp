#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "profiler/report.h"
#include "tests/profiler/export_testutil.h"

namespace memfit {
namespace {

using exporttest::column;
using exporttest::parse_csv;
using exporttest::RecordingBuilder;
using exporttest::sample_report;

constexpr std::size_t kColumns = 9 + 2 * kCategoryCount + 3;

std::vector<std::string> header() {
  std::vector<std::string> want = {"time_ms", "event",       "size_bytes", "category", "tensor",
                                   "step",    "micro_batch", "phase",      "block"};
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    want.push_back(std::string(category_name(static_cast<Category>(c))) + "_bytes");
  }
  for (const char* s : {"allocated_bytes", "reserved_bytes"}) want.push_back(s);
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    want.push_back(std::string("host_") + category_name(static_cast<Category>(c)) + "_bytes");
  }
  want.push_back("host_pinned_bytes");
  return want;
}

TEST(TimelineCsv, HeaderNamesTheEventItsTensorWhereItHappenedAndTotalsInBytes) {
  const auto rows = parse_csv(timeline_csv(sample_report()));
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows[0], header());
  EXPECT_EQ(rows[0].size(), kColumns);
}

// Every row is one event, told apart by its event column: a free's two events (requested,
// completed) are two rows that say so, not two copies of one state.
TEST(TimelineCsv, OneRowPerEventNamedWithSizeCategoryAndTensor) {
  RecordingBuilder b;
  b.segment_alloc(0x10000, 4 << 20)
      .tag("wte")
      .alloc(0x10000, 1 << 20, Category::kParameter, "setup", "", RangeKind::kSetup)
      .begin_steps()
      .tag("h0.attn.qkv")
      .alloc(0x110000, 4096, Category::kActivation, "forward", "h0")
      .free(0x110000);
  ProfileReport r;
  r.recording = b.build();
  const std::int64_t t0 = r.recording.steps_begin_ns;
  r.recording.ranges.push_back({RangeKind::kStep, intern_name("step"), t0, t0 + 1'000'000, 1, 0});
  r.recording.ranges.push_back(
      {RangeKind::kMicroBatch, intern_name("micro_batch 3"), t0, t0 + 1'000'000, 1, 1});
  const auto rows = parse_csv(timeline_csv(r));
  ASSERT_EQ(rows.size(), 1u + 5u);
  const auto& h = rows[0];
  const std::size_t event = column(h, "event"), size = column(h, "size_bytes"),
                    cat = column(h, "category"), tensor = column(h, "tensor"),
                    step = column(h, "step"), mb = column(h, "micro_batch"),
                    phase = column(h, "phase"), block = column(h, "block");
  EXPECT_EQ(rows[1][event], "segment_alloc");
  EXPECT_EQ(rows[1][cat], "");  // a segment has no category
  EXPECT_EQ(rows[1][size], std::to_string(4 << 20));
  EXPECT_EQ(rows[2][event], "alloc");
  EXPECT_EQ(rows[2][tensor], "wte");
  EXPECT_EQ(rows[2][phase], "setup");
  EXPECT_EQ(rows[2][step], "");  // before the first step
  EXPECT_EQ(rows[3][event], "alloc");
  EXPECT_EQ(rows[3][tensor], "h0.attn.qkv");
  EXPECT_EQ(rows[3][cat], "activation");
  EXPECT_EQ(rows[3][phase], "forward");  // the phase's kind, never a step's or micro-batch's name
  EXPECT_EQ(rows[3][block], "h0");
  EXPECT_EQ(rows[3][step], "1");  // steps numbered in the order they ran
  EXPECT_EQ(rows[3][mb], "3");    // micro-batches by their names' number
  EXPECT_EQ(rows[4][event], "free_requested");
  EXPECT_EQ(rows[5][event], "free_completed");
  EXPECT_EQ(rows[4][size], "4096");
  const std::size_t act = column(h, "activation_bytes");
  EXPECT_EQ(rows[3][act], "4096");
  EXPECT_EQ(rows[4][act], "0");
  for (std::size_t i = 2; i < rows.size(); ++i) EXPECT_NE(rows[i], rows[i - 1]) << i;
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
  const auto& h = rows[0];
  const std::size_t act = column(h, "host_activation_bytes");
  const std::size_t grad = column(h, "host_gradient_bytes");
  const std::size_t opt = column(h, "host_optimizer_state_bytes");
  const std::size_t pinned = column(h, "host_pinned_bytes");
  const std::size_t event = column(h, "event"), phase = column(h, "phase");
  // Rows after the header: segment, parameter, 2 host, activation, 2 host.
  EXPECT_EQ(rows[3][event], "host_pin");
  EXPECT_EQ(rows[3][column(h, "category")], "optimizer_state");
  EXPECT_EQ(rows[3][column(h, "size_bytes")], "3000");
  EXPECT_EQ(rows[3][opt], "3000");
  EXPECT_EQ(rows[3][grad], "0");
  ASSERT_EQ(rows[4][grad], "1000");
  EXPECT_EQ(rows[4][pinned], "4000");
  EXPECT_EQ(rows[4][column(h, "allocated_bytes")], std::to_string(1 << 20));  // the device's
  EXPECT_EQ(rows[4][phase], "");                                              // a host row
  EXPECT_EQ(rows[5][phase], "forward");
  EXPECT_EQ(rows[5][pinned], "4000");  // a device row repeats the host's
  EXPECT_EQ(rows[6][act], "500");
  EXPECT_EQ(rows.back()[event], "host_unpin");
  EXPECT_EQ(rows.back()[grad], "0");
  EXPECT_EQ(rows.back()[pinned], "3500");
  double last = -1;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), kColumns);
    EXPECT_GE(std::stod(rows[i][0]), last);
    last = std::stod(rows[i][0]);
  }
}

TEST(TimelineCsv, CategoriesAddUpToAllocatedOnEveryRow) {
  const ProfileReport r = sample_report("h0");
  const Recording& rec = r.recording;
  const auto rows = parse_csv(timeline_csv(r));
  ASSERT_EQ(rows.size(), rec.events.size() + 1);
  const std::size_t first = column(rows[0], "parameter_bytes");
  const std::size_t allocated_col = column(rows[0], "allocated_bytes");
  const std::size_t reserved_col = column(rows[0], "reserved_bytes");
  double last_t = -1;
  std::size_t max_allocated = 0;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    const auto& row = rows[i];
    ASSERT_EQ(row.size(), kColumns) << "row " << i;
    const double t = std::stod(row[0]);
    EXPECT_GE(t, last_t);
    last_t = t;
    std::size_t sum = 0;
    for (std::size_t c = 0; c < kCategoryCount; ++c) sum += std::stoull(row[first + c]);
    const std::size_t allocated = std::stoull(row[allocated_col]);
    EXPECT_EQ(sum, allocated) << "row " << i;
    EXPECT_EQ(allocated, rec.events[i - 1].allocated);
    EXPECT_EQ(std::stoull(row[reserved_col]), rec.events[i - 1].reserved);
    max_allocated = std::max(max_allocated, allocated);
  }
  EXPECT_EQ(max_allocated, rec.peak.allocated);
  EXPECT_EQ(std::stoull(rows.back()[allocated_col]), rec.current_allocated);
}

TEST(TimelineCsv, NamesWithSeparatorsQuotesAndNewlinesRoundTrip) {
  const std::string block = "block, \"with\" a\nnewline";
  RecordingBuilder b;
  b.segment_alloc(0x10000, 1 << 20)
      .tag("t,\"q\"")
      .alloc(0x10000, 64, Category::kActivation, "forward", block);
  ProfileReport r;
  r.recording = b.build();
  const auto rows = parse_csv(timeline_csv(r));
  ASSERT_EQ(rows.size(), 3u);
  for (std::size_t i = 1; i < rows.size(); ++i) ASSERT_EQ(rows[i].size(), kColumns) << i;
  EXPECT_EQ(rows[2][column(rows[0], "block")], block);
  EXPECT_EQ(rows[2][column(rows[0], "tensor")], "t,\"q\"");
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
  const std::size_t param = column(rows[0], "parameter_bytes");
  const std::size_t act = column(rows[0], "activation_bytes");
  EXPECT_EQ(rows[1][param], "4096");
  EXPECT_EQ(rows[1][act], "8192");
  EXPECT_EQ(rows[2][act], "0");
  EXPECT_EQ(rows[3][param], "4096");
}

}  // namespace
}  // namespace memfit
