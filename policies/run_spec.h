// RunSpec: everything that decides a training run's memory, as one value: the model, the
// trainer's options (its MemoryPolicy first), the global batch and sequence length, the
// allocator's settings with the budget, and the kind of device the step runs on. The planner
// makes them, a plan file turns into one (Plan::run_spec), the CLI fills one from its flags;
// the dry run (policies/dry_run.h) predicts one and RunSetup (policies/run_setup.h) trains
// one, so a prediction and the run it predicts start from the same value.
//
//   RunSpec r;
//   r.model = ModelSpec::preset("gpt-tiny");
//   r.trainer.policy.dtype = DType::kBF16;
//   r.trainer.policy.micro_batch = 4;
//   r.batch = 16;                       // samples per step
//   r.alloc.budget = 64 * kMiB;
//   r.validate();                       // InvalidArgument / ConfigError naming what is wrong
//   DryRunResult d = dry_run(r);        // what RunSetup(r) will reserve, to the byte
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/meta/op_rates.h"
#include "core/model_spec.h"
#include "memory/alloc_conf.h"
#include "policies/device_spec.h"
#include "policies/trainer.h"

namespace memfit {

// CudaBackendOptions::gemm_workspace_bytes' default (core/cuda/cuda_backend.h; a static_assert
// in policies/cuda/ keeps the two equal in CUDA builds): the cuBLASLt workspace each GEMM takes.
inline constexpr std::size_t kGpuGemmWorkspaceBytes = std::size_t{32} << 20;

struct RunSpec {
  ModelSpec model;
  TrainerOptions trainer;                // trainer.policy: the memory policy
  std::int64_t batch = 1;                // the global batch: samples per step (all ranks)
  std::int64_t seq_len = 0;              // 0: the model's
  AllocatorConfig alloc;                 // alloc.budget: the device budget (0: none)
  DeviceKind device = DeviceKind::kCpu;  // the backend the step runs on
  // kCuda: the workspace every GEMM takes from the budgeted allocator (cuBLASLt's; the
  // prediction is then an upper bound). kCpu ignores it: the CPU backend's 16-bit widening
  // scratch comes from the budgeted allocator at the size each GEMM needs.
  std::size_t gpu_gemm_workspace = kGpuGemmWorkspaceBytes;
  // Rates to price the dry run's ops at (DryRunResult::compute_seconds); none: no time. For the
  // CPU: policies/cpu_rates.h's measured ones. Decides nothing about memory.
  std::shared_ptr<const OpRates> op_rates;
  // Data parallel: this process is rank `rank` of `ranks`, each rank stepping on rank_batch()
  // samples of every global batch; the ZeRO stage is trainer.zero_stage. RunSetup checks them
  // against the launch (trainer.comm); a dry run simulates this rank (SimulatedCommunicator).
  int ranks = 1;
  int rank = 0;

  // The model, the policy, batch >= 1, the sequence length (ModelSpec::resolve_seq_len), and
  // batch x seq_len tokens addressable; ranks >= 1, 0 <= rank < ranks, batch a multiple of
  // ranks, zero_stage 0-2 (1 and 2 without gradient or weight offload or the delayed update); the
  // micro-batch split of rank_batch().
  void validate() const;
  std::int64_t resolved_seq_len() const { return model.resolve_seq_len(seq_len); }
  std::int64_t rank_batch() const { return batch / ranks; }  // samples per step on each rank
  // "gpt-tiny, bf16, checkpoint all, offload optimizer, micro-batch 4, batch 16 x 128":
  // MemoryPolicy::describe between the model and the batch.
  std::string describe() const;
};

}  // namespace memfit
