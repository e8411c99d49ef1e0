// `memfit profile`: trains a few steps with the profiler's Recorder on and writes the report
// (profiler/report.h): summary.json, timeline.csv, trace.json, snapshot.pickle, report.html.
//
//   memfit profile --model gpt-tiny --steps 3 --out out/profile
//   memfit profile --model gpt-tiny --budget 96MiB --steps 2 --out out/p --formats summary,html
//   memfit profile --plan plan.yaml --steps 2 --out out/p --backend cuda
//
// Policies as `memfit train` takes them (--plan FILE, or --dtype/--checkpoint/--micro-batch/
// --accum/--offload, or --budget alone to plan); --data FILE trains on a text file, otherwise
// on pseudo-random bytes (memory does not depend on the tokens). Prints where each file went,
// DeepSpeed's see_memory_usage line and, when a plan or a budget was given, the plan's
// predicted peak beside the measured one (a dry run predicts when there is no plan file).
// Bad input (model, policies, formats, an unwritable --out) is an error before anything is
// written; the report's files are each written atomically.
#pragma once

#include <CLI/CLI.hpp>

namespace memfit::cli {

void add_profile_command(CLI::App& app, int& exit_code);

}  // namespace memfit::cli
