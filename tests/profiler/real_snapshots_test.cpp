// Real PyTorch snapshots: every file in ../shared/real-snapshots/ (beside the repository; see
// its README: other people's torch.cuda.memory._dump_snapshot() files, never copied into the
// repository) reads, imports and replays on every device with a trace. The folder is not part
// of the repository: where it is absent (a CI machine may not have it) the test says so and
// skips; where it is there, every file must pass.
//
// What it checks per file and device: the safe reader's walk bound holds with a margin (the
// ratios are printed); the import is a valid trace; PyTorch's own reserved peak, walked from
// the trace's segment events, is at least what was live; the replay under the settings
// `memfit replay` would choose runs every allocation without an OOM; and the replay under
// PyTorch's own rules (memfit's two departures off, expandable segments as recorded) reserves
// no more than 1.10x what PyTorch did on every trace that records segments, and memfit's
// pick (the better of its two modes, expandable segments on and off, as `memfit replay`
// names it) no more than PyTorch did (the table of memfit's figures beside PyTorch's is
// bench/real_snapshot_bench).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/null_provider.h"
#include "memory/trace_replay.h"
#include "profiler/pickle.h"
#include "profiler/snapshot_import.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

const fs::path kFolder = fs::path(MEMFIT_TEST_SOURCE_DIR) / ".." / "shared" / "real-snapshots";

std::vector<fs::path> snapshot_files() {
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(kFolder)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && ext != ".md" && ext != ".tsv") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(RealSnapshots, EveryFileImportsAndReplaysOnEveryDevice) {
  if (!fs::is_directory(kFolder)) {
    GTEST_SKIP() << kFolder.string()
                 << " is absent: the real PyTorch snapshots are kept beside the repository, not "
                    "in it, and this machine does not have them (CI may not); nothing checked";
  }
  const std::vector<fs::path> files = snapshot_files();
  ASSERT_FALSE(files.empty()) << kFolder.string() << " holds no snapshot";
  const PickleLimits limits;
  double worst_places = 0, worst_bytes = 0;
  std::size_t traces_with_segments = 0;
  for (const fs::path& file : files) {
    SCOPED_TRACE(file.filename().string());
    PickleReadStats stats;
    PickleValue snap;
    ASSERT_NO_THROW(snap = load_pickle_file(file.string(), limits, &stats));
    const double places = double(stats.places) / double(stats.input_bytes);
    const double bytes = double(stats.walk_string_bytes) / double(stats.input_bytes);
    worst_places = std::max(worst_places, places);
    worst_bytes = std::max(worst_bytes, bytes);
    // The reader holds each distinct value once: at most one per input byte.
    EXPECT_LE(stats.distinct_values, stats.input_bytes);
    // A margin of at least 4x under the walk bound.
    EXPECT_LE(places * 4, double(limits.elements_per_byte));
    EXPECT_LE(bytes * 4, double(limits.string_bytes_per_byte));

    std::vector<int> devices = traced_devices(snap, file.string());
    if (devices.empty()) devices.push_back(-1);  // legacy, or no trace: the segments alone
    for (int device : devices) {
      SCOPED_TRACE("device " + std::to_string(device));
      ImportedSnapshot s;
      ASSERT_NO_THROW(s = import_snapshot(snap, file.string(), device));
      const TraceSummary sum = s.trace.validate();
      EXPECT_EQ(sum.num_allocs, s.num_allocs + s.num_initially_live);
      EXPECT_EQ(s.num_empty_cache > 0, s.num_segment_frees + s.num_segment_unmaps > 0);
      const std::size_t pytorch_peak = s.segments.trace_peak_reserved_bytes;
      if (pytorch_peak > 0) {
        ++traces_with_segments;
        EXPECT_GE(pytorch_peak, s.segments.reserved_bytes);
      }

      NullProvider null;
      CachingAllocator alloc(null, replay_alloc_conf(s));
      const ReplayResult r = replay(s.trace, alloc);
      EXPECT_EQ(r.num_ooms, 0);
      EXPECT_EQ(r.num_allocs, sum.num_allocs);
      EXPECT_EQ(r.peak_live_bytes, sum.peak_live_bytes);
      EXPECT_GE(r.peak_reserved_bytes, r.peak_live_bytes);
      // PyTorch held at least what was live (its blocks are the requests rounded up).
      if (pytorch_peak > 0) EXPECT_GE(pytorch_peak, r.peak_live_bytes);

      AllocatorConfig pytorch_rules = replay_alloc_conf(s);
      pytorch_rules.separate_persistent_pools = false;
      pytorch_rules.release_before_growth = false;
      NullProvider null2;
      CachingAllocator same_rules(null2, pytorch_rules);
      const ReplayResult p = replay(s.trace, same_rules);
      // memfit's pick (memfit replay's, the better of its two allocator modes, as the planner
      // weighs them): at or below what PyTorch reserved, on every trace.
      AllocatorConfig other = replay_alloc_conf(s);
      other.expandable_segments = !other.expandable_segments;
      NullProvider null3;
      CachingAllocator other_alloc(null3, other);
      const ReplayResult o = replay(s.trace, other_alloc);
      const std::size_t pick = std::min(r.peak_reserved_bytes, o.peak_reserved_bytes);
      if (pytorch_peak > 0) {
        EXPECT_LE(pick, pytorch_peak) << "memfit's better mode reserved more than PyTorch did";
      }
      if (pytorch_peak > 0) {
        EXPECT_LE(double(p.peak_reserved_bytes), 1.10 * double(pytorch_peak))
            << "under PyTorch's rules (" << pytorch_rules.to_string() << ") memfit reserved "
            << p.peak_reserved_bytes << " bytes against PyTorch's " << pytorch_peak;
      }
      std::printf("%-72s dev %2d  PyTorch %14zu  memfit %14zu (%.3f)  same rules %.3f\n",
                  file.filename().string().c_str(), std::max(device, 0), pytorch_peak,
                  r.peak_reserved_bytes,
                  pytorch_peak ? double(r.peak_reserved_bytes) / double(pytorch_peak) : 0.0,
                  pytorch_peak ? double(p.peak_reserved_bytes) / double(pytorch_peak) : 0.0);
    }
  }
  EXPECT_GT(traces_with_segments, 0u);
  std::printf(
      "walk bound: worst %.2f values and %.2f string bytes per input byte (limits %zu, %zu)\n",
      worst_places, worst_bytes, limits.elements_per_byte, limits.string_bytes_per_byte);
}

}  // namespace
}  // namespace memfit
