// Snapshot import: the committed fixture (a PyTorch 2.x-layout snapshot pickled by Python,
// scripts/make_snapshot_fixture.py) imports and replays to the figures that script prints,
// and data that is a valid pickle but no snapshot is refused naming the place.
#include "profiler/snapshot_import.h"

#include <gtest/gtest.h>

#include <string>

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
