// Dry run: the exact memory of one training step of a RunSpec, by running the real Trainer
// (its Model, Executor, optimizer and loss scaler) on the meta backend, with the real
// CachingAllocator over a NullProvider for the device and another NullProvider for the
// pinned host memory of offload: the same allocation sequence as a real step, no arithmetic,
// no memory touched, host included. The one function that predicts a step: the planner,
// `memfit train --predict` and the too-small-budget diagnosis (policies/run_setup.h) all call
// it, so a policy the Trainer runs is predicted with no second edit.
//
//   RunSpec r = ...;                        // policies/run_spec.h
//   DryRunResult d = dry_run(r);
//   if (d.fits) d.step.reserved, d.step.at_peak, d.host_pinned ...
//
// What runs, in order, as RunSetup does it: the model's parameters, Trainer construction
// (initialization, the optimizer's state; with optimizer offload the masters move to the null
// host provider and the cache is emptied), then Trainer::step on a batch of r.batch samples.
// The step's full micro-batches run until they take no segment from the provider and the
// allocator's counters repeat with a period p (1, or 2-4 when a tight budget alternates
// layouts) twice over; the Trainer then skips the rest, a whole number of periods
// (Trainer::set_repeat_check), which would repeat them, and runs the last one. A step of more
// than 64 micro-batches runs as one of 64 with the same sizes and the repeats extrapolated, so
// the dry run's time and memory do not grow with the batch; if the allocator has not settled
// within those, a step of up to 4096 runs whole, and a longer one is a DryRunUnsettled (an
// InvalidArgument). Peaks:
// `setup_peak_reserved` is construction's (until the optimizer is built), `step` the step's
// (the Trainer resets the peaks at its start: what StepResult::peaks reports on a real run);
// fits needs both within r.alloc.budget. With steps = 2 (the default) a second step runs after
// the first and `step` holds the larger of each figure (PeakFigures::take_max): the second
// step starts from the cache the first left (its freed activation segments, blocks split
// another way), so its peaks can differ from the first's by a block's rounding; later steps
// repeat the second (a test checks four real steps). steps = 1 predicts the first step only,
// for searches that confirm their answer with two (the planner).
// `host_pinned` is the pinned host bytes a real run would hold (OffloadOptimizer's slab and
// activation offload's room for the step's checkpoints), exactly, and step.host_at_peak the
// same by category; a device budget does not cover them, the host budget
// (r.trainer.host_budget) does: over it, fits = false and host_pinned says what would be
// pinned, while step.host_at_peak stays empty (nothing was).
// An OutOfMemory under the budget is caught: fits = false, with the request that failed and
// the allocator's message; bad input (RunSpec::validate) throws.
// gemm_flops, bytes_moved (and compute_seconds) are the meta backend's counts for every micro-batch (skipped
// ones counted as the one they repeat) and the update, in the first step.
// Runs in about a millisecond per block per step on this machine (gpt2-xl: 48 blocks).
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "core/meta/meta_backend.h"  // MetaOp, kMetaOps
#include "memory/error.h"
#include "memory/peak_figures.h"
#include "policies/run_spec.h"

namespace memfit {

struct DryRunResult {
  bool fits = false;
  PeakFigures step;                     // the step's peaks (host_pinned included)
  std::size_t setup_peak_reserved = 0;  // building the model and the trainer, before the step
  std::size_t host_pinned = 0;          // pinned host bytes the run holds (offload)
  std::size_t failed_request = 0;       // when !fits: the allocation that did not fit
  std::string failure;                  // when !fits: the OutOfMemory message
  double gemm_flops = 0;                // the meta backend's counts for the step
  double bytes_moved = 0;
  // With RunSpec::op_rates: the step's ops priced at those rates and added up (the first step;
  // skipped micro-batches as the one they repeat). Compute only: waits for offload transfers
  // and the host's AdamW are not in it (CostModel::step_seconds models those). 0 without rates.
  double compute_seconds = 0;
  std::array<double, kMetaOps> op_seconds{};  // compute_seconds by op (MetaOp), where it goes
  double op_calls = 0;                  // backend calls in the step (skipped micro-batches too)
  std::int64_t micro_batches_run = 0;  // how many the dry run ran (the rest repeat them)

  // The most the run reserves on the device: the step's peak or construction's.
  std::size_t need_reserved() const {
    return step.reserved > setup_peak_reserved ? step.reserved : setup_peak_reserved;
  }
};

// A step of more than 4096 micro-batches whose allocator does not settle within 64 (above):
// its memory cannot be predicted from a shorter step. A planner skips such a micro-batch.
class DryRunUnsettled : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

DryRunResult dry_run(const RunSpec& run, int steps = 2);  // steps: 1 or 2

}  // namespace memfit
