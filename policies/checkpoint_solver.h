// Checkpoint solvers: from a chain of blocks' memory and time costs to a Schedule
// (core/schedule.h) the Executor runs. none / all / sqrt(n) are fixed rules; `optimal` is a
// dynamic program in the style of Rotor (Beaumont, Eyraud-Dubois, Shilova, "Optimal GPU-CPU
// offloading strategies for deep neural network training" / "Optimal checkpointing for
// heterogeneous chains", 2019-2021): per block keep nothing / keep input / keep all, memory
// discretized into `slots` units, minimizing total compute under a memory limit.
//
//   Chain c = cost_model.chain(micro_batch, DType::kBF16);      // policies/cost_model.h
//   SolverResult r = solve_checkpoint(c, /*limit=*/6ull << 30);  // or "none", "all", "sqrt"
//   if (r.feasible) executor.run(r.schedule, ...);
//
// The memory model (the solver's own arithmetic; the planner confirms every schedule with a
// dry run through the real allocator): at any moment the bytes in use are the block inputs
// x[i] held, the saved state of blocks that hold it, the gradient flowing at the current
// position, plus the running op's transient (workspace, its output or its input gradient),
// all as the executor holds them (core/schedule.h). simulate() computes exactly that for any
// schedule, so the optimality test can compare the DP with an independent exhaustive search
// (shortest path over executor states under the same model).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/schedule.h"

namespace memfit {

// Block i of a chain, at a given micro-batch and dtype (bytes, and time in any unit).
struct ChainBlock {
  std::int64_t input_bytes = 0;   // x[i], the block's input
  std::int64_t saved_bytes = 0;   // what a keep-all forward saves beyond its input
  bool saves_input = true;        // a keep-all forward also holds x[i]
  std::int64_t fwd_workspace = 0;
  std::int64_t bwd_workspace = 0;
  double fwd_time = 0;
  double bwd_time = 0;
  // A keep-all forward whose output is not stored (forwards_for_backward(), core/executor.h: a
  // block recomputed right before its backward runs only what that reads); < 0: fwd_time.
  double fwd_for_backward_time = -1;
  double for_backward_time() const {
    return fwd_for_backward_time < 0 ? fwd_time : fwd_for_backward_time;
  }
};

struct Chain {
  std::vector<ChainBlock> blocks;
  std::int64_t output_bytes = 0;  // x[n], the head's input
  // The head (final LayerNorm, projection, loss): its saved bytes and time are the same in
  // every schedule; it adds to the peak where it runs. Gradients flowing between blocks are
  // the size of the corresponding x.
  std::int64_t head_bytes = 0;
  double head_time = 0;
};

struct SolverResult {
  Schedule schedule;
  bool feasible = false;           // false: nothing fits `limit` (schedule is then all(n))
  std::int64_t peak_bytes = 0;     // simulate()'s peak for `schedule`
  double compute_time = 0;         // forwards + recomputations + backwards (+ head); a
                                   // forward run for its backward at for_backward_time()
  std::string why;                 // one line: what was chosen and why, or what did not fit
};

struct SimulateResult {
  std::int64_t peak_bytes = 0;
  double compute_time = 0;
};

// The memory model above for any valid schedule (InvalidArgument for an invalid one).
SimulateResult simulate(const Chain& chain, const Schedule& schedule);

// solver: "none", "all", "sqrt", "every:K" (fixed rules; limit only decides `feasible`) or
// "optimal" (the DP: the least compute_time whose peak fits `limit` among persistent schedules,
// Rotor's class, where a keep-nothing forward only feeds the forward right after it and no
// block runs forward while a block above it holds saved state; a schedule outside that class
// can be slightly faster (policies/checkpoint_dp.cpp says how, and the tests pin one). Memory is discretized into `slots` units, rounding up, so a returned
// schedule always fits; none/sqrt/all are returned instead when they fit and are faster).
// InvalidArgument for an unknown solver name (listing the valid ones) or slots < 1.
SolverResult solve_checkpoint(const Chain& chain, std::int64_t limit,
                              std::string_view solver = "optimal", int slots = 500);

// solve_checkpoint(chain, limit, "optimal", slots) for one chain at a falling limit: the dynamic
// program's tables are filled for the first limit asked and answer every smaller one down to
// 3/4 of it without solving again, in the first limit's memory unit (so an answer can differ
// from solve_checkpoint's at that limit by the rounding: both fit, either may recompute a little
// more). A larger or a lower limit, or one where the first unit finds nothing, solves again
// (feasible then agrees with solve_checkpoint's). Not thread-safe: one thread at a time; not
// for static or thread_local storage (its tables return to a per-thread pool when destroyed).
class CheckpointDpTables;
class OptimalSolver {
 public:
  explicit OptimalSolver(Chain chain, int slots = 500);  // InvalidArgument as solve_checkpoint
  ~OptimalSolver();
  OptimalSolver(const OptimalSolver&) = delete;
  OptimalSolver& operator=(const OptimalSolver&) = delete;
  SolverResult solve(std::int64_t limit);

 private:
  Chain chain_;
  int slots_;
  std::unique_ptr<CheckpointDpTables> tables_;
};

std::vector<std::string> checkpoint_solver_names();  // none, all, sqrt, optimal

}  // namespace memfit
