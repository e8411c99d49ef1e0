// ZeRO-1/2 (policies/zero_adamw.h, TrainerOptions::zero_stage) in one process: at one rank a
// sharded optimizer trains exactly as the device one (bit for bit without accumulation,
// within 1e-6 relative with it, where the sums' order differs); one rank of N simulated
// (RunSetupOptions::simulate_ranks) reserves what the dry run of that rank predicts, to the
// byte; its optimizer state (and under ZeRO-2 its gradients) shrink with N; a state file
// refuses another stage or rank; bad combinations are refused by name. The multi-rank runs
// under mpirun are tests/policies/trainer_dp_mpi_test.cpp.
#include "policies/zero_adamw.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "memory/error.h"
#include "policies/dry_run.h"
#include "policies/run_setup.h"
#include "policies/train_state.h"
#include "tests/core/exec_testutil.h"

namespace memfit {
namespace {

RunSpec spec_of(DType dt, int zero, int ranks, int rank, std::int64_t micro = 0,
                bool offload = false) {
  RunSpec r;
  r.trainer.policy.offload.optimizer = offload;
  r.model = testing::tiny_gpt_spec(3);
  r.trainer.policy.dtype = dt;
  r.trainer.policy.micro_batch = micro;
  r.trainer.zero_stage = zero;
  r.trainer.adamw.lr = 1e-3;
  r.batch = 8;
  r.ranks = ranks;
  r.rank = rank;
  return r;
}

Batch sample(const RunSpec& r, std::uint64_t seed) {
  Rng rng(seed);
  return testing::test_corpus().sample(r.rank_batch(), r.resolved_seq_len(), rng);
}

std::vector<char> weight_bits(RunSetup& run) {
  std::vector<char> out;
  for (Parameter* p : run.model().parameters()) {
    const Tensor w = p->weight.view();
    const char* b = static_cast<const char*>(w.raw());
    out.insert(out.end(), b, b + w.nbytes());
  }
  return out;
}

struct Trained {
  std::vector<double> losses;
  std::vector<char> weights;
};

Trained train(const RunSpec& r, int steps) {
  RunSetup run(r);
  Trained t;
  for (int s = 0; s < steps; ++s) t.losses.push_back(run.step(sample(r, 100 + s)).loss);
  t.weights = weight_bits(run);
  return t;
}

TEST(ZeroAdamW, OneRankTrainsAsTheDeviceOptimizerBitForBit) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Trained want = train(spec_of(dt, 0, 1, 0), 4);
    for (int zero : {1, 2}) {
      for (bool offload : {false, true}) {  // the CPU AdamW's arithmetic is the device's
        SCOPED_TRACE(std::string(dtype_name(dt)) + " ZeRO-" + std::to_string(zero) +
                     (offload ? " offload" : ""));
        const Trained got = train(spec_of(dt, zero, 1, 0, 0, offload), 4);
        EXPECT_EQ(got.losses, want.losses);
        EXPECT_TRUE(got.weights == want.weights) << "the weights differ";
      }
    }
  }
}

TEST(ZeroAdamW, OneRankAccumulatedMatchesWithinTheSumsOrder) {
  // ZeRO-2 adds each micro-batch's reduced gradient to the shard, where the device optimizer's
  // backward adds into the running sum: the same terms in another order.
  const Trained want = train(spec_of(DType::kF32, 0, 1, 0, 2), 5);
  for (int zero : {1, 2}) {
    const Trained got = train(spec_of(DType::kF32, zero, 1, 0, 2), 5);
    for (std::size_t s = 0; s < want.losses.size(); ++s) {
      EXPECT_NEAR(got.losses[s], want.losses[s], 1e-6 * std::abs(want.losses[s]))
          << "ZeRO-" << zero << " step " << s + 1;
    }
  }
}

// What one simulated rank measures over two steps (the larger of each figure).
PeakFigures measured(const RunSpec& r) {
  RunSetup run(r, RunSetupOptions{.simulate_ranks = true});
  PeakFigures p = run.step(sample(r, 7)).peaks;
  p.take_max(run.step(sample(r, 8)).peaks);
  return p;
}

TEST(ZeroAdamW, ASimulatedRankReservesWhatItsDryRunPredictsToTheByte) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int zero : {0, 1, 2}) {
      for (int ranks : {2, 4}) {
        for (std::int64_t micro : {0, 1}) {
          const int rank = ranks - 1;       // the last rank: the smallest chunks
          const bool offload = micro == 1;  // optimizer offload with the accumulated runs
          const RunSpec r = spec_of(dt, zero, ranks, rank, micro, offload);
          SCOPED_TRACE(r.describe());
          const DryRunResult d = dry_run(r);
          ASSERT_TRUE(d.fits) << d.failure;
          const PeakFigures m = measured(r);
          EXPECT_EQ(d.step.reserved, m.reserved);
          EXPECT_EQ(d.step.allocated, m.allocated);
          EXPECT_EQ(d.step.at_peak, m.at_peak);
          EXPECT_EQ(d.step.category_peaks, m.category_peaks);
          EXPECT_EQ(d.host_pinned, m.host_pinned);
          EXPECT_EQ(d.step.host_at_peak, m.host_at_peak);
        }
      }
    }
  }
}

TEST(ZeroAdamW, OptimizerStateAndGradientsShrinkWithTheRanks) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const RunSpec one = spec_of(dt, 0, 1, 0);
    const std::size_t params = static_cast<std::size_t>(one.model.parameter_count());
    const auto opt_of = [](const DryRunResult& d) {
      return d.step.category_peaks[category_index(Category::kOptimizerState)];
    };
    const auto grad_of = [](const DryRunResult& d) {
      return d.step.category_peaks[category_index(Category::kGradient)];
    };
    const DryRunResult base = dry_run(one);
    // Masters (16-bit only) and two moments, FP32: 8 or 12 bytes per parameter at one rank.
    const std::size_t k = dt == DType::kF32 ? 8 : 12;
    EXPECT_GE(opt_of(base), k * params);
    std::printf("%s: optimizer state / gradient peak bytes per rank\n", dtype_name(dt));
    std::printf("  ZeRO-0 N=1: %zu / %zu\n", opt_of(base), grad_of(base));
    for (int ranks : {2, 4}) {
      const DryRunResult z1 = dry_run(spec_of(dt, 1, ranks, 0));
      RunSpec serial = spec_of(dt, 2, ranks, 0);
      serial.trainer.overlap_comm = false;
      const DryRunResult z2 = dry_run(serial);
      const DryRunResult z2_overlap = dry_run(spec_of(dt, 2, ranks, 0));
      std::printf("  N=%d: ZeRO-1 %zu / %zu, ZeRO-2 %zu / %zu (overlapped: %zu gradient)\n", ranks,
                  opt_of(z1), grad_of(z1), opt_of(z2), grad_of(z2), grad_of(z2_overlap));
      // Overlap holds a stage's gradients until the next stage is done: at most the two
      // largest stages' (a block's, here) more, never fewer.
      const ModelSpec& m = serial.model;
      const std::size_t block =
          static_cast<std::size_t>(m.parameter_count() - (m.vocab + m.seq_len) * m.hidden) /
          static_cast<std::size_t>(m.layers);
      EXPECT_GE(grad_of(z2_overlap), grad_of(z2));
      EXPECT_LE(grad_of(z2_overlap), grad_of(z2) + 4 * block + 16 * 1024);
      EXPECT_EQ(opt_of(z2_overlap), opt_of(z2));
      // State: rank 0's chunks (the largest), each rounded up by the allocator (512 B).
      EXPECT_GE(opt_of(z1), k * params / ranks);
      EXPECT_LE(static_cast<double>(opt_of(z1)),
                static_cast<double>(opt_of(base)) * (1.0 / ranks + 0.15));
      EXPECT_EQ(opt_of(z2), opt_of(z1));
      // ZeRO-1 holds every gradient; ZeRO-2 its shards and the stages in flight.
      EXPECT_GE(grad_of(z1), 4 * params);
      EXPECT_LT(grad_of(z2), grad_of(z1));
    }
  }
}

// A failure at any allocation of a step (an OutOfMemory) leaves the weights, the sharded
// optimizer state and the lent gradients as they were, and the retried step equals a step
// that never failed, under ZeRO-1 and 2, with and without optimizer offload, accumulated.
TEST(ZeroAdamW, AFailureAtAnyAllocationOfAStepChangesNothing) {
  for (int zero : {1, 2}) {
    for (bool offload : {false, true}) {
      const RunSpec r = spec_of(DType::kF32, zero, 2, 0, 2, offload);
      SCOPED_TRACE(r.describe());
      RunSetup run(r, RunSetupOptions{.simulate_ranks = true});
      RunSetup ref(r, RunSetupOptions{.simulate_ranks = true});
      const Batch b = sample(r, 5);
      const std::vector<char> before = weight_bits(run);
      int failures = 0;
      for (std::int64_t k = 1;; ++k) {
        run.allocator().fail_allocation(k);
        bool failed = false;
        try {
          run.trainer().step(b);
        } catch (const OutOfMemory&) {
          failed = true;
        }
        const bool reached = run.allocator().pending_fault() == 0;
        run.allocator().fail_allocation(0);
        if (!failed) {
          EXPECT_FALSE(reached) << "allocation " << k << " failed but the step went on";
          break;
        }
        ++failures;
        ASSERT_TRUE(weight_bits(run) == before) << "allocation " << k << " changed the weights";
        EXPECT_EQ(run.trainer().steps(), 0);
        for (Parameter* p : run.model().parameters()) {
          EXPECT_EQ(p->grad_on_device(), zero == 1) << p->name << " after allocation " << k;
        }
      }
      EXPECT_GT(failures, 10);
      // The loop's last step ran whole: it must equal the reference's first.
      const StepResult want = ref.trainer().step(b);
      EXPECT_TRUE(weight_bits(run) == weight_bits(ref)) << "the retried step differs";
      EXPECT_EQ(run.trainer().steps(), want.step);
    }
  }
}

TEST(ZeroAdamW, AStateFileRefusesAnotherStageOrRank) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("memfit_zero_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "z1.mfstate").string();
  {
    RunSpec r = spec_of(DType::kF32, 1, 2, 0);
    RunSetup run(r, RunSetupOptions{.simulate_ranks = true});
    run.step(sample(r, 1));
    run.trainer().save(path);
    // The same rank resumes.
    RunSetup same(r, RunSetupOptions{.simulate_ranks = true});
    EXPECT_NO_THROW(same.trainer().load(path));
    EXPECT_EQ(same.trainer().steps(), 1);
  }
  for (const auto& [zero, rank] : {std::pair{2, 0}, std::pair{1, 1}}) {
    RunSpec r = spec_of(DType::kF32, zero, 2, rank);
    RunSetup other(r, RunSetupOptions{.simulate_ranks = true});
    try {
      other.trainer().load(path);
      ADD_FAILURE() << "loaded a ZeRO-1 rank 0 file as ZeRO-" << zero << " rank " << rank;
    } catch (const TrainStateError& e) {
      EXPECT_NE(std::string(e.what()).find("ZeRO-1 rank 0 of 2"), std::string::npos) << e.what();
    }
    EXPECT_EQ(other.trainer().steps(), 0);
  }
  std::filesystem::remove_all(dir);
}

TEST(ZeroAdamW, BadCombinationsAreRefusedByName) {
  RunSpec r = spec_of(DType::kF32, 2, 2, 0);
  r.trainer.policy.offload.optimizer = true;
  r.trainer.policy.offload.gradients = true;
  try {
    r.validate();
    ADD_FAILURE() << "ZeRO-2 with gradient offload validated";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ZeRO-2 with offload optimizer,gradients"),
              std::string::npos)
        << e.what();
  }
  r.trainer.policy.offload.gradients = false;
  EXPECT_NO_THROW(r.validate());  // optimizer offload alone is ZeRO-Offload's form
  r = spec_of(DType::kF32, 3, 2, 0);
  EXPECT_THROW(r.validate(), InvalidArgument);
  r = spec_of(DType::kF32, 1, 3, 0);  // a global batch of 8 over 3 ranks
  EXPECT_THROW(r.validate(), InvalidArgument);
  r = spec_of(DType::kF32, 1, 2, 2);
  EXPECT_THROW(r.validate(), InvalidArgument);
  // A model built with device masters is not one ZeroAdamW can shard.
  r = spec_of(DType::kBF16, 0, 1, 0);
  RunSetup run(r);
  LocalCommunicator local(run.backend());
  EXPECT_THROW(ZeroAdamW(run.model().parameters(), r.trainer.adamw, 1,
                         run.model().backward_stages(), local, run.context()),
               InvalidArgument);
}

}  // namespace
}  // namespace memfit
