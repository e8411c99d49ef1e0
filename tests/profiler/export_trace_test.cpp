#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "profiler/report.h"
#include "tests/profiler/export_testutil.h"

namespace memfit {
namespace {

using json = nlohmann::json;
using exporttest::sample_report;

std::vector<json> of_phase(const json& doc, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == ph) out.push_back(e);
  }
  return out;
}

TEST(TraceJson, EveryEventHasTheFieldsPerfettoNeeds) {
  const json doc = json::parse(trace_json(sample_report()));
  ASSERT_TRUE(doc["traceEvents"].is_array());
  EXPECT_EQ(doc["displayTimeUnit"], "ms");
  for (const json& e : doc["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("tid") && e.contains("name"))
        << e.dump();
    const std::string ph = e["ph"];
    EXPECT_TRUE(ph == "M" || ph == "X" || ph == "C" || ph == "i") << ph;
    if (ph != "M") EXPECT_TRUE(e["ts"].is_number()) << e.dump();
    if (ph == "X") EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
  }
}

TEST(TraceJson, MetadataNamesTheProcessAndEachThread) {
  const json doc = json::parse(trace_json(sample_report()));
  std::set<std::string> process_names;
  std::set<std::uint64_t> named_threads;
  for (const json& m : of_phase(doc, "M")) {
    if (m["name"] == "process_name") process_names.insert(m["args"]["name"].get<std::string>());
    if (m["name"] == "thread_name" && m["pid"] == 1)
      named_threads.insert(m["tid"].get<std::uint64_t>());
  }
  EXPECT_EQ(process_names, std::set<std::string>{"memfit gpt-test (cpu)"});
  for (const json& x : of_phase(doc, "X")) {
    EXPECT_EQ(named_threads.count(x["tid"].get<std::uint64_t>()), 1u) << x.dump();
  }
}

TEST(TraceJson, RangesAreCompleteEventsInMicroseconds) {
  const ProfileReport r = sample_report("h3");
  const Recording& rec = r.recording;
  const json doc = json::parse(trace_json(r));
  const std::vector<json> xs = of_phase(doc, "X");
  ASSERT_EQ(xs.size(), rec.ranges.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const RangeRecord& g = rec.ranges[i];
    EXPECT_EQ(xs[i]["name"], std::string(interned_name(g.name)));
    EXPECT_EQ(xs[i]["cat"], range_kind_name(g.kind));
    EXPECT_DOUBLE_EQ(xs[i]["ts"].get<double>(),
                     static_cast<double>(g.begin_ns - rec.start_ns) / 1e3);
    EXPECT_DOUBLE_EQ(xs[i]["dur"].get<double>(), static_cast<double>(g.end_ns - g.begin_ns) / 1e3);
    EXPECT_EQ(xs[i]["tid"].get<std::uint64_t>(), g.thread);
    // No bookkeeping args: viewers such as speedscope print them in every label.
    EXPECT_FALSE(xs[i].contains("args")) << xs[i];
  }
  EXPECT_EQ(xs[2]["name"], "h3");
  EXPECT_EQ(xs[2]["cat"], "block");
}

TEST(TraceJson, CountersFollowEachCategoryAndTheTotals) {
  const ProfileReport r = sample_report();
  const Recording& rec = r.recording;
  const json doc = json::parse(trace_json(r));
  std::map<std::string, std::size_t> last, max;
  double last_ts = -1e300;
  for (const json& c : of_phase(doc, "C")) {
    const std::string name = c["name"];
    const std::size_t v = c["args"]["bytes"];
    last[name] = v;
    max[name] = std::max(max[name], v);
    EXPECT_GE(c["ts"].get<double>(), last_ts);  // in time order
    last_ts = c["ts"].get<double>();
  }
  EXPECT_EQ(max["allocated"], rec.peak.allocated);
  EXPECT_EQ(max["reserved"], rec.peak_reserved);
  EXPECT_EQ(last["allocated"], rec.current_allocated);
  EXPECT_EQ(last["reserved"], rec.current_reserved);
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    const char* name = category_name(static_cast<Category>(c));
    ASSERT_EQ(last.count(name), 1u) << name;
    EXPECT_EQ(last[name], rec.current_by_category[c]) << name;
  }
  EXPECT_EQ(max["temporary"], std::size_t{256} << 10);
  // The first counters stand at time 0, the recording's start, so a viewer's time range opens
  // there (setup's allocations before the first range included).
  const std::vector<json> cs = of_phase(doc, "C");
  ASSERT_FALSE(cs.empty());
  EXPECT_EQ(cs.front()["ts"].get<double>(), 0.0);
}

TEST(TraceJson, GpuActivitiesGoOnTheirOwnProcessPerStream) {
  ProfileReport r = sample_report();
  const std::int64_t t = r.recording.start_ns + 2000;
  r.gpu.push_back({GpuActivityKind::kKernel, "gemm_kernel<bf16>", t, t + 5000, 7, 0, 0});
  r.gpu.push_back({GpuActivityKind::kMemcpy, "HtoD", t + 100, t + 900, 9, 4096, 0});
  r.gpu.push_back({GpuActivityKind::kMalloc, "", t + 50, t + 50, 7, 1 << 20, 0x7f0000});
  r.gpu_dropped = 4;
  const json doc = json::parse(trace_json(r));
  std::vector<json> gpu;
  std::set<std::uint64_t> gpu_threads;
  bool gpu_process = false;
  for (const json& e : doc["traceEvents"]) {
    if (e["pid"] != 2) continue;
    if (e["ph"] == "X") gpu.push_back(e);
    if (e["ph"] == "M" && e["name"] == "thread_name")
      gpu_threads.insert(e["tid"].get<std::uint64_t>());
    if (e["ph"] == "M" && e["name"] == "process_name") gpu_process = true;
  }
  EXPECT_TRUE(gpu_process);
  EXPECT_EQ(gpu_threads, (std::set<std::uint64_t>{7, 9}));
  ASSERT_EQ(gpu.size(), 3u);
  EXPECT_EQ(gpu[0]["name"], "gemm_kernel<bf16>");
  EXPECT_EQ(gpu[0]["tid"], 7);
  EXPECT_DOUBLE_EQ(gpu[0]["dur"].get<double>(), 5.0);
  EXPECT_EQ(gpu[1]["args"]["bytes"], 4096);
  EXPECT_EQ(gpu[2]["name"], "malloc");
  EXPECT_EQ(gpu[2]["args"]["address"], "0x7f0000");
  EXPECT_EQ(doc["otherData"]["dropped_gpu_records"], 4);
}

TEST(TraceJson, AnOomIsAnInstantEvent) {
  exporttest::RecordingBuilder b;
  b.segment_alloc(0x1000, 1 << 20).alloc(0x1000, 4096, Category::kActivation, "forward", "h1");
  ProfileReport r;
  r.recording = b.build();
  TimelineEvent oom = r.recording.events.back();
  oom.kind = EventKind::kOom;
  oom.size = std::size_t{1} << 40;
  r.recording.events.push_back(oom);
  const json doc = json::parse(trace_json(r));
  const std::vector<json> is = of_phase(doc, "i");
  ASSERT_EQ(is.size(), 1u);
  EXPECT_EQ(is[0]["args"]["requested_bytes"].get<std::size_t>(), std::size_t{1} << 40);
  EXPECT_EQ(is[0]["args"]["block"], "h1");
}

// Offload's pinned host memory is one counter whose series are the categories.
TEST(TraceJson, PinnedHostIsACounterWithASeriesPerCategory) {
  exporttest::RecordingBuilder b;
  b.segment_alloc(0x10000, 1 << 20)
      .host(Category::kOptimizerState, 3000)
      .host(Category::kGradient, 1000)
      .host(Category::kGradient, 1000, false);
  ProfileReport r;
  r.recording = b.build();
  const json doc = json::parse(trace_json(r));
  std::vector<json> host;
  for (const json& c : of_phase(doc, "C")) {
    if (c["name"] == "pinned host") host.push_back(c);
  }
  ASSERT_EQ(host.size(), 4u);   // the start, then each change
  for (const json& h : host) {  // every series in every sample: the categories ever used
    EXPECT_EQ(h["args"].size(), 2u) << h;
  }
  EXPECT_EQ(host[0]["args"]["gradient"], 0);
  EXPECT_EQ(host[0]["args"]["optimizer_state"], 0);
  EXPECT_EQ(host[2]["args"]["gradient"], 1000);
  EXPECT_EQ(host[2]["args"]["optimizer_state"], 3000);
  EXPECT_EQ(host[3]["args"]["gradient"], 0);  // gone: an explicit 0, not a missing key
  EXPECT_EQ(host[3]["args"]["optimizer_state"], 3000);
  EXPECT_GT(host[3]["ts"].get<double>(), host[1]["ts"].get<double>());
  for (const json& c : of_phase(json::parse(trace_json(sample_report())), "C")) {
    EXPECT_NE(c["name"], "pinned host");  // no offload, no host counter
  }
}

// With the oldest events dropped, the starting state held only from the first kept event: the
// counters start there, and an instant event marks time 0 so viewers still open at the start.
TEST(TraceJson, WithDroppedEventsTheCountersStartAtTheFirstKeptOne) {
  ProfileReport r = sample_report();
  Recording& rec = r.recording;
  const std::int64_t first = rec.events.front().time_ns;
  rec.dropped_events = 3;
  const json doc = json::parse(trace_json(r));
  const std::vector<json> cs = of_phase(doc, "C");
  ASSERT_FALSE(cs.empty());
  EXPECT_DOUBLE_EQ(cs.front()["ts"].get<double>(), static_cast<double>(first - rec.start_ns) / 1e3);
  EXPECT_GT(cs.front()["ts"].get<double>(), 0.0);
  bool start_mark = false;
  for (const json& i : of_phase(doc, "i")) start_mark |= i["ts"].get<double>() == 0.0;
  EXPECT_TRUE(start_mark);
  // Nothing dropped: no mark, the counters themselves stand at 0.
  rec.dropped_events = 0;
  const json whole = json::parse(trace_json(r));
  EXPECT_TRUE(of_phase(whole, "i").empty());
  EXPECT_EQ(of_phase(whole, "C").front()["ts"].get<double>(), 0.0);
}

}  // namespace
}  // namespace memfit
