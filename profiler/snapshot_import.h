// Reads a memory_viz snapshot (PyTorch's torch.cuda.memory._snapshot() pickle, or memfit's
// snapshot.pickle) back into an AllocTrace that memfit's allocator can replay, and sums up
// what the file's own segments say.
//
//   PickleValue snap = load_pickle_file("snapshot.pickle");         // profiler/pickle.h
//   ImportedSnapshot s = import_snapshot(snap, "snapshot.pickle");
//   NullProvider null;
//   CachingAllocator alloc(null);
//   ReplayResult r = replay(s.trace, alloc);                        // memory/trace_replay.h
//   r.peak_reserved_bytes vs s.segments.reserved_bytes / s.segments.trace_peak_reserved_bytes
//
// The trace is built from one device's "device_traces" list:
//   alloc                -> alloc op (a fresh id per allocation; the address maps to it)
//   free_completed       -> free op (the block is reusable from then on)
//   free_requested       -> free op only when no free_completed for that address follows
//                           before the address is allocated again (traces recorded with
//                           free_requested only, or cut off before the completion)
//   segment_free,        -> each maximal run of consecutive ones becomes ONE empty_cache op
//   segment_unmap           at the place of the run's first entry: PyTorch released cached
//                           memory there (the user's torch.cuda.empty_cache(), or its own
//                           release when cudaMalloc failed or garbage collection ran), and
//                           memfit's replay releases its cached free segments (expandable
//                           mode: unmaps its free pages) at the same point. Under OOM PyTorch
//                           frees only enough segments for the request; empty_cache frees
//                           every cached one, so at such a point memfit holds no more than
//                           PyTorch did.
//   segment_alloc, segment_map, oom, snapshot and unknown actions -> nothing (the replay makes
//                           its own segments; counted per kind below and in ignored_entries)
// Allocations live at the start come first, as alloc ops: blocks freed in the trace without
// an alloc before it (allocated before recording began, or dropped from PyTorch's ring
// buffer), and blocks active in the segments (the state at the end) that the trace never
// allocated. Entry sizes are used as the requested sizes; a trace entry's "category"
// (memfit's names) becomes the op's category, else unknown; its innermost frame's name the
// tag. Sizes of zero (PyTorch never makes them) are skipped.
//
// The file's own figures (`segments`): reserved = sum of total_size, allocated = sum of
// allocated_size, active, requested (of active blocks), segment count and the largest; and
// PyTorch's reserved peak over the trace, walked back from the end state through its
// segment_alloc / segment_map entries (each adds its size) and segment_free / segment_unmap
// entries (each subtracts it), then forward (0 when the trace has none of them).
//
// How PyTorch's run was set up (`recorded`): its PYTORCH_CUDA_ALLOC_CONF and whether it used
// expandable segments: allocator_settings["expandable_segments"], or, in files without
// allocator_settings, any segment with is_expandable or any segment_map / segment_unmap
// entry. replay_alloc_conf() turns that into the memfit config a faithful replay uses.
//
// Errors: InvalidArgument naming `source` and the place ("device_traces[0][17]: no key
// 'addr'", "segments[2]['total_size']: expected int, found str") for a pickle that is valid
// data but not a snapshot; a legacy snapshot (torch < 2.0: a bare list of segments) is read
// as segments without a trace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memory/alloc_conf.h"
#include "memory/alloc_trace.h"
#include "profiler/pickle.h"

namespace memfit {

struct SnapshotSegmentsSummary {
  std::size_t num_segments = 0;
  std::size_t reserved_bytes = 0;   // sum of total_size
  std::size_t allocated_bytes = 0;  // sum of allocated_size
  std::size_t active_bytes = 0;     // sum of active_size
  std::size_t requested_bytes = 0;  // sum of requested_size of active_allocated blocks
  std::size_t num_active_blocks = 0;
  std::size_t largest_segment_bytes = 0;
  std::size_t trace_peak_reserved_bytes = 0;  // over the trace; 0 without segment events
  std::size_t trace_start_reserved_bytes = 0;
};

// How the recorded PyTorch run's allocator was set up, as far as the file says.
struct RecordedAllocator {
  bool has_settings = false;  // the file has allocator_settings (PyTorch >= 2.2 writes them)
  std::string alloc_conf;     // its PYTORCH_CUDA_ALLOC_CONF ("" when unset or unknown)
  bool expandable_segments = false;
  const char* expandable_evidence = "";  // which field said so ("" when not expandable)
};

struct ImportedSnapshot {
  AllocTrace trace;
  SnapshotSegmentsSummary segments;
  RecordedAllocator recorded;
  int device = 0;                      // the device whose trace was read
  std::size_t num_entries = 0;         // that device's trace entries
  std::size_t num_allocs = 0;          // alloc entries turned into ops
  std::size_t num_frees = 0;           // free ops made
  std::size_t num_initially_live = 0;  // allocations live at the start
  std::size_t num_ooms = 0;            // oom entries in the trace
  std::size_t num_segment_allocs = 0;  // segment_alloc entries
  std::size_t num_segment_frees = 0;   // segment_free entries
  std::size_t num_segment_maps = 0;    // segment_map entries (expandable segments)
  std::size_t num_segment_unmaps = 0;  // segment_unmap entries
  std::size_t num_empty_cache = 0;     // empty_cache ops made (runs of segment_free / unmap)
  std::size_t ignored_entries = 0;     // segment_alloc/map, snapshot, oom, unknown actions
  bool legacy = false;                 // a bare list of segments (torch < 2.0)
};

// device < 0: the only device whose trace is non-empty (device 0 when none is); several
// non-empty traces without a device chosen is an InvalidArgument listing them.
ImportedSnapshot import_snapshot(const PickleValue& snapshot, std::string_view source,
                                 int device = -1);

// The devices whose trace is non-empty, in order (empty for a legacy snapshot or none).
std::vector<int> traced_devices(const PickleValue& snapshot, std::string_view source);

// The memfit allocator settings a faithful replay of `s` uses when the user names none: the
// defaults, with expandable_segments:True when PyTorch's run used expandable segments.
AllocatorConfig replay_alloc_conf(const ImportedSnapshot& s);

}  // namespace memfit
