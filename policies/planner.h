// Planner: searches activation dtype x checkpoint solver x offload x micro-batch x
// accumulation for the plan that fits the largest batch under a budget (max-batch mode) or
// trains a target global batch fastest (throughput mode), and says why.
//
//   PlannerOptions o;
//   o.spec = ModelSpec::load("gpt2"); o.device = DeviceSpec::load("h100-80g");
//   o.global_batch = 0;                       // max-batch mode; N: throughput mode
//   PlanResult r = plan(o);
//   std::cout << r.recommended.why;           // one line
//   r.recommended.save("plan.yaml");
//
// Max-batch mode: for each combination (dtype, solver, offload) the largest micro-batch whose
// dry-run peak (policies/dry_run.h) fits the budget, by exponential then binary search on the
// dry run; for the `optimal` solver the schedule is solved for each micro-batch under the
// memory left after the static bytes, then confirmed by the dry run. The recommended plan is
// the largest micro-batch, ties broken by predicted tokens/s.
// Throughput mode: for each combination, every micro-batch that fits and reaches global_batch
// (accum = ceil(N / micro), an uneven last micro-batch allowed), ranked by predicted seconds
// per global batch (CostModel::step_seconds); the fastest is recommended.
// ranks > 1: every dry run is rank 0's of `ranks` data-parallel ranks with ZeRO stage
// zero_stage (RunSpec ranks/rank, TrainerOptions::zero_stage; its batch the global one, each
// rank stepping on micro_batch x accum): the real sharded step, simulated for one rank, so a
// plan's peaks are what that rank reserves (rank 0 holds the largest ZeRO chunks, so no rank
// reserves more) and `micro_batch` is per rank, `global_batch` all ranks'. ZeRO-1/2 runs with
// optimizer offload (each rank's chunks of the masters and moments on its host) and
// activation offload; with gradient or weight offload or the delayed update it is not built
// yet: those combinations are not searched (each in `infeasible`, saying so). The predicted
// time is one rank's compute plus its collectives at the device's rank_link
// (policies/collective_cost.h), taken as not hidden.
// host_budget > 0: a combination whose offload pins more host memory than that does not fit
// (its reason says how much); every plan says what it pins (Prediction's host_pinned).
// Every candidate is a RunSpec (policies/run_spec.h) dry-run by the one dry_run(): the real
// Trainer on the meta backend. The device's kind (DeviceSpec::kind) decides the GEMM
// workspace: the CPU backend's scratch for kCpu, a fixed per-GEMM workspace,
// gemm_workspace_bytes, for kCuda (cuBLASLt's in the CUDA backend).
// The device's context bytes (DeviceSpec::context_bytes, or the figure `memfit plan
// --measure-context` measured) come off its memory when no budget is given.
// Errors (ConfigError / InvalidArgument, each saying what would be valid): a budget below
// what the weights need even with every policy on (says how much, for what), seq_len above
// the model's maximum, a global batch no micro-batch can reach, nothing fits.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "memory/alloc_conf.h"
#include "policies/cpu_rates.h"
#include "policies/device_spec.h"
#include "policies/plan.h"
#include "policies/policy.h"
#include "policies/run_spec.h"  // kGpuGemmWorkspaceBytes

namespace memfit {

struct PlannerOptions {
  ModelSpec spec;
  DeviceSpec device;
  std::size_t budget = 0;          // 0: device.usable_bytes()
  std::size_t host_budget = 0;     // pinned host bytes a plan may take; 0: no limit
  std::int64_t seq_len = 0;        // 0: spec.seq_len
  std::int64_t global_batch = 0;   // 0: max-batch mode
  int ranks = 1;                   // data-parallel ranks (plans are per rank: rank 0's)
  int zero_stage = 0;              // 0, 1 (optimizer state sharded), 2 (+ gradients); ranks > 1
  bool overlap_comm = true;        // TrainerOptions::overlap_comm; ranks > 1
  std::vector<DType> dtypes{DType::kF32, DType::kF16, DType::kBF16};
  std::vector<Checkpointing> checkpoints{Checkpointing::none(), Checkpointing::all(),
                                         Checkpointing::sqrt(), Checkpointing::optimal()};
  std::vector<OffloadSwitches> offloads{
      OffloadSwitches{}, OffloadSwitches{.optimizer = true},
      OffloadSwitches{.optimizer = true, .gradients = true},
      OffloadSwitches{.optimizer = true, .gradients = true, .weights = true},
      OffloadSwitches{.optimizer = true, .gradients = true, .weights = true, .activations = true}};
  std::int64_t max_micro_batch = 1 << 16;
  LossMode loss = LossMode::kChunked;  // every candidate's (MemoryPolicy::loss)
  bool calibrate = false;          // CostModel::calibrate instead of analytic
  AllocatorConfig alloc_conf;      // the allocator's tuning for the dry runs (budget: above)
  // With alloc_conf.expandable_segments off: the best combination is searched again with
  // expandable segments, and that plan recommended when it fits a larger micro-batch (or is
  // faster to a global batch). The CLI turns this off when the user's alloc conf names
  // expandable_segments. Each plan's `alloc` says what it assumed.
  bool choose_allocator = true;
  int threads = 0;                 // combinations searched in parallel; 0: the CPU count
  // kCuda devices: the workspace every GEMM takes (CudaBackendOptions::gemm_workspace_bytes);
  // 0 models none.
  std::size_t gemm_workspace_bytes = kGpuGemmWorkspaceBytes;
  // This machine's measured CPU rates (policies/cpu_rates.h), for the cpu device: each plan's
  // step time is then its dry run's ops at these rates (CpuRates::step_seconds), not the cost
  // model's analytic figure. nullptr: analytic.
  std::shared_ptr<const CpuRates> cpu_rates;
};

struct PlanResult {
  // One per feasible combination, best first (the first with the allocator choose_allocator
  // picked for it).
  std::vector<Plan> candidates;
  std::vector<std::string> infeasible;  // "f32 none offload=off: one sample needs 81.2 GiB"
  Plan recommended;
  // Max-batch mode, beside the largest micro-batch (empty when the recommended plan is it):
  // the fastest plan that fits (highest predicted tokens/s of the candidates), and the
  // fastest one whose micro-batch is within kNearLargest of the recommended one (what the
  // last few percent of the batch cost in throughput).
  std::optional<Plan> fastest;
  std::optional<Plan> near_largest;
  std::int64_t dry_runs = 0;  // how many the search took (benchmarks report it)
};

inline constexpr double kNearLargest = 0.05;  // 5% fewer samples per micro-batch

// In PlanResult::infeasible, the reason of each combination not searched because ZeRO-1/2
// does not run with gradient or weight offload or the delayed update yet.
inline constexpr const char* kNotOfferedWithZero =
    "ZeRO-1/2 with gradient or weight offload or the delayed update is not built yet";

PlanResult plan(const PlannerOptions& options);

}  // namespace memfit
