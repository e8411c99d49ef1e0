// Real PyTorch snapshots replayed through memfit's allocator, beside PyTorch's own figures.
//
//   build/bench/real_snapshot_bench [folder]     # default: ../shared/real-snapshots
//
// Per file and device with a trace: PyTorch's reserved peak over the trace (walked from its
// segment_alloc/map and segment_free/unmap entries: the anchor), memfit's replayed reserved
// peak under the settings `memfit replay` chooses by default (memfit's defaults; expandable
// segments when PyTorch's run used them), under expandable_segments:True, under segments
// (expandable_segments:False), and under PyTorch's own rules (memfit's two departures off,
// expandable as recorded), each as a ratio to PyTorch's; the trace's segment_alloc / free /
// map / unmap counts and OOMs (PyTorch's trace / memfit's replay). Segment releases are
// reproduced as profiler/snapshot_import.h says (a run of segment_free/unmap entries is one
// empty_cache). A file that fails to read or replay prints its error in its row and makes the
// exit status 1. The folder is not part of the repository (see its README); without it the
// program says so and exits 0.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/null_provider.h"
#include "memory/trace_replay.h"
#include "profiler/pickle.h"
#include "profiler/snapshot_import.h"

namespace fs = std::filesystem;
using namespace memfit;

namespace {

std::size_t replay_peak(const ImportedSnapshot& s, const AllocatorConfig& conf,
                        std::int64_t* ooms = nullptr) {
  NullProvider null;
  CachingAllocator alloc(null, conf);
  const ReplayResult r = replay(s.trace, alloc);
  if (ooms != nullptr) *ooms = r.num_ooms;
  return r.peak_reserved_bytes;
}

std::string ratio(std::size_t mine, std::size_t theirs) {
  if (theirs == 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", double(mine) / double(theirs));
  return b;
}

double gib(std::size_t b) { return double(b) / double(std::size_t{1} << 30); }

}  // namespace

int main(int argc, char** argv) {
  const fs::path folder = argc > 1 ? fs::path(argv[1]) : fs::path("../shared/real-snapshots");
  if (!fs::is_directory(folder)) {
    std::printf(
        "%s: no such folder (the real snapshots live beside the repository, not in "
        "it); nothing to replay\n",
        folder.string().c_str());
    return 0;
  }
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(folder)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && ext != ".md" && ext != ".tsv") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());

  std::printf("%-44s %3s %9s | %9s %6s | %6s %6s %6s | %16s %7s\n", "file", "dev", "PyTorch",
              "memfit", "ratio", "expand", "segs", "rules", "seg a/f/map/unmap", "OOMs");
  std::printf("%-44s %3s %9s | %9s %6s | %6s %6s %6s | %16s %7s\n", "", "", "GiB", "GiB", "",
              "ratio", "ratio", "ratio", "", "pt/mf");
  int status = 0;
  std::size_t above = 0, pick_above = 0, compared = 0;
  for (const fs::path& file : files) {
    const std::string name = file.filename().string().substr(0, 44);
    try {
      const PickleValue snap = load_pickle_file(file.string());
      std::vector<int> devices = traced_devices(snap, file.string());
      if (devices.empty()) devices.push_back(-1);
      for (int device : devices) {
        const ImportedSnapshot s = import_snapshot(snap, file.string(), device);
        const std::size_t theirs = s.segments.trace_peak_reserved_bytes;
        std::int64_t ooms = 0;
        const AllocatorConfig dflt = replay_alloc_conf(s);
        const std::size_t mine = replay_peak(s, dflt, &ooms);
        AllocatorConfig expandable = dflt, segments = dflt, rules = dflt;
        expandable.expandable_segments = true;
        segments.expandable_segments = false;
        rules.separate_persistent_pools = false;
        rules.release_before_growth = false;
        const std::size_t exp_peak = replay_peak(s, expandable);
        const std::size_t seg_peak = replay_peak(s, segments);
        const std::size_t rules_peak = replay_peak(s, rules);
        if (theirs > 0) {
          ++compared;
          above += mine > theirs;
          pick_above += std::min(exp_peak, seg_peak) > theirs;
        }
        char counts[64];
        std::snprintf(counts, sizeof counts, "%zu/%zu/%zu/%zu", s.num_segment_allocs,
                      s.num_segment_frees, s.num_segment_maps, s.num_segment_unmaps);
        std::printf("%-44s %3d %9.3f | %9.3f %6s | %6s %6s %6s | %16s %3zu/%-3lld%s\n",
                    name.c_str(), s.device, gib(theirs), gib(mine), ratio(mine, theirs).c_str(),
                    ratio(exp_peak, theirs).c_str(), ratio(seg_peak, theirs).c_str(),
                    ratio(rules_peak, theirs).c_str(), counts, s.num_ooms,
                    static_cast<long long>(ooms),
                    s.recorded.expandable_segments ? "  (recorded expandable)" : "");
      }
    } catch (const std::exception& e) {
      std::printf("%-44s error: %s\n", name.c_str(), e.what());
      status = 1;
    }
  }
  std::printf(
      "\nmemfit = the settings memfit replay chooses (defaults; expandable when PyTorch's run "
      "was); expand / segs = expandable_segments True / False; rules = PyTorch's rules "
      "(separate_persistent_pools and release_before_growth off, expandable as recorded).\n"
      "memfit's default replay above PyTorch's reserved peak on %zu of %zu traces with segment "
      "events; memfit's pick (the better of expand / segs, as memfit replay names it) on %zu.\n",
      above, compared, pick_above);
  return status;
}
