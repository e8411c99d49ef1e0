// Dry run: the exact peak of one training step of a plan, by running the real Model, Executor
// and optimizer on the meta backend with the real CachingAllocator over a NullProvider: the
// same allocation sequence as a real step, no arithmetic, no memory touched.
//
//   DryRunRequest q{spec, policy, schedule, /*micro_batch=*/8, /*accum=*/4, seq_len, conf};
//   DryRunResult r = dry_run(q);
//   if (r.fits) ...   // r.peak_reserved <= conf.budget (0: no budget)
//
// What runs: the model's parameters (compute dtype, FP32 masters when mixed, FP32 gradients),
// the optimizer's device state (DeviceAdamW's moments; with offload the masters are released
// and nothing else stays on the device: the host side is not simulated), then the step: the
// token/target inputs (Category::kInput), full micro-batches until one leaves the allocator as
// it found it (no segment taken or returned: the rest would repeat it; usually two, more under a
// tight budget), an uneven last one when there is one, the optimizer update. Peaks are the allocator's over all of it. An
// OutOfMemory under the budget is caught: fits = false, with the request that failed.
// As in Trainer::step, the peaks are reset once the model and optimizer are built, so they are
// the step's (what StepResult reports); setup_peak_reserved is the construction's own peak
// (with offload it holds the device masters until the optimizer moves them), and fits needs
// both under the budget. gemm_flops and bytes_moved cover all `accum` micro-batches (the
// repeated ones counted from the first) and the update.
// Runs in about a millisecond per block on this machine (gpt2-xl: 48 blocks).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/model_spec.h"
#include "core/schedule.h"
#include "memory/alloc_conf.h"
#include "memory/category.h"
#include "policies/cost_model.h"

namespace memfit {

struct DryRunRequest {
  ModelSpec spec;
  Policy policy;
  Schedule schedule;          // for spec.layers blocks
  std::int64_t micro_batch = 1;
  std::int64_t accum = 1;
  std::int64_t last_micro_batch = 0;  // 0: every micro-batch is micro_batch
  std::int64_t seq_len = 0;           // 0: spec.seq_len
  AllocatorConfig alloc_conf;         // budget included
  // The CPU backend's GEMM scratch comes from the budgeted allocator (what `memfit train` and
  // Trainer users on the CPU do: CpuBackend::set_workspace_allocator), so the dry run makes the
  // same scratch allocations (MetaBackend::set_workspace_allocator). false: a CPU run whose
  // scratch comes from the backend's own pool, outside the budget.
  bool cpu_gemm_scratch = true;
  // > 0: a GPU run instead: every GEMM takes this fixed workspace from the budgeted allocator
  // (CudaBackend's cuBLASLt workspace comes from the training allocator, RuntimeEnv, and is at
  // most CudaBackendOptions::gemm_workspace_bytes: with that cap here the prediction is an
  // upper bound); cpu_gemm_scratch is then ignored.
  std::size_t gpu_gemm_workspace = 0;
};

// CudaBackendOptions::gemm_workspace_bytes' default (core/cuda/cuda_backend.h; a static_assert
// in cli/runtime_env.cpp keeps the two equal in CUDA builds): what the planner models for GPUs.
inline constexpr std::size_t kGpuGemmWorkspaceBytes = std::size_t{32} << 20;

struct DryRunResult {
  bool fits = false;
  std::size_t peak_reserved = 0;
  std::size_t peak_allocated = 0;
  std::array<std::size_t, kCategoryCount> peak_by_category{};
  std::size_t setup_peak_reserved = 0;  // building the model and optimizer, before the step
  std::size_t failed_request = 0;  // when !fits: the allocation that did not fit
  std::string failure;             // when !fits: the OutOfMemory message
  double gemm_flops = 0;           // the meta backend's counts for the step
  double bytes_moved = 0;
};

DryRunResult dry_run(const DryRunRequest& q);

}  // namespace memfit
