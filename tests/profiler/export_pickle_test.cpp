// snapshot_pickle(): read back by memfit's reader (keys, values, an "unknown" category, frames
// from phases and blocks) and, with /usr/bin/python3, by Python's pickle through
// tests/profiler/check_snapshot.py (memory_viz's layout and MemoryViz.js's rules; torch's
// _memory_viz functions when that torch reads the dict layout).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "memory/caching_allocator.h"
#include "memory/null_provider.h"
#include "memory/size.h"
#include "profiler/pickle.h"
#include "profiler/recorder.h"
#include "profiler/report.h"
#include "profiler/scoped_range.h"
#include "profiler/snapshot_import.h"

namespace memfit {
namespace {

// A Recording made by hand from the allocator's events (the Recorder's job, profiler/recorder.h),
// so this test needs nothing but the allocator: phases and blocks are set per event.
struct RecordedRun {
  ProfileReport report;
  std::size_t events = 0;
};

// extra: allocate and free that many more activations, for a large file.
RecordedRun make_run(int extra = 0) {
  NullProvider null;
  CachingAllocator alloc(null);
  RecordedRun run;
  Recording& rec = run.report.recording;
  std::uint32_t phase = 0, block = 0;
  const ListenerId listener = alloc.add_listener([&](const AllocatorEvent& e) {
    TimelineEvent t;
    t.time_ns = e.time_ns;
    t.kind = e.kind;
    t.category = e.category;
    t.stream = e.stream;
    t.addr = e.addr;
    t.size = e.size;
    t.tag = intern_name(e.tag);
    t.phase = phase;
    t.block = block;
    rec.events.push_back(t);
  });
  rec.start_ns = 1;
  phase = intern_name("forward");
  block = intern_name("h0");
  void* w = alloc.allocate_raw(3 * kMiB, Category::kParameter, kDefaultStream, "h0.attn.w");
  void* a = alloc.allocate_raw(5 * kMiB, Category::kActivation, kDefaultStream, "h0.attn.out");
  void* t = alloc.allocate_raw(1000, Category::kTemporary, 1, "scratch");
  phase = intern_name("backward");
  alloc.free(a);
  alloc.free(t);
  block = 0;
  void* g = alloc.allocate_raw(3 * kMiB, Category::kGradient, kDefaultStream, "h0.attn.w.grad");
  for (int i = 0; i < extra; ++i) {
    alloc.free(alloc.allocate_raw(4096 + 512 * std::size_t(i % 64), Category::kActivation,
                                  kDefaultStream, "h0.mlp." + std::to_string(i)));
  }
  alloc.empty_cache();
  run.report.snapshot = alloc.snapshot();
  run.report.stats = alloc.stats();
  run.report.config = alloc.config();
  rec.end_ns = rec.events.empty() ? 2 : rec.events.back().time_ns + 1000;
  run.events = rec.events.size();
  alloc.remove_listener(listener);
  alloc.free(w);
  alloc.free(g);
  return run;
}

TEST(ExportPickle, ReadsBackWithMemoryVizKeys) {
  const RecordedRun run = make_run();
  const std::string bytes = snapshot_pickle(run.report);
  ASSERT_GE(bytes.size(), 2u);
  EXPECT_EQ(bytes.substr(0, 2), std::string("\x80\x02"));  // protocol 2
  const PickleValue snap = read_pickle(bytes, "snapshot.pickle");
  for (const char* k : {"segments", "device_traces", "allocator_settings"}) {
    EXPECT_NE(snap.find(k), nullptr) << k;
  }
  const auto& segments = snap.find("segments")->items();
  ASSERT_EQ(segments.size(), run.report.snapshot.segments.size());
  ASSERT_FALSE(segments.empty());
  std::size_t reserved = 0;
  for (const PickleValue& s : segments) {
    for (const char* k : {"device", "address", "total_size", "allocated_size", "active_size",
                          "requested_size", "stream", "segment_type", "blocks", "frames"}) {
      EXPECT_NE(s.find(k), nullptr) << k;
    }
    reserved += static_cast<std::size_t>(s.find("total_size")->as_int());
    std::int64_t next = s.find("address")->as_int();
    for (const PickleValue& b : s.find("blocks")->items()) {
      EXPECT_EQ(b.find("address")->as_int(), next);  // blocks tile the segment
      next += b.find("size")->as_int();
      for (const char* k : {"requested_size", "state", "frames"}) EXPECT_NE(b.find(k), nullptr);
    }
  }
  EXPECT_EQ(static_cast<std::int64_t>(reserved), run.report.stats.reserved_bytes[kStatAll].current);

  const auto& traces = snap.find("device_traces")->items();
  ASSERT_EQ(traces.size(), 1u);
  const auto& trace = traces[0].items();
  ASSERT_EQ(trace.size(), run.events + 1);  // + the closing "snapshot" entry
  std::set<std::string> actions, categories, frame_names;
  for (const PickleValue& e : trace) {
    for (const char* k : {"action", "addr", "size", "stream", "time_us", "frames", "category"}) {
      EXPECT_NE(e.find(k), nullptr) << k;
    }
    actions.insert(e.find("action")->as_str());
    categories.insert(e.find("category")->as_str());
    for (const PickleValue& f : e.find("frames")->items()) {
      frame_names.insert(f.find("filename")->as_str() + ":" + f.find("name")->as_str());
    }
  }
  for (const char* a :
       {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "snapshot"}) {
    EXPECT_TRUE(actions.count(a)) << a;
  }
  EXPECT_TRUE(categories.count("unknown"));  // MemoryViz.js needs it whenever categories exist
  EXPECT_TRUE(categories.count("activation"));
  EXPECT_TRUE(frame_names.count("phase:forward"));
  EXPECT_TRUE(frame_names.count("phase:backward"));
  EXPECT_TRUE(frame_names.count("block:h0"));
  EXPECT_TRUE(frame_names.count("tensor:h0.attn.out"));
  // The stream of the temporary survives.
  bool stream1 = false;
  for (const PickleValue& e : trace) stream1 |= e.find("stream")->as_int() == 1;
  EXPECT_TRUE(stream1);
}

// The details users' tools read, as PyTorch 2.x writes them.
TEST(ExportPickle, AllocatorSettingsAndPoolsAsPyTorchWritesThem) {
  RecordedRun run = make_run();
  const PickleValue snap = read_pickle(snapshot_pickle(run.report), "snapshot.pickle");
  // Unset: -1, what every real PyTorch 2.x snapshot with allocator_settings carries.
  EXPECT_EQ(snap.find("allocator_settings")->find("max_split_size")->as_int(), -1);
  std::size_t persistent = 0, transient = 0;
  for (const PickleValue& s : snap.find("segments")->items()) {
    const PickleValue& pool = *s.find("segment_pool_id");
    ASSERT_EQ(pool.kind(), PickleValue::Kind::kTuple);
    ASSERT_EQ(pool.items().size(), 2u);
    EXPECT_EQ(pool.items()[0].as_int(), 0);
    bool has_gradient = false;
    for (const PickleValue& b : s.find("blocks")->items()) {
      has_gradient |= b.find("category")->as_str() == "gradient" &&
                      b.find("state")->as_str() == "active_allocated";
    }
    // The gradient lives in memfit's persistent pool (separate_persistent_pools is on).
    EXPECT_EQ(pool.items()[1].as_int(), has_gradient ? 1 : 0);
    (has_gradient ? persistent : transient) += 1;
  }
  EXPECT_EQ(persistent, 1u);
  EXPECT_GE(transient, 1u);

  run.report.config.max_split_size = 128 * kMiB;
  // The pool is the allocator's word (SegmentInfo::persistent), not a guess from the blocks:
  // a persistent segment with nothing live in it is still (0, 1).
  for (SegmentInfo& seg : run.report.snapshot.segments) seg.persistent = !seg.persistent;
  const PickleValue set = read_pickle(snapshot_pickle(run.report), "snapshot.pickle");
  EXPECT_EQ(set.find("allocator_settings")->find("max_split_size")->as_int(),
            std::int64_t{128} * std::int64_t(kMiB));
  const auto& segs = set.find("segments")->items();
  ASSERT_EQ(segs.size(), run.report.snapshot.segments.size());
  for (std::size_t i = 0; i < segs.size(); ++i) {
    EXPECT_EQ(segs[i].find("segment_pool_id")->items()[1].as_int(),
              run.report.snapshot.segments[i].persistent ? 1 : 0);
  }
}

// A large snapshot is protocol 4 with frames (as pickle.dump writes PyTorch's own), which
// memory_viz reads; a small one stays protocol 2.
TEST(ExportPickle, ALargeFileIsProtocol4WithFrames) {
  const RecordedRun run = make_run(2000);
  const std::string bytes = snapshot_pickle(run.report);
  ASSERT_GT(bytes.size(), std::size_t{64} << 10);
  EXPECT_EQ(bytes.substr(0, 3), std::string("\x80\x04\x95"));
  const PickleValue snap = read_pickle(bytes, "big.pickle");
  EXPECT_EQ(snap.find("device_traces")->items()[0].items().size(), run.events + 1);
  EXPECT_EQ(read_pickle(write_pickle(snap, {.protocol4_above = SIZE_MAX})), snap);
}

// time_us is Unix-epoch microseconds, as PyTorch writes it (memory_viz shows it as a date): the
// recording's wall-clock start plus each event's offset on the steady clock.
TEST(ExportPickle, TimesAreUnixEpochMicroseconds) {
  NullProvider null;
  CachingAllocator alloc(null);
  const auto now_us = [] {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  const std::int64_t before = now_us();
  Recorder rec(alloc);
  void* a = alloc.allocate_raw(kMiB, Category::kActivation, kDefaultStream, "x");
  alloc.free(a);
  rec.stop();
  const std::int64_t after = now_us();
  ProfileReport r = make_report(rec.recording(), alloc, "m", "cpu");
  const PickleValue snap = read_pickle(snapshot_pickle(r), "snapshot.pickle");
  const auto& trace = snap.find("device_traces")->items()[0].items();
  ASSERT_GE(trace.size(), 3u);
  std::int64_t last = 0;
  for (const PickleValue& e : trace) {
    const std::int64_t t = e.find("time_us")->as_int();
    // Within a millisecond: the recorder places its steady clock on the epoch once, and the
    // system clock read here can step or slew by microseconds against it (seen: 2 us).
    EXPECT_GE(t, before - 1000);
    EXPECT_LE(t, after + 1000);
    EXPECT_GE(t, last);  // in order
    last = t;
  }
}

TEST(ExportPickle, ImportsBackToTheRecordedLivePeak) {
  const RecordedRun run = make_run();
  const ImportedSnapshot s = import_snapshot(read_pickle(snapshot_pickle(run.report)), "x");
  EXPECT_EQ(s.num_allocs, 4u);
  EXPECT_EQ(s.num_frees, 2u);
  EXPECT_EQ(static_cast<std::int64_t>(s.segments.reserved_bytes),
            run.report.stats.reserved_bytes[kStatAll].current);
  // Live (block sizes, as memfit's events carry) peaks at w + a + t, all live at once.
  std::size_t peak = 0, live = 0;
  for (const TimelineEvent& e : run.report.recording.events) {
    if (e.kind == EventKind::kAlloc) live += e.size;
    if (e.kind == EventKind::kFreeCompleted) live -= e.size;
    peak = std::max(peak, live);
  }
  EXPECT_EQ(s.trace.validate().peak_live_bytes, peak);
}

TEST(ExportPickle, PythonReadsItAsMemoryVizDoes) {
  if (::access("/usr/bin/python3", X_OK) != 0) {
    GTEST_SKIP()
        << "/usr/bin/python3 not installed: the Python check of snapshot.pickle did not run";
  }
  // A small file (protocol 2) and a large one (protocol 4 with frames).
  for (int extra : {0, 2000}) {
    SCOPED_TRACE("extra " + std::to_string(extra));
    const std::string path = testing::TempDir() + "export_pickle_" + std::to_string(::getpid()) +
                             "_" + std::to_string(extra) + ".pickle";
    {
      std::ofstream f(path, std::ios::binary);
      f << snapshot_pickle(make_run(extra).report);
    }
    const std::string cmd = std::string("/usr/bin/python3 ") + MEMFIT_TEST_SOURCE_DIR +
                            "/tests/profiler/check_snapshot.py " + path + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    const int status = pclose(p);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("ok"), std::string::npos) << out;
    std::printf("%s", out.c_str());
    ::unlink(path.c_str());
  }
}

}  // namespace
}  // namespace memfit
