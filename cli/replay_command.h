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
// those after the first step when the trace has step markers), OOMs; for a snapshot also the
// file's reserved / allocated / segments / largest segment and the reserved peak its trace
// shows. --device picks a device of a multi-device snapshot.
//
// --format json prints {"file", "kind": "snapshot"|"trace", "alloc_conf", "replay": {...},
// "file_segments": {...} | null, "import": {...} | null}.
// Bad input (missing file, hostile or corrupt pickle, a pickle that is not a snapshot, a bad
// trace line, bad --alloc-conf) is a memfit::Error: the message names the file and place, exit 2.
#pragma once

#include <CLI/CLI.hpp>

namespace memfit::cli {

// Adds the subcommand to `app`; its callback replays and sets `exit_code`.
void add_replay_command(CLI::App& app, int& exit_code);

}  // namespace memfit::cli
