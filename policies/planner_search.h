// Private to the planner (policies/planner*.cpp); not API. The search of one combination
// (dtype, checkpointing, offload): its largest micro-batch under the budget (max-batch mode)
// or its fastest way to the global batch (throughput mode), each a chain of dry runs; the
// plan() that weighs the combinations against each other is in planner.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "core/dtype.h"
#include "policies/cost_model.h"
#include "policies/plan.h"
#include "policies/planner.h"
#include "policies/policy.h"
#include "policies/run_spec.h"

namespace memfit::planner_detail {

// One (dtype, checkpointing, offload) combination and what the search found for it.
struct Combo {
  Combo(DType d, Checkpointing c, OffloadSwitches o) : dtype(d), ck(std::move(c)), offload(o) {}
  DType dtype = DType::kF32;
  Checkpointing ck;
  OffloadSwitches offload;
  // Results.
  std::int64_t max_micro = 0;  // 0: nothing fits
  // Optimal solver: the schedule each micro-batch the search saw fit fitted with (max_micro's
  // included), a twin's hint (below).
  std::map<std::int64_t, Schedule> fitted;
  std::optional<Plan> plan;
  std::string infeasible;
  std::int64_t dry_runs = 0;

  bool optimal() const { return ck.kind() == Checkpointing::Kind::kOptimal; }
  std::string name() const {
    return std::string(dtype_name(dtype)) + " " + ck.name() + " offload=" + offload.describe();
  }
};

struct Context {
  const PlannerOptions& o;
  const CostModel& cm;
  std::int64_t seq_len = 0;
  std::size_t budget = 0;
  int n = 0;  // blocks
};

// "64.00 MiB", "1.00 GiB": the unit that reads best (small budgets were "0.06 GiB").
std::string gib(double bytes);

// The ZeRO stage the plans run with: PlannerOptions::zero_stage with ranks > 1, else 0 (as
// Plan::run_spec has it).
int zero_stage(const PlannerOptions& o);
// Why a combination is not offered at all, or "" when it is: ZeRO-1/2 runs without optimizer,
// gradient or weight offload (RunSpec::validate refuses the rest).
std::string unsupported(const PlannerOptions& o, const OffloadSwitches& offload);

// The RunSpec the planner dry-runs for a combination: `accum` micro-batches of `micro` samples
// on each rank, the last one `last` (0: micro) samples; its batch is the global one (that per
// rank x ranks), its rank 0 (the largest ZeRO chunks: its peak is the highest of the ranks').
// No budget (alloc.budget 0); the optimal solver's schedule is all(n) until solved.
RunSpec request(const Context& c, const Combo& combo, std::int64_t micro, std::int64_t accum,
                std::int64_t last);

// A twin combination's answer (f16 and bf16 allocate the same bytes): the micro-batch that
// fitted it (0: none) and, for the optimal solver, the schedules it fitted with. The search
// tries a twin's schedule first (one dry run) where it would solve and probe (a solve and one
// to ten dry runs); whatever it reports is its own dry runs'.
struct Hint {
  std::int64_t micro = 0;
  const std::map<std::int64_t, Schedule>* fitted = nullptr;
  static Hint of(const Combo& twin) { return {twin.max_micro, &twin.fitted}; }
  const Schedule* schedule_at(std::int64_t m) const {
    if (fitted == nullptr) return nullptr;
    const auto it = fitted->find(m);
    return it == fitted->end() ? nullptr : &it->second;
  }
};

// Max-batch mode for one combination: combo.plan, or combo.infeasible saying why not.
void search_max(const Context& c, Combo& combo, Hint hint);
// Throughput mode for one combination (PlannerOptions::global_batch).
void search_throughput(const Context& c, Combo& combo, Hint hint);

}  // namespace memfit::planner_detail
