// The `optimal` checkpoint solver's dynamic program alone (checkpoint_solver.h wraps it and
// compares its answer with the fixed rules). Internal to policies/; the tests call it directly
// so that its optimality is checked without the fixed rules standing in for it.
//
//   std::optional<DpSolution> d = optimal_checkpoint_dp(chain, limit, /*slots=*/500);
//   if (d) executor.run(d->schedule, ...);   // fits `limit` per simulate()
//
// Discretization: unit = ceil(limit / slots) bytes, budget = floor(limit / unit) units <= slots,
// every byte size rounded UP to whole units. A term-by-term upper bound, so a schedule that fits
// in units fits in bytes; exact when every size is a multiple of the unit (the tests' case).
//
// The tables of one solve hold the answer for every budget up to theirs, so CheckpointDpTables
// answers a smaller limit without solving again (the planner lowers the limit when its dry run
// overshoots, up to six times per micro-batch):
//   CheckpointDpTables t(chain, limit, 500);
//   std::optional<DpSolution> a = t.at(limit), b = t.at(limit - overshoot);  // one solve
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "core/schedule.h"
#include "policies/checkpoint_solver.h"

namespace memfit {

struct DpSolution {
  Schedule schedule;        // named "optimal"
  double compute_time = 0;  // the DP's own sum (simulate() agrees)
  std::int64_t unit = 0;    // bytes per memory unit
  int budget_units = 0;     // floor(limit / unit)
};

// The least compute time over all schedules whose peak, with sizes rounded up to units, fits
// the budget; nullopt when none does. The chain must be valid (checkpoint_solver.cpp checks).
// InvalidArgument when the tables would exceed 1 GiB (n^2/2 * (slots + 1) entries).
// prune = false relaxes every way of solving a sub-problem over its whole range instead of
// only where it can still lower the table (the tests check the two agree bit for bit).
std::optional<DpSolution> optimal_checkpoint_dp(const Chain& chain, std::int64_t limit, int slots,
                                                bool prune = true);

// One solve's tables (unit = ceil(limit / slots)), asked at any limit up to the one solved for:
// at(l) is the least compute time at budget floor(l / unit) units, the unit unchanged, so a
// smaller limit is answered as finely as the first (optimal_checkpoint_dp(chain, l, slots)
// rounds to l's own unit and can differ by that rounding). InvalidArgument as
// optimal_checkpoint_dp, and for at() of a limit above the solved one. Not thread-safe (at()
// reconstructs through the tables' own state): one thread at a time; not for static or
// thread_local storage (the tables return to a per-thread pool when destroyed).
class CheckpointDpTables {
 public:
  CheckpointDpTables(const Chain& chain, std::int64_t limit, int slots, bool prune = true);
  ~CheckpointDpTables();
  CheckpointDpTables(const CheckpointDpTables&) = delete;
  CheckpointDpTables& operator=(const CheckpointDpTables&) = delete;

  std::optional<DpSolution> at(std::int64_t limit) const;
  std::int64_t limit() const { return limit_; }

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;  // null when limit < 1: nothing fits
  std::int64_t limit_ = 0;
};

}  // namespace memfit
