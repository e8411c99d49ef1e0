// `memfit plan`: the planner (policies/planner.h) from the command line. For a model and a
// device (preset names or YAML files) and an optional budget, it prints one row per feasible
// combination of activation dtype, checkpoint solver and offload (max micro-batch,
// accumulation, predicted peak reserved in all and by category, predicted step time and
// tokens/s), the combinations that do not fit and why, and the recommended plan with one line
// of why; --out writes the recommended plan (YAML or JSON by extension) for
// `memfit train --plan FILE`.
//
//   memfit plan --model gpt2 --device h100-80g                      # max-batch mode
//   memfit plan --model gpt2 --device a100-40g --global-batch 512 --ranks 8 --zero 2
//   memfit plan --model gpt-tiny --device cpu --budget 64MiB --format json --out plan.yaml
//
// --format json prints {"recommended": {...}, "candidates": [...], "infeasible": [...]}; each
// plan as plan_json() below. --format yaml prints the recommended plan as Plan::to_yaml().
// Bad input is a memfit::Error (exit 2) and leaves --out untouched: the file is written last,
// atomically (Plan::save), and its extension is checked before planning starts.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "policies/plan.h"

namespace memfit::cli {

// Adds the subcommand to `app`; its callback plans and sets `exit_code`.
void add_plan_command(CLI::App& app, int& exit_code);

// One plan as the CLI reports it (plan and train summaries share it): activation_dtype,
// checkpoint (the solver's name or the schedule's op list), solver (a short label for it),
// offload, micro_batch, accum_steps, global_batch, seq_len, delayed_update, ranks, zero_stage,
// model, device, budget_bytes, predicted_peak_reserved_bytes, predicted_peak_allocated_bytes,
// predicted_peak_by_category, predicted_step_seconds, predicted_tokens_per_second, why.
nlohmann::json plan_json(const Plan& p);

// "none", "all", "sqrt", "every:2", or "optimal" for a schedule written as its op list.
std::string checkpoint_label(const std::string& checkpoint);

// "bf16, checkpoint all, offload off, micro-batch 12 x 2 accumulated (global batch 24)"
std::string describe_plan(const Plan& p);

}  // namespace memfit::cli
