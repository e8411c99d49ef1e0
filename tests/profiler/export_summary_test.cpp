#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "profiler/report.h"
#include "tests/profiler/export_testutil.h"

namespace memfit {
namespace {

using json = nlohmann::json;
using exporttest::sample_report;

TEST(SummaryJson, PeaksCategoriesPhaseAndBlockComeFromTheRecording) {
  const ProfileReport r = sample_report("h0");
  const Recording& rec = r.recording;
  const json j = json::parse(summary_json(r));
  EXPECT_EQ(j["model"], "gpt-test");
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["steps"], 1);
  EXPECT_EQ(j["peak_allocated_bytes"].get<std::size_t>(), rec.peak.allocated);
  EXPECT_EQ(j["peak_reserved_bytes"].get<std::size_t>(), rec.peak_reserved);
  // The sample peaks with the temporary in block h0 live: 1 MiB + 512 KiB + 1 MiB + 256 KiB.
  EXPECT_EQ(rec.peak.allocated, std::size_t{(2 << 20) + (768 << 10)});
  const json& peak = j["peak"];
  std::size_t sum = 0;
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    const char* name = category_name(static_cast<Category>(c));
    EXPECT_EQ(peak["by_category"][name].get<std::size_t>(), rec.peak.by_category[c]) << name;
    sum += peak["by_category"][name].get<std::size_t>();
  }
  EXPECT_EQ(sum, rec.peak.allocated);
  EXPECT_EQ(peak["phase"], "forward, \"quoted\"");
  EXPECT_EQ(peak["block"], "h0");
  ASSERT_EQ(peak["top_blocks"].size(), 3u);  // h0, embedding, outside any block
  EXPECT_EQ(peak["top_blocks"][0]["block"], "h0");
  EXPECT_EQ(peak["top_blocks"][0]["bytes"].get<std::size_t>(),
            std::size_t{(1 << 20) + (256 << 10)});
  for (std::size_t i = 1; i < peak["top_blocks"].size(); ++i) {
    EXPECT_GE(peak["top_blocks"][i - 1]["bytes"].get<std::size_t>(),
              peak["top_blocks"][i]["bytes"].get<std::size_t>());
  }
  EXPECT_GT(peak["time_ms"].get<double>(), 0.0);
  EXPECT_EQ(j["end"]["allocated_bytes"].get<std::size_t>(), rec.current_allocated);
}

TEST(SummaryJson, StatsDroppedCountsAndTheSeeMemoryUsageLine) {
  ProfileReport r = sample_report();
  r.recording.dropped_events = 17;
  r.recording.dropped_ranges = 3;
  r.gpu_dropped = 5;
  r.stats.num_ooms = 2;
  const json j = json::parse(summary_json(r));
  EXPECT_EQ(j["dropped"]["events"], 17);
  EXPECT_EQ(j["dropped"]["ranges"], 3);
  EXPECT_EQ(j["dropped"]["gpu_records"], 5);
  EXPECT_EQ(j["events_kept"].get<std::size_t>(), r.recording.events.size());
  using StatMap = std::map<std::string, std::int64_t>;
  EXPECT_EQ(j["allocator_stats"].get<StatMap>(), r.stats.as_map());
  EXPECT_EQ(j["allocator_stats"]["num_ooms"], 2);
  EXPECT_EQ(j["see_memory_usage"], see_memory_usage_line(r.stats));
  EXPECT_EQ(j["alloc_conf"], r.config.to_string());
  EXPECT_FALSE(j.contains("device_total_bytes"));  // unknown on the CPU
  r.device_total_bytes = std::size_t{80} << 30;
  EXPECT_EQ(json::parse(summary_json(r))["device_total_bytes"].get<std::size_t>(),
            r.device_total_bytes);
}

TEST(SummaryJson, PlanVersusMeasuredOnlyWhenAPlanWasGiven) {
  ProfileReport r = sample_report();
  EXPECT_FALSE(json::parse(summary_json(r)).contains("plan"));
  r.plan.present = true;
  r.plan.description = "bf16, checkpoint every:2";
  r.plan.predicted_peak_reserved = 2 * r.recording.peak_reserved;
  r.plan.predicted_peak_allocated = 0;  // unknown: no ratio
  const json p = json::parse(summary_json(r))["plan"];
  EXPECT_EQ(p["description"], "bf16, checkpoint every:2");
  EXPECT_EQ(p["measured_peak_reserved_bytes"].get<std::size_t>(), r.recording.peak_reserved);
  EXPECT_EQ(p["predicted_peak_reserved_bytes"].get<std::size_t>(), 2 * r.recording.peak_reserved);
  EXPECT_DOUBLE_EQ(p["reserved_ratio"].get<double>(), 0.5);
  EXPECT_TRUE(p["allocated_ratio"].is_null());
}

TEST(SummaryJson, InvalidUtf8InANameStillGivesValidJson) {
  ProfileReport r = sample_report(std::string("bad\xff\xfe") + "name");
  json j;
  EXPECT_NO_THROW(j = json::parse(summary_json(r)));
  EXPECT_TRUE(j["peak"]["block"].is_string());
}

// Offload's pinned host regions: the peak, when, by category, and what is left at the end.
TEST(SummaryJson, PinnedHostPeakAndEndByCategory) {
  exporttest::RecordingBuilder b;
  b.segment_alloc(0x10000, 1 << 20)
      .host(Category::kOptimizerState, 3000)
      .host(Category::kActivation, 700)
      .host(Category::kActivation, 700, false);
  ProfileReport r;
  r.recording = b.build();
  r.plan.present = true;
  r.plan.predicted_host_pinned = 3700;
  const json j = json::parse(summary_json(r));
  const json& h = j["host_pinned"];
  EXPECT_EQ(h["peak_bytes"].get<std::size_t>(), 3700u);
  EXPECT_EQ(h["peak_by_category"]["optimizer_state"].get<std::size_t>(), 3000u);
  EXPECT_EQ(h["peak_by_category"]["activation"].get<std::size_t>(), 700u);
  EXPECT_EQ(h["end_bytes"].get<std::size_t>(), 3000u);
  EXPECT_EQ(h["end_by_category"]["activation"].get<std::size_t>(), 0u);
  EXPECT_GT(h["peak_time_ms"].get<double>(), 0.0);
  EXPECT_EQ(j["plan"]["predicted_host_pinned_bytes"].get<std::size_t>(), 3700u);
  EXPECT_EQ(j["plan"]["measured_host_pinned_bytes"].get<std::size_t>(), 3700u);
}

// The headline is the steps' peak (what a plan predicts and `memfit train` prints); the whole
// run's, setup included, is its own labelled object; plan vs measured is on the steps'.
TEST(SummaryJson, TheStepsPeakIsTheHeadlineAndTheWholeRunsIsLabelled) {
  ProfileReport r = exporttest::setup_spike_report();
  const Recording& rec = r.recording;
  ASSERT_GT(rec.peak.allocated, rec.steps_peak().allocated);  // the sample's premise
  r.plan.present = true;
  r.plan.predicted_peak_allocated = rec.steps_peak().allocated;
  r.plan.predicted_peak_reserved = rec.steps_peak_reserved();
  const json j = json::parse(summary_json(r));
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["peak_allocated_bytes"].get<std::size_t>(), std::size_t{(3 << 20)});
  EXPECT_EQ(j["peak"]["of"], "steps");
  EXPECT_EQ(j["peak"]["phase"], "forward");
  EXPECT_EQ(j["peak"]["block"], "h1");
  EXPECT_EQ(j["run_peak"]["allocated_bytes"].get<std::size_t>(), std::size_t{(11 << 19)});
  EXPECT_EQ(j["run_peak"]["phase"], "setup");
  EXPECT_EQ(j["run_peak"]["reserved_bytes"].get<std::size_t>(), rec.peak_reserved);
  EXPECT_DOUBLE_EQ(j["plan"]["allocated_ratio"].get<double>(), 1.0);
  EXPECT_EQ(j["plan"]["measured_peak_allocated_bytes"].get<std::size_t>(), std::size_t{3 << 20});
  // Without step ranges (a hand-made recording, or a Recorder around anything else) the
  // headline is the whole run's, and says so.
  const json plain = json::parse(summary_json(sample_report()));
  EXPECT_EQ(plain["peak"]["of"], "whole run (no step range recorded)");
  EXPECT_EQ(plain["peak_allocated_bytes"], plain["run_peak"]["allocated_bytes"]);
}

}  // namespace
}  // namespace memfit
