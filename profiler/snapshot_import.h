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
//   segment_*, oom, snapshot and unknown actions -> nothing (the replay makes its own
//                           segments; counted in `ignored_entries`)
// Allocations live at the start come first, as alloc ops: blocks freed in the trace without
// an alloc before it (allocated before recording began, or dropped from PyTorch's ring
// buffer), and blocks active in the segments (the state at the end) that the trace never
// allocated. Entry sizes are used as the requested sizes; a trace entry's "category"
// (memfit's names) becomes the op's category, else unknown; its innermost frame's name the
// tag. Sizes of zero (PyTorch never makes them) are skipped.
//
// The file's own figures (`segments`): reserved = sum of total_size, allocated = sum of
// allocated_size, active, requested (of active blocks), segment count and the largest; and
// the reserved peak over the trace, walked back from the end state through its
// segment_alloc / segment_free entries (0 when the trace has none).
//
// Errors: InvalidArgument naming `source` and the place ("device_traces[0][17]: no key
// 'addr'", "segments[2]['total_size']: expected int, found str") for a pickle that is valid
// data but not a snapshot; a legacy snapshot (torch < 2.0: a bare list of segments) is read
// as segments without a trace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

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

struct ImportedSnapshot {
  AllocTrace trace;
  SnapshotSegmentsSummary segments;
  int device = 0;                      // the device whose trace was read
  std::size_t num_entries = 0;         // that device's trace entries
  std::size_t num_allocs = 0;          // alloc entries turned into ops
  std::size_t num_frees = 0;           // free ops made
  std::size_t num_initially_live = 0;  // allocations live at the start
  std::size_t num_ooms = 0;            // oom entries in the trace
  std::size_t ignored_entries = 0;     // segment_*, snapshot, oom, unknown actions
  bool legacy = false;                 // a bare list of segments (torch < 2.0)
};

// device < 0: the only device whose trace is non-empty (device 0 when none is); several
// non-empty traces without a device chosen is an InvalidArgument listing them.
ImportedSnapshot import_snapshot(const PickleValue& snapshot, std::string_view source,
                                 int device = -1);

}  // namespace memfit
