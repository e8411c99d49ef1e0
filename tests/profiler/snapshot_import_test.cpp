// Snapshot import: the committed fixture (a PyTorch 2.x-layout snapshot pickled by Python,
// scripts/make_snapshot_fixture.py) imports and replays to the figures that script prints,
// and data that is a valid pickle but no snapshot is refused naming the place.
#include "profiler/snapshot_import.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/null_provider.h"
#include "memory/trace_replay.h"
#include "profiler/pickle.h"

namespace memfit {
namespace {

const std::string kFixture =
    std::string(MEMFIT_TEST_SOURCE_DIR) + "/tests/profiler/data/torch_snapshot.pickle";

TEST(SnapshotImport, FixtureGivesTheScriptsFigures) {
  const ImportedSnapshot s = import_snapshot(load_pickle_file(kFixture), kFixture);
  // Printed by `/usr/bin/python3 scripts/make_snapshot_fixture.py`.
  EXPECT_EQ(s.segments.num_segments, 2u);
  EXPECT_EQ(s.segments.reserved_bytes, 23068672u);
  EXPECT_EQ(s.segments.allocated_bytes, 8488960u);
  EXPECT_EQ(s.segments.active_bytes, 8689152u);
  EXPECT_EQ(s.segments.largest_segment_bytes, 20971520u);
  EXPECT_EQ(s.segments.trace_peak_reserved_bytes, 23068672u);
  EXPECT_EQ(s.segments.trace_start_reserved_bytes, 20971520u);
  EXPECT_EQ(s.num_entries, 20u);
  EXPECT_EQ(s.num_initially_live, 3u);
  EXPECT_EQ(s.num_allocs, 6u);
  EXPECT_EQ(s.num_frees, 6u);
  EXPECT_EQ(s.num_ooms, 1u);
  EXPECT_EQ(s.ignored_entries, 3u);  // segment_alloc, oom, snapshot
  EXPECT_FALSE(s.legacy);

  const TraceSummary sum = s.trace.validate();
  EXPECT_EQ(sum.peak_live_bytes, 13688608u);
  EXPECT_EQ(sum.persistent_bytes, 8488608u);  // end_live_bytes

  NullProvider null;
  CachingAllocator alloc(null);
  const ReplayResult r = replay(s.trace, alloc);
  EXPECT_EQ(r.peak_live_bytes, 13688608u);
  EXPECT_GE(r.peak_reserved_bytes, r.peak_live_bytes);
  EXPECT_GT(r.provider_allocs, 0);
  EXPECT_EQ(r.num_ooms, 0);
}

PickleValue entry(const char* action, std::int64_t addr, std::int64_t size) {
  return PickleValue::dict()
      .add("action", PickleValue::str(action))
      .add("addr", PickleValue::integer(addr))
      .add("size", PickleValue::integer(size))
      .add("stream", PickleValue::integer(0));
}

PickleValue snapshot_with(PickleValue trace) {
  return PickleValue::dict()
      .add("segments", PickleValue::list())
      .add("device_traces", PickleValue::list({std::move(trace)}));
}

TEST(SnapshotImport, FreeRequestedCountsOnlyWithoutACompletion) {
  PickleValue t = PickleValue::list();
  t.append(entry("alloc", 4096, 100));
  t.append(entry("free_requested", 4096, 100));
  t.append(entry("alloc", 8192, 50));  // while 4096 waits for its completion
  t.append(entry("free_completed", 4096, 100));
  t.append(entry("free_requested", 8192, 50));  // never completed: the free
  const ImportedSnapshot s = import_snapshot(snapshot_with(t), "t");
  const TraceSummary sum = s.trace.validate();
  EXPECT_EQ(sum.peak_live_bytes, 150u);  // 4096 still live when 8192 was allocated
  EXPECT_EQ(sum.persistent_bytes, 0u);
  EXPECT_EQ(s.num_frees, 2u);
}

std::vector<TraceOpKind> op_kinds(const AllocTrace& t) {
  std::vector<TraceOpKind> k;
  for (const TraceOp& op : t.ops) k.push_back(op.kind);
  return k;
}

constexpr std::int64_t kMiB = 1 << 20;

TEST(SnapshotImport, EachRunOfSegmentReleasesIsOneEmptyCache) {
  PickleValue t = PickleValue::list();
  t.append(entry("segment_alloc", 1 << 30, 30 * kMiB));
  t.append(entry("alloc", 1 << 30, 30 * kMiB));
  t.append(entry("free_completed", 1 << 30, 30 * kMiB));
  t.append(entry("segment_free", 1 << 30, 30 * kMiB));  // a run of two: one empty_cache
  t.append(entry("segment_free", std::int64_t{2} << 30, 2 * kMiB));
  t.append(entry("segment_alloc", std::int64_t{3} << 30, 40 * kMiB));
  t.append(entry("alloc", std::int64_t{3} << 30, 40 * kMiB));
  t.append(entry("free_completed", std::int64_t{3} << 30, 40 * kMiB));
  t.append(entry("segment_free", std::int64_t{3} << 30, 40 * kMiB));  // a run of one
  const ImportedSnapshot s = import_snapshot(snapshot_with(t), "t");
  using K = TraceOpKind;
  EXPECT_EQ(op_kinds(s.trace), (std::vector<K>{K::kAlloc, K::kFree, K::kEmptyCache, K::kAlloc,
                                               K::kFree, K::kEmptyCache}));
  EXPECT_EQ(s.num_empty_cache, 2u);
  EXPECT_EQ(s.num_segment_allocs, 2u);
  EXPECT_EQ(s.num_segment_frees, 3u);
  EXPECT_EQ(s.ignored_entries, 2u);  // the segment_allocs
  // PyTorch's reserved, walked back from nothing at the end: 2 MiB at the start (that segment
  // was there before the trace), 32 after the first segment_alloc, 40 at the peak.
  EXPECT_EQ(s.segments.trace_start_reserved_bytes, std::size_t(2 * kMiB));
  EXPECT_EQ(s.segments.trace_peak_reserved_bytes, std::size_t(40 * kMiB));

  // The release is reproduced: the 30 MiB segment is gone before the 40 MiB request (with
  // memfit's own early release off, only the trace's release can do that).
  AllocatorConfig conf;
  conf.release_before_growth = false;
  NullProvider null;
  CachingAllocator alloc(null, conf);
  const ReplayResult r = replay(s.trace, alloc);
  EXPECT_EQ(r.peak_reserved_bytes, std::size_t(40 * kMiB));
  EXPECT_EQ(r.end_reserved_bytes, 0u);
  AllocTrace without = s.trace;
  std::erase_if(without.ops, [](const TraceOp& op) { return op.kind == TraceOpKind::kEmptyCache; });
  NullProvider null2;
  CachingAllocator alloc2(null2, conf);
  EXPECT_EQ(replay(without, alloc2).peak_reserved_bytes, std::size_t(70 * kMiB));
}

TEST(SnapshotImport, ExpandableSegmentsMapAndUnmapCountAsReserved) {
  PickleValue t = PickleValue::list();
  t.append(entry("segment_map", 1 << 30, 20 * kMiB));
  t.append(entry("alloc", 1 << 30, 20 * kMiB));
  t.append(entry("segment_map", (1 << 30) + 20 * kMiB, 20 * kMiB));
  t.append(entry("free_completed", 1 << 30, 20 * kMiB));
  t.append(entry("segment_unmap", 1 << 30, 20 * kMiB));
  const ImportedSnapshot s = import_snapshot(snapshot_with(t), "t");
  EXPECT_EQ(s.num_segment_maps, 2u);
  EXPECT_EQ(s.num_segment_unmaps, 1u);
  EXPECT_EQ(s.num_empty_cache, 1u);
  // Ends with 20 MiB mapped (the file lists no segments, so the walk starts below zero and
  // is clamped: 0 -> 20 -> 40 -> 20).
  EXPECT_EQ(s.segments.trace_peak_reserved_bytes, std::size_t(40 * kMiB));
  // No allocator_settings: the map entries say the run was expandable.
  EXPECT_TRUE(s.recorded.expandable_segments);
  EXPECT_FALSE(s.recorded.has_settings);
  EXPECT_TRUE(replay_alloc_conf(s).expandable_segments);
}

TEST(SnapshotImport, TheRecordedSettingsSayWhetherPyTorchUsedExpandableSegments) {
  auto with_settings = [](bool expandable) {
    return snapshot_with(PickleValue::list({entry("alloc", 4096, 512)}))
        .add("allocator_settings",
             PickleValue::dict()
                 .add("PYTORCH_CUDA_ALLOC_CONF",
                      PickleValue::str(expandable ? "expandable_segments:True" : ""))
                 .add("max_split_size", PickleValue::integer(-1))
                 .add("expandable_segments", PickleValue::boolean(expandable)));
  };
  const ImportedSnapshot on = import_snapshot(with_settings(true), "on");
  EXPECT_TRUE(on.recorded.has_settings);
  EXPECT_EQ(on.recorded.alloc_conf, "expandable_segments:True");
  EXPECT_TRUE(on.recorded.expandable_segments);
  EXPECT_TRUE(replay_alloc_conf(on).expandable_segments);
  const ImportedSnapshot off = import_snapshot(with_settings(false), "off");
  EXPECT_FALSE(off.recorded.expandable_segments);
  EXPECT_EQ(replay_alloc_conf(off).to_string(), AllocatorConfig{}.to_string());
  // Without settings, a segment marked is_expandable says so.
  PickleValue seg = PickleValue::dict()
                        .add("device", PickleValue::integer(0))
                        .add("address", PickleValue::integer(1 << 20))
                        .add("total_size", PickleValue::integer(2 * kMiB))
                        .add("stream", PickleValue::integer(0))
                        .add("is_expandable", PickleValue::boolean(true))
                        .add("blocks", PickleValue::list());
  PickleValue snap = PickleValue::dict()
                         .add("segments", PickleValue::list({seg}))
                         .add("device_traces", PickleValue::list({PickleValue::list()}));
  EXPECT_TRUE(import_snapshot(snap, "seg").recorded.expandable_segments);
}

TEST(SnapshotImport, TracedDevicesListsTheBusyOnes) {
  PickleValue three =
      PickleValue::dict()
          .add("segments", PickleValue::list())
          .add("device_traces",
               PickleValue::list({PickleValue::list({entry("alloc", 1, 1)}), PickleValue::list(),
                                  PickleValue::list({entry("alloc", 1, 1)})}));
  EXPECT_EQ(traced_devices(three, "three"), (std::vector<int>{0, 2}));
  EXPECT_TRUE(traced_devices(PickleValue::list(), "legacy").empty());
  EXPECT_THROW(traced_devices(PickleValue::dict(), "bad"), InvalidArgument);
}

void expect_error(const PickleValue& v, const std::string& part) {
  try {
    import_snapshot(v, "bad.pickle");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.pickle"), std::string::npos) << msg;
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

TEST(SnapshotImport, DataThatIsNoSnapshotIsRefusedNamingThePlace) {
  expect_error(PickleValue::integer(3), "expected a dict, found int");
  expect_error(PickleValue::dict(), "no key 'segments'");
  expect_error(PickleValue::dict().add("segments", PickleValue::list()), "no key 'device_traces'");
  PickleValue t = PickleValue::list();
  t.append(entry("alloc", 1, 1));
  t.append(PickleValue::dict().add("action", PickleValue::str("alloc")));
  expect_error(snapshot_with(t), "device_traces[0][1]: no key 'addr'");
  PickleValue seg = PickleValue::dict()
                        .add("address", PickleValue::integer(0))
                        .add("total_size", PickleValue::str("big"));
  expect_error(PickleValue::dict()
                   .add("segments", PickleValue::list({seg}))
                   .add("device_traces", PickleValue::list()),
               "segments[0]['total_size']: expected int, found str");
  PickleValue two =
      PickleValue::dict()
          .add("segments", PickleValue::list())
          .add("device_traces", PickleValue::list({PickleValue::list({entry("alloc", 1, 1)}),
                                                   PickleValue::list({entry("alloc", 1, 1)})}));
  expect_error(two, "devices 0, 1");
  EXPECT_EQ(import_snapshot(two, "two", 1).device, 1);
}

TEST(SnapshotImport, LegacyListOfSegmentsReadsAsLiveBlocks) {
  PickleValue blocks = PickleValue::list();
  blocks.append(PickleValue::dict()
                    .add("size", PickleValue::integer(1024))
                    .add("state", PickleValue::str("active_allocated")));
  blocks.append(PickleValue::dict()
                    .add("size", PickleValue::integer(3072))
                    .add("state", PickleValue::str("inactive")));
  PickleValue seg = PickleValue::dict()
                        .add("address", PickleValue::integer(1 << 20))
                        .add("total_size", PickleValue::integer(4096))
                        .add("stream", PickleValue::integer(0))
                        .add("blocks", blocks);
  const ImportedSnapshot s = import_snapshot(PickleValue::list({seg}), "legacy");
  EXPECT_TRUE(s.legacy);
  EXPECT_EQ(s.segments.reserved_bytes, 4096u);
  EXPECT_EQ(s.num_initially_live, 1u);
  EXPECT_EQ(s.trace.validate().persistent_bytes, 1024u);
}

}  // namespace
}  // namespace memfit
