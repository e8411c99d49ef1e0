// The dry run and the planner for a GPU: cuBLASLt's per-GEMM workspace (a fixed allocation from
// the training allocator in the CUDA backend) is in the predicted peaks, and the context bytes
// come off the device's memory when no budget is given.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "memory/category.h"
#include "memory/size.h"
#include "policies/device_spec.h"
#include "policies/dry_run.h"
#include "policies/planner.h"

namespace memfit {
namespace {

ModelSpec tiny_gpt() {
  ModelSpec s;
  s.name = "tiny-gpt";
  s.vocab = 256;
  s.seq_len = 32;
  s.layers = 2;
  s.hidden = 64;
  s.heads = 4;
  return s;
}

// Two micro-batches of 2 on a GPU whose GEMMs take `gpu_ws` bytes of workspace (0: none).
RunSpec request(std::size_t gpu_ws) {
  RunSpec q;
  q.model = tiny_gpt();
  q.trainer.policy.dtype = DType::kBF16;
  q.trainer.policy.micro_batch = 2;
  q.batch = 4;
  q.device = DeviceKind::kCuda;
  q.gpu_gemm_workspace = gpu_ws;
  return q;
}

TEST(GpuWorkspacePlan, DryRunHoldsExactlyOneWorkspaceAtItsPeak) {
  const auto ws = category_index(Category::kWorkspace);
  const DryRunResult none = dry_run(request(0));
  const DryRunResult gpu = dry_run(request(kGpuGemmWorkspaceBytes));
  ASSERT_TRUE(none.fits);
  ASSERT_TRUE(gpu.fits);
  EXPECT_EQ(none.step.category_peaks[ws], 0u);
  EXPECT_EQ(gpu.step.category_peaks[ws], kGpuGemmWorkspaceBytes);  // one GEMM at a time
  // Every other category is unchanged; the total grows by at most one workspace.
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    if (c != ws) EXPECT_EQ(gpu.step.category_peaks[c], none.step.category_peaks[c]) << c;
  }
  EXPECT_GT(gpu.step.allocated, none.step.allocated);
  EXPECT_LE(gpu.step.allocated, none.step.allocated + kGpuGemmWorkspaceBytes);
  EXPECT_GE(gpu.step.reserved, none.step.reserved);
  // The GPU workspace replaces the CPU scratch: a cpu run of the same spec takes the
  // (shape-dependent, smaller) widening scratch instead.
  RunSpec cpu = request(kGpuGemmWorkspaceBytes);
  cpu.device = DeviceKind::kCpu;
  EXPECT_GT(dry_run(cpu).step.category_peaks[ws], 0u);
  EXPECT_LT(dry_run(cpu).step.category_peaks[ws], kGpuGemmWorkspaceBytes);
}

TEST(GpuWorkspacePlan, ABudgetWithoutRoomForTheWorkspaceDoesNotFit) {
  RunSpec q = request(0);
  const DryRunResult without = dry_run(q);
  ASSERT_TRUE(without.fits);
  // Enough for the step without a workspace, short of one workspace on top of it.
  q.alloc.budget = without.step.reserved + kGpuGemmWorkspaceBytes / 2;
  ASSERT_TRUE(dry_run(q).fits);
  q.gpu_gemm_workspace = kGpuGemmWorkspaceBytes;
  const DryRunResult with = dry_run(q);
  EXPECT_FALSE(with.fits);
  EXPECT_NE(with.failure.find("cuda.gemm.workspace"), std::string::npos) << with.failure;
}

PlannerOptions gpu_options() {
  PlannerOptions o;
  o.spec = tiny_gpt();
  o.device = DeviceSpec::preset("h100-80g");
  o.budget = std::size_t{96} << 20;
  o.dtypes = {DType::kBF16};
  o.checkpoints = {Checkpointing::none()};
  o.offloads = {OffloadSwitches{}};
  o.max_micro_batch = 4096;
  o.threads = 1;
  return o;
}

TEST(GpuWorkspacePlan, PlannerModelsTheWorkspaceForGpusOnly) {
  const auto ws = category_index(Category::kWorkspace);
  const PlanResult gpu = plan(gpu_options());
  EXPECT_EQ(gpu.recommended.predicted.peaks.category_peaks[ws], kGpuGemmWorkspaceBytes);

  PlannerOptions o = gpu_options();
  o.gemm_workspace_bytes = 0;  // a GPU backend without a workspace: more room for activations
  const PlanResult bare = plan(o);
  EXPECT_EQ(bare.recommended.predicted.peaks.category_peaks[ws], 0u);
  EXPECT_GT(bare.recommended.policy.micro_batch, gpu.recommended.policy.micro_batch);

  // The cpu device keeps its own scratch (shape-dependent, far below 32 MiB), not cuBLASLt's.
  o = gpu_options();
  o.device = DeviceSpec::preset("cpu");
  const PlanResult cpu = plan(o);
  EXPECT_LT(cpu.recommended.predicted.peaks.category_peaks[ws], kGpuGemmWorkspaceBytes);
}

TEST(GpuWorkspacePlan, WithoutABudgetTheContextBytesComeOffTheDevice) {
  PlannerOptions o = gpu_options();
  o.spec.layers = 1;
  o.budget = 0;
  o.device.memory_bytes = std::size_t{512} << 20;
  o.device.context_bytes = 0;
  const PlanResult all = plan(o);
  EXPECT_EQ(all.recommended.budget, o.device.memory_bytes);
  o.device.context_bytes = std::size_t{384} << 20;  // e.g. what --measure-context found
  const PlanResult rest = plan(o);
  EXPECT_EQ(rest.recommended.budget, std::size_t{128} << 20);
  EXPECT_LT(rest.recommended.policy.micro_batch, all.recommended.policy.micro_batch);
  EXPECT_LE(rest.recommended.predicted.peaks.reserved, std::size_t{128} << 20);
}

}  // namespace
}  // namespace memfit
