// `memfit train`: trains a model (a built-in name or a YAML spec) on a byte-level text file on
// the CPU backend (or with --backend cuda on the GPU), with the memory policies given on the
// command line, under an optional budget, and reports what it measured.
//
//   memfit train --model gpt-tiny --data data/corpus.txt --steps 20 --batch 8 \
//       --dtype bf16 --checkpoint all --budget 96MiB --predict --summary-json out/train.json
//   memfit train ... --report out/report --formats summary,trace,html
//
// One progress line per step (step, loss, loss scale when f16, tokens/s, peak memory; a bar
// that redraws in place on a terminal), a final summary, and with --summary-json a JSON file
// (keys: final_loss, tokens_per_second, peak_reserved_bytes, peak_allocated_bytes,
// peak_by_category (at the peak), cached_bytes_at_peak, category_peaks, host_pinned_bytes,
// with --clip-grad-norm max_grad_norm, grad_norms (per step) and clipped_steps, and
// with a plan or --predict the same with predicted_ in front: one step of the same RunSpec
// dry-run by policies/dry_run.h, the real Trainer on the meta backend over null providers).
// --budget limits the allocator's reserved bytes on the device (GEMM scratch included).
// A budget too small for the first step is an error that lists, from dry runs, what each
// alternative plan would need. --report DIR records the run and writes the profile report
// `memfit profile` writes (cli/profile_command.h). Bad input is a memfit::Error (the program
// exits 2); the options shared with `memfit profile` live in cli/run_args.h, and everything
// that runs is the library's RunSetup (policies/run_setup.h).
#pragma once

#include <CLI/CLI.hpp>

namespace memfit::cli {

// Adds the subcommand to `app`; its callback trains and sets `exit_code`.
void add_train_command(CLI::App& app, int& exit_code);

}  // namespace memfit::cli
