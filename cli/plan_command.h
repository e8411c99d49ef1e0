// `memfit plan`: the planner (policies/planner.h) from the command line. For a model and a
// device (preset names or YAML files) and an optional budget, it prints one row per feasible
// combination of activation dtype, checkpoint solver and offload (max micro-batch,
// accumulation, predicted peak reserved and what it holds at that moment by category, plus
// cached and pinned host bytes, predicted step time and
// tokens/s), the combinations that do not fit and why, and the recommended plan with one line
// of why; --out writes the recommended plan (YAML or JSON by extension) for
// `memfit train --plan FILE`.
//
//   memfit plan --model gpt2 --device h100-80g                      # max-batch mode
//   memfit plan --model gpt2 --device a100-40g --global-batch 512 --ranks 8 --zero 2
//   memfit plan --model gpt-tiny --device cpu --budget 64MiB --format json --out plan.yaml
//
// --format json prints {"recommended": {...}, "candidates": [...], "infeasible": [...]}; each
// plan is Plan::to_json's document, the same that --out plan.json writes. --format yaml prints the
// recommended plan as Plan::to_yaml(). Bad input is a memfit::Error (exit 2) and leaves --out
// untouched: the file is written last, atomically (Plan::save), and its extension is checked before
// planning starts.
#pragma once

#include <CLI/CLI.hpp>

namespace memfit::cli {

// Adds the subcommand to `app`; its callback plans and sets `exit_code`.
void add_plan_command(CLI::App& app, int& exit_code);

}  // namespace memfit::cli
