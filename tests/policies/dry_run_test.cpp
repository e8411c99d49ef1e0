// Dry run: the proof that it predicts. dry_run(spec) (the real Trainer on the meta backend over
// null providers) and a real step of the same RunSpec through RunSetup on the CPU backend (what
// `memfit train` runs) reach the same peaks byte for byte: reserved, allocated, bytes by
// category at the peak, each category's own peak, construction's peak and the pinned host
// bytes of offload, for every policy combination the CLI accepts (dtype x checkpoint rule x
// offload x micro-batch or accumulation, uneven last micro-batches, explicit schedules) on
// several models. Under a budget, the largest micro-batch the dry run admits trains within it
// and one more raises OutOfMemory for real.
#include "policies/dry_run.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "core/executor.h"  // checkpoint_reads
#include "memory/error.h"
#include "memory/size.h"
#include "policies/run_setup.h"
#include "tests/core/exec_testutil.h"  // small_gpt

namespace memfit {
namespace {

using testing::small_gpt;

// A Llama small enough to run every policy on: grouped-query attention (4 heads on 2 kv heads
// of 8), q/k/v biases, rotary positions, SwiGLU, an untied head and a vocabulary four times
// the width (so the chunked loss runs in 4 chunks).
ModelSpec small_llama() {
  ModelSpec s = ModelSpec::preset("llama-micro");
  s.name = "small-llama";
  s.vocab = 128;
  s.seq_len = 32;
  s.qkv_bias = true;
  s.validate();
  return s;
}

// The same with Qwen3's attention instead: per-head q/k RMSNorms, no biases, a tied head.
ModelSpec small_qwen3() {
  ModelSpec s = small_llama();
  s.name = "small-qwen3";
  s.qkv_bias = false;
  s.qk_norm = true;
  s.tied_head = true;
  s.validate();
  return s;
}

struct Case {
  ModelSpec spec;
  DType dtype = DType::kF32;
  Checkpointing checkpoint;
  bool offload = false;
  std::int64_t micro = 0;  // policy.micro_batch (0: the whole batch)
  std::int64_t accum = 0;  // or policy.accum
  std::int64_t batch = 1;
  std::int64_t seq_len = 0;
  bool grads = false;    // gradient offload too (with the optimizer's)
  bool weights = false;  // weight offload too (with the optimizer's)
  bool acts = false;     // activation offload (independent of the others)
  LossMode loss = LossMode::kChunked;
  bool expandable = false;  // the allocator's expandable_segments

  RunSpec run(std::size_t budget) const {
    RunSpec r;
    r.model = spec;
    r.trainer.policy.dtype = dtype;
    r.trainer.policy.checkpoint = checkpoint;
    r.trainer.policy.offload.optimizer = offload || grads || weights;
    r.trainer.policy.offload.gradients = grads;
    r.trainer.policy.offload.weights = weights;
    r.trainer.policy.offload.activations = acts;
    r.trainer.policy.micro_batch = micro;
    r.trainer.policy.accum = accum;
    r.trainer.policy.loss = loss;
    r.batch = batch;
    r.seq_len = seq_len;
    r.alloc.budget = budget;
    r.alloc.expandable_segments = expandable;
    return r;
  }
  std::string str() const {
    return run(0).describe() + (expandable ? " expandable_segments" : "");
  }
};

// What a real run measured: construction's peak, the pinned host bytes and the step's
// (nullopt: OutOfMemory).
struct Measured {
  std::size_t setup_peak_reserved = 0;
  std::size_t host_pinned = 0;
  std::optional<StepResult> step;
  std::string oom;
};

Batch batch_of(const RunSpec& r) {
  Batch b;
  b.batch = r.batch;
  b.seq_len = r.resolved_seq_len();
  const auto n = static_cast<std::size_t>(b.batch * b.seq_len);
  for (std::size_t i = 0; i < n; ++i) {
    b.tokens.push_back(static_cast<std::int32_t>((i * 7 + 3) % r.model.vocab));
    b.targets.push_back(static_cast<std::int32_t>((i * 5 + 1) % r.model.vocab));
  }
  return b;
}

Measured real_step(const Case& c, std::size_t budget, int steps = 2) {
  const RunSpec spec = c.run(budget);
  Measured m;
  try {
    RunSetup run(spec);
    m.setup_peak_reserved =
        static_cast<std::size_t>(run.allocator().stats().reserved_bytes[kStatAll].peak);
    // `steps` steps (two: the second starts from the cache the first left, and later ones
    // repeat it); each figure the largest (PeakFigures::take_max), as `memfit train` reports.
    m.step = run.step(batch_of(spec));
    for (int k = 1; k < steps; ++k) m.step->peaks.take_max(run.step(batch_of(spec)).peaks);
    m.host_pinned = run.trainer().host_bytes();  // activation offload's room comes with a step
  } catch (const BudgetError& e) {  // RunSetup's word for an OutOfMemory of setup or step one
    m.oom = e.what();
  } catch (const OutOfMemory& e) {  // a later step's
    m.step.reset();
    m.oom = e.what();
  }
  return m;
}

void expect_same_peaks(const Case& c, const DryRunResult& d, const Measured& m) {
  SCOPED_TRACE(c.str());
  ASSERT_TRUE(d.fits) << d.failure;
  ASSERT_TRUE(m.step.has_value()) << m.oom;
  EXPECT_EQ(d.setup_peak_reserved, m.setup_peak_reserved);
  EXPECT_EQ(d.step.reserved, m.step->peaks.reserved);
  EXPECT_EQ(d.step.allocated, m.step->peaks.allocated);
  EXPECT_EQ(d.step.allocated_at_peak, m.step->peaks.allocated_at_peak);
  for (std::size_t k = 0; k < kCategoryCount; ++k) {
    const char* name = category_name(static_cast<Category>(k));
    EXPECT_EQ(d.step.at_peak[k], m.step->peaks.at_peak[k]) << name << " at the peak";
    EXPECT_EQ(d.step.category_peaks[k], m.step->peaks.category_peaks[k]) << name << "'s peak";
  }
  EXPECT_EQ(d.host_pinned, m.host_pinned);
  EXPECT_EQ(d.step.host_pinned, m.step->peaks.host_pinned);
  const int n = static_cast<int>(c.spec.layers);
  const bool checkpoints = !checkpoint_reads(c.checkpoint.schedule(n), n).empty();
  EXPECT_EQ(d.host_pinned > 0, c.offload || c.grads || c.weights || (c.acts && checkpoints));
  EXPECT_EQ(d.step, m.step->peaks);  // every field, in one
}

// Every combination the CLI's policy flags make, on a GPT and the gpt-micro preset, with
// micro-batches that leave an uneven last one and with --accum; then longer accumulations
// (past the micro-batches the dry run runs before it skips repeats), an MLP, and explicit
// schedules (a plan file's op list).
std::vector<Case> unbudgeted_cases() {
  const ModelSpec micro = ModelSpec::preset("gpt-micro");
  const ModelSpec mlp = ModelSpec::preset("mlp-tiny");
  const ModelSpec gpt = small_gpt(3);
  const std::vector<Checkpointing> rules = {Checkpointing::none(), Checkpointing::all(),
                                            Checkpointing::sqrt(), Checkpointing::every(2)};
  std::vector<Case> v;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Checkpointing& ck : rules) {
      // No offload, the optimizer's, with the gradients', with the gradients' and weights'.
      for (int off : {0, 1, 2, 3}) {
        const bool opt = off > 0, grads = off > 1, w = off > 2;
        v.push_back({gpt, dt, ck, opt, 5, 0, 12, 0, grads, w});   // 5, 5, 2
        v.push_back({micro, dt, ck, opt, 0, 0, 3, 0, grads, w});  // the whole batch at once
        v.push_back({gpt, dt, ck, opt, 0, 3, 7, 0, grads, w});    // --accum 3: 3, 3, 1
      }
    }
  }
  v.push_back({gpt, DType::kBF16, Checkpointing::sqrt(), false, 4, 0, 20, 32});
  v.push_back({gpt, DType::kF32, Checkpointing::none(), true, 6, 0, 19, 0});
  v.push_back({mlp, DType::kF32, Checkpointing::none(), false, 2, 0, 4, 32});
  v.push_back({mlp, DType::kBF16, Checkpointing::all(), true, 3, 0, 8, 16});
  v.push_back({gpt, DType::kBF16, Checkpointing::ops(Schedule::every(3, 2)), false, 4, 0, 9, 0});
  v.push_back({gpt, DType::kF16, Checkpointing::solved(Schedule::sqrt_n(3)), true, 3, 0, 6, 0});
  v.push_back({mlp, DType::kBF16, Checkpointing::all(), true, 3, 0, 8, 16, true});
  v.push_back({gpt, DType::kBF16, Checkpointing::every(2), true, 2, 0, 11, 0, true});
  // Weight offload without the gradients'.
  v.push_back({gpt, DType::kF32, Checkpointing::none(), true, 4, 0, 9, 0, false, true});
  v.push_back({gpt, DType::kBF16, Checkpointing::all(), true, 0, 3, 7, 0, false, true});
  v.push_back({micro, DType::kF16, Checkpointing::sqrt(), true, 0, 0, 3, 0, false, true});
  v.push_back({mlp, DType::kBF16, Checkpointing::every(2), true, 3, 0, 8, 16, false, true});
  v.push_back(
      {gpt, DType::kBF16, Checkpointing::ops(Schedule::every(3, 2)), true, 4, 0, 9, 0, true, true});
  // Activation offload: alone and with every other switch, under every rule (none: nothing to
  // move), micro-batches with an uneven last one, --accum, an MLP and an explicit schedule.
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Checkpointing& ck : rules) {
      v.push_back({gpt, dt, ck, false, 5, 0, 12, 0, false, false, true});
      v.push_back({gpt, dt, ck, true, 0, 3, 7, 0, true, true, true});
    }
  }
  // gpt-micro has 2 blocks: every:1 checkpoints x[0] (every:2 would be one segment, none's ops).
  v.push_back(
      {micro, DType::kBF16, Checkpointing::every(1), false, 0, 0, 3, 0, false, false, true});
  v.push_back({mlp, DType::kBF16, Checkpointing::all(), true, 3, 0, 8, 16, false, false, true});
  v.push_back({gpt, DType::kBF16, Checkpointing::ops(Schedule::every(3, 2)), true, 4, 0, 9, 0, true,
               false, true});
  // The Llama family under every rule and dtype, without offload and with every switch; the
  // whole-logits loss on both models.
  const ModelSpec llama = small_llama();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Checkpointing& ck : rules) {
      v.push_back({llama, dt, ck, false, 5, 0, 12, 0});
      v.push_back({llama, dt, ck, true, 0, 3, 7, 0, true, true, true});
    }
  }
  v.push_back({llama, DType::kBF16, Checkpointing::all(), true, 4, 0, 9, 16, true});
  const ModelSpec qwen3 = small_qwen3();
  for (const Checkpointing& ck : rules) {
    v.push_back({qwen3, DType::kBF16, ck, false, 5, 0, 12, 0});
    v.push_back({qwen3, DType::kF16, ck, true, 0, 3, 7, 0, true, true, true});
  }
  v.push_back({llama, DType::kF32, Checkpointing::none(), false, 5, 0, 12, 0, false, false, false,
               LossMode::kWhole});
  v.push_back({gpt, DType::kBF16, Checkpointing::all(), true, 5, 0, 12, 0, false, false, false,
               LossMode::kWhole});
  return v;
}

// In four parts (every fourth case each), so ctest runs them side by side.
class DryRunParts : public ::testing::TestWithParam<int> {};

TEST_P(DryRunParts, PeaksAndHostBytesEqualARealRunSetupStepOnTheCpuBackend) {
  const std::vector<Case> cases = unbudgeted_cases();
  for (std::size_t i = static_cast<std::size_t>(GetParam()); i < cases.size(); i += 4) {
    const DryRunResult d = dry_run(cases[i].run(0));
    expect_same_peaks(cases[i], d, real_step(cases[i], 0));
  }
}

INSTANTIATE_TEST_SUITE_P(DryRun, DryRunParts, ::testing::Range(0, 4));

// The same with expandable segments (ranges mapped page by page over NullProvider in the dry
// run, over HostProvider's mmap in the real one): every third case, in two parts.
class DryRunExpandableParts : public ::testing::TestWithParam<int> {};

TEST_P(DryRunExpandableParts, PeaksAndHostBytesEqualARealRunSetupStepOnTheCpuBackend) {
  std::vector<Case> cases = unbudgeted_cases();
  for (std::size_t i = static_cast<std::size_t>(GetParam()) * 3; i < cases.size(); i += 6) {
    cases[i].expandable = true;
    const DryRunResult d = dry_run(cases[i].run(0));
    expect_same_peaks(cases[i], d, real_step(cases[i], 0));
  }
}

INSTANTIATE_TEST_SUITE_P(DryRun, DryRunExpandableParts, ::testing::Range(0, 2));

// The second step starts from the cache the first left and can peak a block's rounding
// higher (gpt-tiny under the README's 64 MiB plan: 38.69 then 39.38 MiB allocated); the third
// and later repeat the second, so two dry-run steps predict every step.
TEST(DryRun, TwoStepsPredictEveryLaterStep) {
  std::vector<Case> cases = unbudgeted_cases();
  cases.resize(12);
  cases.push_back({ModelSpec::preset("gpt-micro"), DType::kBF16,
                   Checkpointing::ops(Schedule::every(2, 1)), true, 3, 0, 7, 0, true, true});
  for (const Case& c : cases) {
    const DryRunResult d = dry_run(c.run(0));
    expect_same_peaks(c, d, real_step(c, 0, /*steps=*/4));
    EXPECT_EQ(dry_run(c.run(0), 1).step.reserved <= d.step.reserved, true) << c.str();
  }
}

TEST(DryRun, TheBreakdownAtThePeakAddsUpToIt) {
  for (const Case& c : unbudgeted_cases()) {
    SCOPED_TRACE(c.str());
    const PeakFigures p = dry_run(c.run(0)).step;
    std::size_t sum = 0;
    for (std::size_t b : p.at_peak) sum += b;
    EXPECT_EQ(sum, p.allocated_at_peak);
    EXPECT_EQ(sum + p.cached(), p.reserved);
    EXPECT_LE(p.allocated_at_peak, p.allocated);
    for (std::size_t k = 0; k < kCategoryCount; ++k) EXPECT_LE(p.at_peak[k], p.category_peaks[k]);
  }
}

// The proof: under a budget, the largest micro-batch the dry run admits trains within the
// budget with the predicted peak, and one more sample raises OutOfMemory for real.
// In three parts (every third proof each), so ctest runs them side by side.
class DryRunProofs : public ::testing::TestWithParam<int> {};

TEST_P(DryRunProofs, AtTheLargestFittingMicroBatchARealStepFitsAndOneMoreDoesNot) {
  struct Proof {
    Case c;                   // c.batch = accum x micro (the micro-batch is searched)
    std::int64_t accum;       // micro-batches per step
    std::int64_t seed_micro;  // the budget is this micro-batch's unbudgeted peak + 1.5 MiB
  };
  const ModelSpec micro = ModelSpec::preset("gpt-micro");
  const ModelSpec mlp = ModelSpec::preset("mlp-tiny");
  const ModelSpec gpt = small_gpt(3);
  const std::vector<Proof> proofs = {
      {{micro, DType::kF32, Checkpointing::none(), false}, 2, 24},
      {{micro, DType::kBF16, Checkpointing::all(), true}, 1, 40},
      {{gpt, DType::kF32, Checkpointing::none(), false}, 2, 6},
      {{gpt, DType::kBF16, Checkpointing::all(), false}, 3, 12},
      {{gpt, DType::kBF16, Checkpointing::all(), false}, 6, 12},  // past the settling ones
      {{gpt, DType::kF16, Checkpointing::every(2), true}, 1, 9},
      {{gpt, DType::kBF16, Checkpointing::none(), true}, 2, 5},
      {{mlp, DType::kF32, Checkpointing::all(), false, 0, 0, 1, 32}, 1, 3},
      {{mlp, DType::kBF16, Checkpointing::sqrt(), true, 0, 0, 1, 32}, 1, 3},
      {{gpt, DType::kBF16, Checkpointing::all(), true, 0, 0, 1, 0, true}, 3, 12},
      {{micro, DType::kF16, Checkpointing::none(), true, 0, 0, 1, 0, true}, 1, 24},
      {{gpt, DType::kF32, Checkpointing::every(2), true, 0, 0, 1, 0, true}, 2, 6},
      {{gpt, DType::kBF16, Checkpointing::all(), true, 0, 0, 1, 0, true, true}, 3, 12},
      {{micro, DType::kF32, Checkpointing::none(), true, 0, 0, 1, 0, false, true}, 1, 24},
      {{gpt, DType::kF16, Checkpointing::sqrt(), true, 0, 0, 1, 0, true, true}, 2, 6},
      {{gpt, DType::kBF16, Checkpointing::all(), false, 0, 0, 1, 0, false, false, true}, 3, 12},
      {{micro, DType::kF32, Checkpointing::every(1), false, 0, 0, 1, 0, false, false, true}, 1, 24},
      {{gpt, DType::kBF16, Checkpointing::all(), true, 0, 0, 1, 0, true, true, true}, 2, 12},
      {{small_llama(), DType::kF32, Checkpointing::none(), false}, 2, 6},
      {{small_llama(), DType::kBF16, Checkpointing::all(), true, 0, 0, 1, 0, true}, 3, 12},
      {{small_llama(), DType::kBF16, Checkpointing::every(2), true, 0, 0, 1, 0, true, true, true},
       2,
       8},
      {{small_qwen3(), DType::kBF16, Checkpointing::all(), true, 0, 0, 1, 0, true, true}, 2, 8},
      // Expandable segments: the budget bounds mapped pages instead of segments.
      {{micro, DType::kF32, Checkpointing::none(), false, 0, 0, 1, 0, false, false, false,
        LossMode::kChunked, true},
       2,
       24},
      {{micro, DType::kBF16, Checkpointing::all(), true, 0, 0, 1, 0, true, true, true,
        LossMode::kChunked, true},
       1,
       40},
      {{gpt, DType::kBF16, Checkpointing::every(2), true, 0, 0, 1, 0, true, false, false,
        LossMode::kChunked, true},
       2,
       8},
  };
  auto with_micro = [](Case c, std::int64_t accum, std::int64_t b) {
    c.micro = b;
    c.batch = accum * b;
    return c;
  };
  std::printf("%-72s %10s %6s %14s %14s %8s\n", "case", "budget", "max", "predicted", "measured",
              "ratio");
  for (std::size_t k = static_cast<std::size_t>(GetParam()); k < proofs.size(); k += 3) {
    const Proof& p = proofs[k];
    Case c = with_micro(p.c, p.accum, p.seed_micro);
    const std::size_t budget = dry_run(c.run(0)).step.reserved + (std::size_t{3} << 19);
    // Largest fitting micro-batch by the dry run (a scan up from 1: these are small).
    // (first-step dry runs up, then down to what two steps fit: the planner's way)
    std::int64_t max = 0;
    DryRunResult at_max;
    for (std::int64_t b = 1; b <= 4 * p.seed_micro + 64; ++b) {
      c = with_micro(p.c, p.accum, b);
      if (!dry_run(c.run(budget), 1).fits) break;
      max = b;
    }
    for (; max > 0; --max) {
      c = with_micro(p.c, p.accum, max);
      at_max = dry_run(c.run(budget));
      if (at_max.fits) break;
    }
    c = with_micro(p.c, p.accum, max);
    SCOPED_TRACE(c.str() + " budget " + std::to_string(budget));
    ASSERT_GE(max, p.seed_micro);
    ASSERT_LT(max, 4 * p.seed_micro + 64) << "the scan never found a micro-batch that fails";
    const Measured fit = real_step(c, budget);
    ASSERT_TRUE(fit.step.has_value()) << fit.oom;
    EXPECT_LE(fit.step->peaks.reserved, budget);
    EXPECT_EQ(fit.step->peaks, at_max.step);  // within 1% asked; exact here
    EXPECT_EQ(fit.setup_peak_reserved, at_max.setup_peak_reserved);
    std::printf("%-72s %10s %6lld %14zu %14zu %8.5f\n", c.str().c_str(),
                format_bytes(budget).c_str(), static_cast<long long>(max), at_max.step.reserved,
                fit.step->peaks.reserved,
                static_cast<double>(fit.step->peaks.reserved) / at_max.step.reserved);
    c = with_micro(p.c, p.accum, max + 1);
    const DryRunResult over = dry_run(c.run(budget));
    EXPECT_FALSE(over.fits);
    EXPECT_GT(over.failed_request, 0u);
    const Measured oom = real_step(c, budget);
    EXPECT_FALSE(oom.step.has_value()) << "a real step at max + 1 fitted";
    EXPECT_FALSE(oom.oom.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(DryRun, DryRunProofs, ::testing::Range(0, 3));

TEST(DryRun, WorkCountsCoverEveryMicroBatchAndTheUnevenLastOne) {
  const ModelSpec gpt = small_gpt(3);
  Case c{gpt, DType::kBF16, Checkpointing::all(), false, 4, 0, 4};
  const DryRunResult one = dry_run(c.run(0));
  c.batch = 20;
  const DryRunResult five = dry_run(c.run(0));
  EXPECT_GT(one.gemm_flops, 0);
  EXPECT_DOUBLE_EQ(five.gemm_flops, 5 * one.gemm_flops);
  EXPECT_GT(five.bytes_moved, 4 * one.bytes_moved);
  EXPECT_LT(five.micro_batches_run, 5);  // the repeats were skipped, and still counted
  const DryRunResult single =
      dry_run(Case{gpt, DType::kBF16, Checkpointing::all(), false, 1, 0, 1}.run(0));
  c.batch = 9;  // 4, 4, 1
  const DryRunResult uneven = dry_run(c.run(0));
  EXPECT_DOUBLE_EQ(uneven.gemm_flops, 2 * one.gemm_flops + single.gemm_flops);
  // Accumulating changes no peak: the gradients are there either way.
  EXPECT_EQ(five.step.reserved, one.step.reserved);
}

// A step of more micro-batches than the dry run runs (it runs at most 64 and extrapolates the
// repeats): peaks still equal a real step's, under no budget and under one so tight that the
// allocator releases and retries; and a step of 10^9 micro-batches is predicted in the time
// of a few (the planner's --global-batch may be any size).
TEST(DryRun, ManyMicroBatchesArePredictedExactlyInBoundedTime) {
  const ModelSpec gpt = small_gpt(2);
  for (const Case& c : {Case{gpt, DType::kBF16, Checkpointing::all(), true, 1, 0, 100, 8},
                        Case{gpt, DType::kF16, Checkpointing::none(), false, 1, 0, 100, 8},
                        Case{gpt, DType::kF32, Checkpointing::every(2), true, 0, 90, 90, 8, true}}) {
    const DryRunResult free_run = dry_run(c.run(0), 2);
    EXPECT_LT(free_run.micro_batches_run, 64) << c.str();
    expect_same_peaks(c, free_run, real_step(c, 0));
    // Tight: the smallest budget the setup and one micro-batch fit in, plus a little.
    Case one = c;
    one.batch = 1;
    one.accum = c.accum > 0 ? 1 : 0;
    const DryRunResult small = dry_run(one.run(0), 2);
    const std::size_t budget = std::max(small.step.reserved, small.setup_peak_reserved) + 2 * kMiB;
    const DryRunResult tight = dry_run(c.run(budget), 2);
    const Measured m = real_step(c, budget);
    ASSERT_EQ(tight.fits, m.step.has_value()) << c.str() << ": " << tight.failure << m.oom;
    if (tight.fits) expect_same_peaks(c, tight, m);
  }
  Case huge{gpt, DType::kBF16, Checkpointing::all(), true, 1, 0, 1'000'000'000, 8};
  Case single = huge;
  single.batch = 1;
  const auto t0 = std::chrono::steady_clock::now();
  const DryRunResult d = dry_run(huge.run(0));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(d.fits) << d.failure;
  EXPECT_LE(d.micro_batches_run, 64);
  EXPECT_NEAR(d.gemm_flops / dry_run(single.run(0)).gemm_flops, 1e9, 1.0);
  EXPECT_EQ(d.step.reserved, dry_run(Case{huge.spec, huge.dtype, huge.checkpoint, true, 1, 0, 100,
                                          8}.run(0)).step.reserved);
  std::printf("a dry run of 10^9 micro-batches: %.3f s, %lld run\n", seconds,
              static_cast<long long>(d.micro_batches_run));
}

TEST(DryRun, OffloadKeepsNoOptimizerStateOnTheDeviceAndSaysWhatTheHostHolds) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Case c{small_gpt(3), dt, Checkpointing::none(), false, 0, 0, 4};
    const DryRunResult on_device = dry_run(c.run(0));
    c.offload = true;
    const DryRunResult off = dry_run(c.run(0));
    const auto opt = category_index(Category::kOptimizerState);
    EXPECT_GT(on_device.step.category_peaks[opt], 0u);
    EXPECT_EQ(off.step.category_peaks[opt], 0u);
    EXPECT_LT(off.step.allocated, on_device.step.allocated);
    EXPECT_EQ(on_device.host_pinned, 0u);
    // Masters, two moments and gradient staging in f32 (+ the weight staging for 16-bit
    // weights), each region 64-byte aligned: OffloadOptimizer's slab.
    const auto n = static_cast<std::size_t>(small_gpt(3).parameter_count());
    const std::size_t f32 = (n * 4 + 63) / 64 * 64;
    const std::size_t stage = dt == DType::kF32 ? 0 : n * 2;
    EXPECT_GE(off.host_pinned, 4 * f32 + stage);
    EXPECT_LT(off.host_pinned, 4 * f32 + stage + 64 * 64);
  }
}

// Gradient offload: the same host slab, and on the device only the bucket ring (two buckets
// of the largest block's gradients) and the tied wte's own buffer, not the model's gradients.
TEST(DryRun, GradientOffloadKeepsOnlyTheBucketRingOnTheDevice) {
  const ModelSpec spec = small_gpt(3);
  Case c{spec, DType::kBF16, Checkpointing::all(), true, 0, 0, 4};
  const DryRunResult opt = dry_run(c.run(0));
  c.grads = true;
  const DryRunResult grads = dry_run(c.run(0));
  ASSERT_TRUE(opt.fits && grads.fits);
  const auto g = category_index(Category::kGradient);
  EXPECT_EQ(grads.host_pinned, opt.host_pinned);  // the slab's gradient region was there already
  const auto all = static_cast<std::size_t>(spec.parameter_count()) * 4;
  EXPECT_GE(opt.step.category_peaks[g], all);
  // One block's gradients (its weights in f32) per bucket, two buckets, and wte.
  const std::size_t block =
      static_cast<std::size_t>(12 * spec.hidden * spec.hidden + 13 * spec.hidden) * 4;
  const std::size_t wte = static_cast<std::size_t>(spec.vocab * spec.hidden) * 4;
  EXPECT_GE(grads.step.category_peaks[g], 2 * block + wte);
  EXPECT_LT(grads.step.category_peaks[g], 2 * block + wte + 64 * 1024);
  EXPECT_LT(grads.step.category_peaks[g], opt.step.category_peaks[g]);
  EXPECT_LT(grads.step.allocated, opt.step.allocated);
  // And construction never holds more than the step (no device gradients made, then dropped).
  EXPECT_LE(grads.setup_peak_reserved, grads.step.reserved);
}

// Weight offload: the same host slab (the weight staging, or the masters for f32, are the host
// weights), and on the device only the buffer ring (two buffers of the largest unit's
// weights), not the model's weights; setup never holds more than the step.
TEST(DryRun, WeightOffloadKeepsOnlyTheBufferRingOnTheDevice) {
  const ModelSpec spec = small_gpt(3);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Case c{spec, dt, Checkpointing::all(), true, 0, 0, 4, 0, true};
    const DryRunResult grads = dry_run(c.run(0));
    c.weights = true;
    const DryRunResult all = dry_run(c.run(0));
    ASSERT_TRUE(grads.fits && all.fits);
    EXPECT_EQ(all.host_pinned, grads.host_pinned);
    const auto w = category_index(Category::kParameter);
    const std::size_t size = dtype_size(dt);
    EXPECT_GE(grads.step.category_peaks[w],
              static_cast<std::size_t>(spec.parameter_count()) * size);
    // The largest unit here is the embedding (wte + wpe) or the head (LayerNorm + tied wte)
    // when the vocabulary is large, else a block.
    const std::size_t block =
        static_cast<std::size_t>(12 * spec.hidden * spec.hidden + 13 * spec.hidden) * size;
    const std::size_t emb =
        static_cast<std::size_t>((spec.vocab + spec.seq_len) * spec.hidden) * size;
    const std::size_t unit = std::max(block, emb);
    EXPECT_GE(all.step.category_peaks[w], 2 * unit);
    EXPECT_LT(all.step.category_peaks[w], 2 * unit + 64 * 1024);
    EXPECT_LT(all.step.category_peaks[w], grads.step.category_peaks[w]);
    EXPECT_LT(all.step.allocated, grads.step.allocated);
    EXPECT_LE(all.setup_peak_reserved, all.step.reserved);
  }
}

TEST(DryRun, ABudgetBelowTheWeightsFailsInSetupWithTheRequest) {
  const Case c{small_gpt(3), DType::kF32, Checkpointing::none(), false, 0, 0, 1};
  const DryRunResult d = dry_run(c.run(1 << 20));  // below one 2 MiB small segment
  EXPECT_FALSE(d.fits);
  EXPECT_GT(d.failed_request, 0u);
  EXPECT_NE(d.failure.find("out of memory"), std::string::npos) << d.failure;
  EXPECT_EQ(d.step.reserved, 0u);  // the step never started
}

TEST(DryRun, BadSpecsAreClearErrors) {
  const Case c{small_gpt(3), DType::kF32, Checkpointing::none(), false, 2, 0, 4};
  auto expect_bad = [](const RunSpec& q, const std::string& needle) {
    try {
      (void)dry_run(q);
      ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  RunSpec q = c.run(0);
  q.trainer.policy.micro_batch = -1;
  expect_bad(q, "micro-batch -1");
  q = c.run(0);
  q.batch = 0;
  expect_bad(q, "batch 0");
  q = c.run(0);
  q.seq_len = 65;
  expect_bad(q, "seq_len 65: valid: 1 to 64");
  q = c.run(0);
  q.trainer.policy.micro_batch = 0;
  q.trainer.policy.accum = 5;  // 4 samples cannot make 5 micro-batches
  expect_bad(q, "5");
  q = c.run(0);
  q.trainer.policy.checkpoint = Checkpointing::optimal();  // not solved
  expect_bad(q, "solved for each micro-batch by the planner");
  q = c.run(0);
  q.trainer.policy.checkpoint = Checkpointing::ops(Schedule::none(5));  // 5 blocks, not 3
  EXPECT_THROW((void)dry_run(q), InvalidArgument);
  q = c.run(0);
  q.trainer.policy.offload.delayed_update = true;  // without the optimizer offloaded
  expect_bad(q, "delayed update");
}

}  // namespace
}  // namespace memfit
