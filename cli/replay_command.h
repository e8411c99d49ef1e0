// `memfit replay`: replays a recorded allocation sequence through memfit's caching allocator
// over a NullProvider (addresses only, so any size replays on any machine) and reports what
// it cost, beside what the file's own segments show.
//
//   memfit replay snapshot.pickle                      # PyTorch's _snapshot() or memfit's
//   memfit replay trace.txt --alloc-conf max_split_size_mb:128 --format json
//
// FILE: a memory_viz snapshot pickle (first byte 0x80; read by the safe reader,
// profiler/pickle.h, and profiler/snapshot_import.h) or memfit's text trace
// (memory/alloc_trace.h). Prints reserved peak, live peak, their ratio, provider calls (and
// those after the first step when the trace has step markers), OOMs; for a snapshot also
// PyTorch's own reserved peak over the same trace beside memfit's, with the rules each used
// (PyTorch's PYTORCH_CUDA_ALLOC_CONF and whether it used expandable segments; memfit's
// settings and where they came from; how the trace's segment releases were reproduced),
// its segment_alloc/free/map/unmap counts and the file's reserved / allocated / segments /
// largest segment. A snapshot with traces on several devices replays each device in turn
// (one allocator each, as PyTorch has); --device picks one.
//
// Allocator settings: --alloc-conf, else MEMFIT_ALLOC_CONF, else for a snapshot recorded with
// expandable segments expandable_segments:True (a like-for-like replay), else the defaults.
// Segment releases: see snapshot_import.h (each run of segment_free / segment_unmap entries
// is one empty_cache at that point).
//
// --format json prints {"file", "kind": "snapshot"|"trace", "alloc_conf",
// "alloc_conf_source", "replay": {...}, "file_segments": {...} | null, "import": {...} | null,
// "pytorch": {"alloc_conf", "expandable_segments", "reserved_peak_bytes",
// "segment_release_rule"} | null}; several devices print a list of those, one per device.
// Bad input (missing file, hostile or corrupt pickle, a pickle that is not a snapshot, a bad
// trace line, bad --alloc-conf) is a memfit::Error: the message names the file and place, exit 2.
#pragma once

#include <CLI/CLI.hpp>

namespace memfit::cli {

// Adds the subcommand to `app`; its callback replays and sets `exit_code`.
void add_replay_command(CLI::App& app, int& exit_code);

}  // namespace memfit::cli
