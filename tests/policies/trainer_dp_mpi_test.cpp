// Data-parallel training (TrainerOptions::comm, ZeRO-0, 1 and 2) under mpirun
// (tests/CMakeLists.txt runs it with 2 and 3 ranks): each rank trains on its shard of every
// global batch, and the losses of 10 steps match a one-rank run of the same global batches
// (computed here, in each process) within 1e-6 relative, under several policies; every rank
// ends with the same weights, bit for bit; a run repeats its bits; each rank's peak is its
// dry run's to the byte; unequal shards are refused on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/cpu/cpu_backend.h"
#include "core/model.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "policies/dry_run.h"
#include "policies/run_setup.h"
#include "policies/trainer.h"
#include "tests/core/exec_testutil.h"

namespace memfit {
namespace {

constexpr std::int64_t kGlobalBatch = 6;  // 3 or 2 samples a rank
constexpr int kSteps = 10;

// A CPU "device" with its allocator and a model; members in construction order.
struct Rig {
  Rig(DType dt, bool workers, TrainerOptions o)
      : be(CpuBackendOptions{.worker_streams = workers}),
        alloc(host, {}, &be.stream_sync()),
        ctx{be, alloc, kDefaultStream, dt},
        model(testing::tiny_gpt_spec(3), ctx, Trainer::placement(o.policy, o.zero_stage)),
        trainer(model, ctx, with_dtype(o, dt)) {}
  static TrainerOptions with_dtype(TrainerOptions o, DType dt) {
    o.policy.dtype = dt;
    o.adamw.lr = 1e-3;
    return o;
  }
  CpuBackend be;
  HostProvider host;
  CachingAllocator alloc;
  LayerContext ctx;
  Model model;
  Trainer trainer;
};

// The global batches of a run: the same on every rank (the same seed).
std::vector<Batch> global_batches(std::int64_t seq_len) {
  Rng rng(42);
  std::vector<Batch> out;
  for (int s = 0; s < kSteps; ++s)
    out.push_back(testing::test_corpus().sample(kGlobalBatch, seq_len, rng));
  return out;
}

std::vector<char> weight_bits(Rig& run) {
  run.trainer.optimizer().flush(run.ctx);
  std::vector<char> out;
  for (Parameter* p : run.model.parameters()) {
    std::vector<char> buf(p->weight.view().nbytes());
    run.be.copy(run.ctx.stream, p->weight.view(),
                Tensor(buf.data(), p->shape, p->weight.view().dtype(), Device::kCpu));
    run.be.synchronize(run.ctx.stream);
    out.insert(out.end(), buf.begin(), buf.end());
  }
  return out;
}

struct Case {
  const char* name;
  DType dtype;
  // The loss's relative tolerance against one rank. f32: 1e-6 (the sums' order is the only
  // difference). bf16: 1e-4: its working weights are the f32 masters rounded to 8 bits of
  // mantissa, so a master one f32 ulp away can round to the next bf16 value (2^-8 relative),
  // and the steps after it carry that (measured: 5e-6 after 9 steps on 2 ranks).
  double tolerance;
  std::int64_t micro_batch;  // 0: the whole shard at once
  bool offload;              // optimizer offload (+ gradient offload under ZeRO-0), worker streams
  int zero = 0;              // TrainerOptions::zero_stage
};

class DataParallel : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    comm_ = make_communicator(be_);
    ASSERT_STREQ(comm_->name(), "mpi") << "run this test under mpirun with 2 or more ranks";
  }
  TrainerOptions options() const {
    TrainerOptions o;
    o.policy.micro_batch = GetParam().micro_batch;
    o.policy.offload.optimizer = GetParam().offload;
    o.policy.offload.gradients = GetParam().offload && GetParam().zero == 0;
    o.zero_stage = GetParam().zero;
    return o;
  }
  CpuBackend be_;
  std::unique_ptr<Communicator> comm_;
};

TEST_P(DataParallel, LossesMatchOneRankAndEveryRankEndsWithTheSameWeights) {
  const Case c = GetParam();
  const int n = comm_->size(), me = comm_->rank();
  ASSERT_EQ(kGlobalBatch % n, 0) << "run with 2 or 3 ranks";
  const std::vector<Batch> batches = global_batches(testing::tiny_gpt_spec(3).seq_len);

  TrainerOptions ref = options();
  ref.zero_stage = 0;
  Rig one(c.dtype, c.offload, ref);  // the one-rank reference, in this process
  std::vector<double> want;
  for (const Batch& b : batches) want.push_back(one.trainer.step(b).loss);

  TrainerOptions o = options();
  o.comm = comm_.get();
  Rig dp(c.dtype, c.offload, o);
  for (int s = 0; s < kSteps; ++s) {
    const StepResult r = dp.trainer.step(rank_rows(batches[s], me, n));
    EXPECT_EQ(r.tokens, kGlobalBatch * batches[s].seq_len);
    EXPECT_NEAR(r.loss, want[s], c.tolerance * std::abs(want[s]))
        << c.name << " step " << s + 1 << " on rank " << me << " of " << n;
  }
  // Every rank holds rank 0's weights, bit for bit.
  std::vector<char> mine = weight_bits(dp), root = mine;
  const auto halves = static_cast<std::int64_t>(root.size() / 2);  // weights: 2 or 4 bytes each
  comm_->broadcast(kDefaultStream, Tensor(root.data(), Shape{halves}, DType::kF16, Device::kCpu),
                   0);
  EXPECT_EQ(std::memcmp(mine.data(), root.data(), mine.size()), 0) << "rank " << me;
  // And the data-parallel run repeats its bits.
  Rig again(c.dtype, c.offload, o);
  for (int s = 0; s < kSteps; ++s) again.trainer.step(rank_rows(batches[s], me, n));
  EXPECT_EQ(weight_bits(again), mine) << "rank " << me;
}

INSTANTIATE_TEST_SUITE_P(
    Policies, DataParallel,
    ::testing::Values(Case{"f32", DType::kF32, 1e-6, 0, false},
                      Case{"bf16", DType::kBF16, 1e-4, 0, false},
                      Case{"f32_accumulated", DType::kF32, 1e-6, 1, false},
                      Case{"f32_offload", DType::kF32, 1e-6, 0, true},
                      Case{"f32_offload_accumulated", DType::kF32, 1e-6, 1, true},
                      Case{"zero1_f32", DType::kF32, 1e-6, 0, false, 1},
                      Case{"zero1_bf16", DType::kBF16, 1e-4, 0, false, 1},
                      Case{"zero2_f32", DType::kF32, 1e-6, 0, false, 2},
                      Case{"zero2_f32_accumulated", DType::kF32, 1e-6, 1, false, 2},
                      Case{"zero2_bf16", DType::kBF16, 1e-4, 0, false, 2},
                      Case{"zero1_offload_f32", DType::kF32, 1e-6, 0, true, 1},
                      Case{"zero2_offload_f32_accumulated", DType::kF32, 1e-6, 1, true, 2},
                      Case{"zero2_offload_bf16", DType::kBF16, 1e-4, 0, true, 2}),
    [](const auto& info) { return std::string(info.param.name); });

// Each rank of a real run (RunSetup: MPI under mpirun) reserves what the dry run of that rank
// predicts (SimulatedCommunicator on the meta backend), to the byte, under every ZeRO stage,
// with the gradient sums overlapping the backward (the default: they hold their gradients one
// stage longer, which the dry run predicts) and without.
TEST(DataParallelPeaks, EveryRanksPeakIsItsDryRunsToTheByte) {
  CpuBackend be;
  const std::unique_ptr<Communicator> probe = make_communicator(be);
  const int n = probe->size(), me = probe->rank();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int zero : {0, 1, 2}) {
      for (std::int64_t micro : {0, 1}) {
        for (bool overlap : {true, false}) {
          RunSpec r;
          r.model = testing::tiny_gpt_spec(3);
          r.trainer.policy.dtype = dt;
          r.trainer.policy.micro_batch = micro;
          r.trainer.policy.offload.optimizer = micro == 1;  // ZeRO-Offload with accumulation
          // ZeRO-0 streams the summed gradients to the host too (what the overlap defers).
          r.trainer.policy.offload.gradients = micro == 1 && zero == 0;
          r.trainer.overlap_comm = overlap;
          r.trainer.zero_stage = zero;
          r.batch = kGlobalBatch;
          r.ranks = n;
          r.rank = me;
          SCOPED_TRACE(r.describe());
          const DryRunResult d = dry_run(r);
          ASSERT_TRUE(d.fits) << d.failure;
          RunSetup run(r);
          ASSERT_EQ(run.trainer().sharding().ranks, n);
          const std::vector<Batch> batches = global_batches(r.resolved_seq_len());
          PeakFigures m = run.step(rank_rows(batches[0], me, n)).peaks;
          m.take_max(run.step(rank_rows(batches[1], me, n)).peaks);
          EXPECT_EQ(m.reserved, d.step.reserved) << "rank " << me;
          EXPECT_EQ(m.allocated, d.step.allocated) << "rank " << me;
          EXPECT_EQ(m.category_peaks, d.step.category_peaks) << "rank " << me;
          EXPECT_EQ(run.trainer().host_bytes(), d.host_pinned) << "rank " << me;
        }
      }
    }
  }
}

TEST(DataParallelShards, UnequalShardsAreRefusedOnEveryRank) {
  CpuBackend be;
  std::unique_ptr<Communicator> comm = make_communicator(be);
  ASSERT_STREQ(comm->name(), "mpi");
  TrainerOptions o;
  o.comm = comm.get();
  Rig dp(DType::kF32, false, o);
  Rng rng(7);
  const Batch b = testing::test_corpus().sample(1 + comm->rank(), dp.model.spec().seq_len, rng);
  try {
    dp.trainer.step(b);
    ADD_FAILURE() << "unequal shards were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the ranks' shards differ"), std::string::npos)
        << e.what();
  }
  comm->barrier();  // every rank refused before any gradient exchange: still in step
}

}  // namespace
}  // namespace memfit
