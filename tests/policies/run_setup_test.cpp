// RunSetup: the library's run setup trains a RunSpec on the CPU backend with the budget on the
// allocator and the GEMM scratch inside it, records on request, and turns a budget the run
// does not fit into a BudgetError whose diagnosis comes from dry runs and names no CLI flag.
#include "policies/run_setup.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "memory/size.h"
#include "policies/dry_run.h"
#include "tests/core/exec_testutil.h"  // small_gpt

namespace memfit {
namespace {

RunSpec small_run() {
  RunSpec r;
  r.model = testing::small_gpt(2);
  r.trainer.policy.dtype = DType::kBF16;
  r.trainer.policy.micro_batch = 2;
  r.batch = 4;
  r.seq_len = 32;
  return r;
}

Batch batch_of(const RunSpec& r) {
  Batch b;
  b.batch = r.batch;
  b.seq_len = r.resolved_seq_len();
  for (std::int64_t i = 0; i < b.batch * b.seq_len; ++i) {
    b.tokens.push_back(static_cast<std::int32_t>((i * 11) % r.model.vocab));
    b.targets.push_back(static_cast<std::int32_t>((i * 13 + 1) % r.model.vocab));
  }
  return b;
}

TEST(RunSetup, TrainsTheSpecWithItsBudgetAndScratchOnTheAllocator) {
  RunSpec spec = small_run();
  spec.alloc.budget = 64 * kMiB;
  RunSetup run(spec);
  EXPECT_EQ(run.runtime().kind, DeviceKind::kCpu);
  EXPECT_EQ(run.allocator().budget(), 64 * kMiB);
  EXPECT_EQ(run.context().dtype, DType::kBF16);
  EXPECT_EQ(run.trainer().options().policy, spec.trainer.policy);
  EXPECT_EQ(run.model().parameter_count(), spec.model.parameter_count());
  EXPECT_EQ(run.recorder(), nullptr);
  const StepResult r = run.step(batch_of(spec));
  EXPECT_EQ(r.micro_batches, 2);
  EXPECT_TRUE(std::isfinite(r.loss));
  // bf16 GEMMs widen their operands in scratch taken from the budgeted allocator.
  EXPECT_GT(r.peaks.category_peaks[category_index(Category::kWorkspace)], 0u);
  EXPECT_LE(r.peaks.reserved, spec.alloc.budget);
  EXPECT_EQ(r.peaks, dry_run(spec).step);
}

TEST(RunSetup, RecordsWhenAskedAndReportsWhatItSaw) {
  const RunSpec spec = small_run();
  RunSetup run(spec, {.record = true});
  ASSERT_NE(run.recorder(), nullptr);
  (void)run.step(batch_of(spec));
  const ProfileReport rep = run.finish_report(1);
  EXPECT_EQ(rep.model, spec.model.name);
  EXPECT_EQ(rep.backend, "cpu");
  EXPECT_EQ(rep.steps, 1);
  EXPECT_FALSE(rep.recording.events.empty());
  EXPECT_GT(rep.recording.peak_reserved, 0u);
}

TEST(RunSetup, ABudgetTooSmallIsABudgetErrorWithDryRunAlternatives) {
  RunSpec spec = small_run();
  spec.batch = 32;
  spec.trainer.policy.micro_batch = 0;  // the whole batch at once
  spec.trainer.policy.dtype = DType::kF32;
  const DryRunResult free_run = dry_run(spec);
  const std::size_t need = free_run.need_reserved();
  // Room for the weights, far from enough for the step (the dry run agrees).
  spec.alloc.budget = free_run.setup_peak_reserved + 2 * kMiB;
  ASSERT_LT(spec.alloc.budget, need);
  ASSERT_FALSE(dry_run(spec).fits);
  try {
    RunSetup run(spec);
    (void)run.step(batch_of(spec));
    FAIL() << "trained over budget";
  } catch (const BudgetError& e) {
    const BudgetDiagnosis& d = e.diagnosis();
    EXPECT_EQ(d.when, "step one");
    EXPECT_EQ(d.budget, spec.alloc.budget);
    EXPECT_EQ(d.need, need);
    EXPECT_TRUE(d.dry_run_error.empty()) << d.dry_run_error;
    ASSERT_FALSE(d.alternatives.empty());
    bool some_fit = false;
    for (const BudgetDiagnosis::Alternative& a : d.alternatives) {
      SCOPED_TRACE(a.label);
      RunSpec s = a.spec;
      s.alloc.budget = 0;
      EXPECT_EQ(a.need, dry_run(s).need_reserved());  // each figure is that spec's dry run
      EXPECT_EQ(a.fits, a.need <= spec.alloc.budget);
      some_fit = some_fit || a.fits;
    }
    EXPECT_TRUE(some_fit);
    const std::string m = e.what();
    EXPECT_NE(m.find("is too small for step one"), std::string::npos) << m;
    EXPECT_NE(m.find("checkpoint all"), std::string::npos) << m;
    EXPECT_EQ(m.find("--"), std::string::npos) << "a library error names a CLI flag: " << m;
  }
  // Below the weights: construction itself is refused the same way.
  spec.alloc.budget = 2 * kMiB;
  try {
    RunSetup run(spec);
    FAIL() << "built a model over budget";
  } catch (const BudgetError& e) {
    EXPECT_EQ(e.diagnosis().when, "the model and optimizer");
  }
}

// Offload's pinned host memory is budgeted too: the dry run and the real setup agree on what
// the slab takes; one byte less than that is a HostBudgetError (before anything is pinned)
// and a dry run that does not fit, saying what the slab would take; exactly that fits.
TEST(RunSetup, AHostBudgetBelowTheOffloadSlabIsAHostBudgetError) {
  RunSpec spec = small_run();
  spec.trainer.policy.offload = OffloadSwitches::parse("all");
  const DryRunResult free_run = dry_run(spec);
  ASSERT_TRUE(free_run.fits);
  const std::size_t need = free_run.host_pinned;
  ASSERT_GT(need, 0u);
  // bf16 with everything offloaded: 18 bytes per parameter, the 64-byte alignment aside.
  const auto n = static_cast<std::size_t>(spec.model.parameter_count());
  EXPECT_GE(need, 18 * n);
  EXPECT_LT(need, 18 * n + 5 * 64);
  spec.trainer.host_budget = need;
  EXPECT_TRUE(dry_run(spec).fits);
  {
    RunSetup run(spec);
    EXPECT_EQ(run.trainer().host_bytes(), need);
    (void)run.step(batch_of(spec));
  }
  spec.trainer.host_budget = need - 1;
  const DryRunResult over = dry_run(spec);
  EXPECT_FALSE(over.fits);
  EXPECT_EQ(over.host_pinned, need);
  EXPECT_NE(over.failure.find("exceed the host budget"), std::string::npos) << over.failure;
  try {
    RunSetup run(spec);
    ADD_FAILURE() << "a host budget one byte short was accepted";
  } catch (const HostBudgetError& e) {
    EXPECT_EQ(e.need(), need);
    EXPECT_EQ(e.budget(), need - 1);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("pinned host memory (18.0 bytes per parameter)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("valid: a host budget of " + format_bytes(need) + " or more"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("--"), std::string::npos) << "the library names no CLI flag: " << msg;
  }
  // Without offload nothing is pinned: any host budget fits.
  spec.trainer.policy.offload = OffloadSwitches{};
  spec.trainer.host_budget = 1;
  EXPECT_TRUE(dry_run(spec).fits);
}

// The default host budget: available memory less a tenth of the total (at least 1 GiB), less
// the device budget on the CPU backend; a floor of 1 MiB; no limit when unknown.
TEST(RunSetup, TheDefaultHostBudgetLeavesAMargin) {
  constexpr std::size_t GiB = kGiB;
  const HostMemory m{.total = 100 * GiB, .available = 60 * GiB};
  EXPECT_EQ(default_host_budget(DeviceKind::kCuda, 8 * GiB, m), 50 * GiB);
  EXPECT_EQ(default_host_budget(DeviceKind::kCpu, 8 * GiB, m), 42 * GiB);
  const HostMemory small{.total = 4 * GiB, .available = 3 * GiB};
  EXPECT_EQ(default_host_budget(DeviceKind::kCuda, 0, small), 2 * GiB);  // the 1 GiB floor
  EXPECT_EQ(default_host_budget(DeviceKind::kCpu, 3 * GiB, small), kMiB);
  EXPECT_EQ(default_host_budget(DeviceKind::kCpu, 0, HostMemory{}), 0u);
  const HostMemory here = host_memory();
  EXPECT_GT(here.total, 0u);
  EXPECT_LE(here.available, here.total);
}

TEST(RunSetup, BadSpecsAndAnAbsentGpuAreClearErrors) {
  RunSpec spec = small_run();
  spec.seq_len = 65;
  EXPECT_THROW(RunSetup{spec}, InvalidArgument);
  spec = small_run();
  spec.trainer.policy.checkpoint = Checkpointing::optimal();  // never solved
  EXPECT_THROW(RunSetup{spec}, InvalidArgument);
  std::string why;
  if (!cuda_runtime_available(&why)) {
    spec = small_run();
    spec.device = DeviceKind::kCuda;
    try {
      RunSetup run(spec);
      ADD_FAILURE() << "a cuda run without a GPU";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("valid here: cpu"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace memfit
