// Planner: the max micro-batch of every candidate is exact (its dry run fits, one more does
// not), the recommended plan trains for real on the CPU backend at the predicted peak under the
// budget, throughput mode reaches the global batch and ranks by predicted time, ZeRO lowers the
// per-rank bytes, and bad requests are clear errors.
#include "policies/planner.h"

#include <gtest/gtest.h>

#include <string>

#include "core/cpu/cpu_backend.h"
#include "core/model.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "policies/dry_run.h"

namespace memfit {
namespace {

ModelSpec small_gpt() {
  ModelSpec s;
  s.name = "small-gpt";
  s.vocab = 512;
  s.seq_len = 64;
  s.layers = 4;
  s.hidden = 64;
  s.heads = 4;
  return s;
}

PlannerOptions options(std::size_t budget) {
  PlannerOptions o;
  o.spec = small_gpt();
  o.device = DeviceSpec::preset("cpu");
  o.budget = budget;
  o.max_micro_batch = 256;
  return o;
}

DryRunRequest request_of(const Plan& p, std::int64_t micro, std::size_t budget) {
  DryRunRequest q;
  q.spec = p.model;
  q.policy = Policy{p.dtype, p.checkpoint, p.offload};
  q.schedule = Schedule::parse(p.checkpoint, static_cast<int>(p.model.layers));
  q.micro_batch = micro;
  q.accum = 1;
  q.seq_len = p.seq_len;
  q.alloc_conf.budget = budget;
  return q;
}

constexpr std::size_t kBudget = std::size_t{40} << 20;

TEST(Planner, EveryCandidateIsTheExactLargestMicroBatch) {
  const PlanResult r = plan(options(kBudget));
  ASSERT_FALSE(r.candidates.empty());
  EXPECT_GT(r.dry_runs, 0);
  for (const Plan& p : r.candidates) {
    SCOPED_TRACE(std::string(dtype_name(p.dtype)) + " " + p.checkpoint +
                 (p.offload ? " offload" : ""));
    EXPECT_EQ(p.accum_steps, 1);
    EXPECT_EQ(p.global_batch, p.micro_batch);
    EXPECT_LE(p.predicted.peak_reserved, kBudget);
    const DryRunResult at = dry_run(request_of(p, p.micro_batch, kBudget));
    EXPECT_TRUE(at.fits);
    EXPECT_EQ(at.peak_reserved, p.predicted.peak_reserved);
    if (p.micro_batch < 256) EXPECT_FALSE(dry_run(request_of(p, p.micro_batch + 1, kBudget)).fits);
    EXPECT_GT(p.predicted.step_seconds, 0);
    EXPECT_GT(p.predicted.tokens_per_second, 0);
  }
  // Best first: the largest micro-batch is recommended.
  for (const Plan& p : r.candidates) EXPECT_LE(p.micro_batch, r.recommended.micro_batch);
  EXPECT_FALSE(r.recommended.why.empty());
  EXPECT_NE(r.recommended.why.find(std::to_string(r.recommended.micro_batch)), std::string::npos);
  // Checkpointing every block beats none in samples (same dtype and offload).
  auto find = [&](DType dt, const std::string& ck) -> const Plan* {
    for (const Plan& p : r.candidates) {
      if (p.dtype == dt && p.checkpoint == ck && !p.offload) return &p;
    }
    return nullptr;
  };
  const Plan* none = find(DType::kF32, "none");
  const Plan* all = find(DType::kF32, "all");
  ASSERT_TRUE(none && all);
  EXPECT_GT(all->micro_batch, none->micro_batch);
  // The optimal solver's schedule is written as an op list Schedule::parse reads back.
  for (const Plan& p : r.candidates) {
    if (p.checkpoint == "none" || p.checkpoint == "all" || p.checkpoint == "sqrt") continue;
    EXPECT_NO_THROW((void)Schedule::parse(p.checkpoint, 4)) << p.checkpoint;
    const Plan* n = find(p.dtype, "none");
    if (n && !p.offload) EXPECT_GE(p.micro_batch, n->micro_batch);
  }
}

TEST(Planner, TheRecommendedPlanTrainsForRealAtThePredictedPeak) {
  for (std::size_t budget : {std::size_t{24} << 20, std::size_t{40} << 20}) {
    PlannerOptions o = options(budget);
    o.solvers = {"none", "all", "optimal"};
    const PlanResult r = plan(o);
    const Plan& p = r.recommended;
    SCOPED_TRACE(p.to_yaml());
    CpuBackend be(CpuBackendOptions{.worker_streams = p.offload});
    HostProvider host;
    AllocatorConfig conf;
    conf.budget = budget;
    CachingAllocator alloc(host, conf, &be.stream_sync());
    LayerContext ctx{be, alloc, kDefaultStream, p.dtype};
    Model model(p.model, ctx);
    Trainer trainer(model, ctx, p.trainer_options());
    Batch b;
    b.batch = p.global_batch;
    b.seq_len = p.seq_len;
    for (std::int64_t i = 0; i < b.batch * b.seq_len; ++i) {
      b.tokens.push_back(static_cast<std::int32_t>(i % 509));
      b.targets.push_back(static_cast<std::int32_t>((i * 3) % 509));
    }
    const StepResult s = trainer.step(b);
    EXPECT_LE(s.peak_reserved, budget);
    EXPECT_EQ(s.peak_reserved, p.predicted.peak_reserved);
    EXPECT_EQ(s.peak_allocated, p.predicted.peak_allocated);
  }
}

TEST(Planner, ThroughputModeReachesTheGlobalBatchFastestFirst) {
  PlannerOptions o = options(kBudget);
  o.global_batch = 100;
  o.solvers = {"none", "all", "sqrt"};
  const PlanResult r = plan(o);
  ASSERT_FALSE(r.candidates.empty());
  double prev = 0;
  for (const Plan& p : r.candidates) {
    EXPECT_EQ(p.global_batch, 100);
    EXPECT_EQ(p.accum_steps, (100 + p.micro_batch - 1) / p.micro_batch);
    EXPECT_LE(p.predicted.peak_reserved, kBudget);
    EXPECT_GE(p.predicted.step_seconds, prev);
    prev = p.predicted.step_seconds;
  }
  EXPECT_NE(r.recommended.why.find("fastest"), std::string::npos) << r.recommended.why;
  // The accumulation the plan runs fits: its dry run with the uneven last micro-batch.
  const Plan& p = r.recommended;
  DryRunRequest q = request_of(p, p.micro_batch, kBudget);
  q.accum = p.accum_steps;
  const std::int64_t last = 100 - (p.accum_steps - 1) * p.micro_batch;
  q.last_micro_batch = last == p.micro_batch ? 0 : last;
  EXPECT_TRUE(dry_run(q).fits);
}

TEST(Planner, ZeroShardingLowersPerRankBytes) {
  PlannerOptions o = options(kBudget);
  o.dtypes = {DType::kBF16};
  o.solvers = {"none"};
  o.offload = {false};
  const Plan one = plan(o).recommended;
  o.ranks = 4;
  o.zero_stage = 2;
  const Plan four = plan(o).recommended;
  EXPECT_EQ(four.ranks, 4);
  EXPECT_EQ(four.zero_stage, 2);
  EXPECT_GE(four.micro_batch, one.micro_batch);
  EXPECT_EQ(four.global_batch, four.micro_batch * 4);
  const auto opt = category_index(Category::kOptimizerState);
  EXPECT_LT(four.predicted.peak_by_category[opt], one.predicted.peak_by_category[opt]);
  EXPECT_LE(four.predicted.peak_reserved, kBudget);
}

void expect_error(const PlannerOptions& o, const std::string& needle) {
  try {
    (void)plan(o);
    ADD_FAILURE() << "no error; expected '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Planner, BadRequestsAreClearErrors) {
  PlannerOptions o = options(std::size_t{1} << 20);
  expect_error(o, "below what the weights need even with every policy on");
  o = options(kBudget);
  o.seq_len = 65;
  expect_error(o, "seq_len 65 is above the model's maximum 64");
  o = options(kBudget);
  o.ranks = 3;
  o.global_batch = 100;
  expect_error(o, "cannot be split over 3 ranks");
  o = options(kBudget);
  o.solvers = {"everything"};
  expect_error(o, "checkpoint solver 'everything'");
  // Weights fit, one sample does not: each combination says how much it needs.
  o = options(kBudget);
  o.spec.seq_len = 1024;
  o.spec.vocab = 50257;
  o.budget = std::size_t{100} << 20;  // weights ~60 MiB; one sample's logits ~200 MiB
  expect_error(o, "nothing fits");
}

}  // namespace
}  // namespace memfit
