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

DryRunRequest request(std::size_t gpu_ws) {
  DryRunRequest q;
  q.spec = tiny_gpt();
  q.policy = Policy{DType::kBF16, "none", false};
  q.schedule = Schedule::parse("none", 2);
  q.micro_batch = 2;
  q.accum = 2;
  q.cpu_gemm_scratch = false;
  q.gpu_gemm_workspace = gpu_ws;
  return q;
}

TEST(GpuWorkspacePlan, DryRunHoldsExactlyOneWorkspaceAtItsPeak) {
  const auto ws = category_index(Category::kWorkspace);
  const DryRunResult none = dry_run(request(0));
  const DryRunResult gpu = dry_run(request(kGpuGemmWorkspaceBytes));
  ASSERT_TRUE(none.fits);
  ASSERT_TRUE(gpu.fits);
  EXPECT_EQ(none.peak_by_category[ws], 0u);
  EXPECT_EQ(gpu.peak_by_category[ws], kGpuGemmWorkspaceBytes);  // one GEMM at a time
  // Every other category is unchanged; the total grows by at most one workspace.
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    if (c != ws) EXPECT_EQ(gpu.peak_by_category[c], none.peak_by_category[c]) << c;
  }
  EXPECT_GT(gpu.peak_allocated, none.peak_allocated);
  EXPECT_LE(gpu.peak_allocated, none.peak_allocated + kGpuGemmWorkspaceBytes);
  EXPECT_GE(gpu.peak_reserved, none.peak_reserved);
  // The GPU workspace replaces the CPU scratch: asking for both still gives the fixed size.
  DryRunRequest both = request(kGpuGemmWorkspaceBytes);
  both.cpu_gemm_scratch = true;
  EXPECT_EQ(dry_run(both).peak_by_category[ws], kGpuGemmWorkspaceBytes);
}

TEST(GpuWorkspacePlan, ABudgetWithoutRoomForTheWorkspaceDoesNotFit) {
  DryRunRequest q = request(0);
  const DryRunResult without = dry_run(q);
  ASSERT_TRUE(without.fits);
  // Enough for the step without a workspace, short of one workspace on top of it.
  q.alloc_conf.budget = without.peak_reserved + kGpuGemmWorkspaceBytes / 2;
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
  o.solvers = {"none"};
  o.offload = {false};
  o.max_micro_batch = 4096;
  o.threads = 1;
  return o;
}

TEST(GpuWorkspacePlan, PlannerModelsTheWorkspaceForGpusOnly) {
  const auto ws = category_index(Category::kWorkspace);
  const PlanResult gpu = plan(gpu_options());
  EXPECT_EQ(gpu.recommended.predicted.peak_by_category[ws], kGpuGemmWorkspaceBytes);

  PlannerOptions o = gpu_options();
  o.gemm_workspace_bytes = 0;  // a GPU backend without a workspace: more room for activations
  const PlanResult bare = plan(o);
  EXPECT_EQ(bare.recommended.predicted.peak_by_category[ws], 0u);
  EXPECT_GT(bare.recommended.micro_batch, gpu.recommended.micro_batch);

  // The cpu device keeps its own scratch (shape-dependent, far below 32 MiB), not cuBLASLt's.
  o = gpu_options();
  o.device = DeviceSpec::preset("cpu");
  const PlanResult cpu = plan(o);
  EXPECT_LT(cpu.recommended.predicted.peak_by_category[ws], kGpuGemmWorkspaceBytes);
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
  EXPECT_LT(rest.recommended.micro_batch, all.recommended.micro_batch);
  EXPECT_LE(rest.recommended.predicted.peak_reserved, std::size_t{128} << 20);
}

}  // namespace
}  // namespace memfit
