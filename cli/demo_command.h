// `memfit demo`: the main job until training lands. Replays a bundled GPT-2 training step's
// allocation sequence (memory/alloc_trace.h) through memfit's caching allocator over a
// NullProvider (addresses only, so any model size replays on any machine), then finds the
// largest micro-batch whose replay fits a memory budget, and writes what it measured as JSON.
#pragma once

#include <CLI/CLI.hpp>

namespace memfit::cli {

// Adds the subcommand to `app`; its callback runs the demo and sets `exit_code`.
void add_demo_command(CLI::App& app, int& exit_code);

}  // namespace memfit::cli
