// `memfit devices`: the device presets the planner knows (policies/device_spec.h), one row
// each with memory, what the CUDA context takes, usable bytes and rates, and the model
// presets (core/model_spec.h), so `memfit plan --device NAME --model NAME` can be filled in.
//
//   memfit devices                 # table
//   memfit devices --format yaml   # every preset as the YAML a --device FILE takes
#pragma once

#include <CLI/CLI.hpp>

namespace memfit::cli {

// Adds the subcommand to `app`; its callback lists the presets and sets `exit_code`.
void add_devices_command(CLI::App& app, int& exit_code);

}  // namespace memfit::cli
