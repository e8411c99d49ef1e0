// Activation offload (ActivationStash, driven by the Trainer through the executor's stash
// hooks): training with the checkpoints on the host is bit-identical to keeping them on the
// device, for every dtype, with and without accumulation, under every checkpoint rule, alone and
// with every other offload switch, on worker streams (the copies really run beside the compute);
// resume matches; the device holds fewer checkpoints; the host room is within the host budget;
// the stash by hand round-trips bits, fetches ahead and refuses misuse clearly.
#include "policies/offload_activation_stash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/executor.h"
#include "memory/error.h"
#include "memory/null_provider.h"
#include "policies/dry_run.h"
#include "policies/run_setup.h"
#include "policies/trainer.h"
#include "tests/core/backend_testutil.h"  // expect_invalid
#include "tests/core/exec_testutil.h"
#include "tests/policies/offload_testutil.h"

namespace memfit {
namespace {

using Rig = testing::OffloadRig;

constexpr int kBlocks = 3;

struct Trained {
  std::vector<double> losses;
  double eval = 0;
  std::vector<std::vector<unsigned char>> state;  // every optimizer state tensor after the run
  std::size_t activation_peak = 0;
  std::size_t host_bytes = 0;
  std::int64_t stashed = 0;  // checkpoints the stash took over the run
};

TrainerOptions options(const MemoryPolicy& policy) {
  TrainerOptions o;
  o.policy = policy;
  o.adamw.lr = 3e-3;
  return o;
}

Trained read_out(Trainer& t, LayerContext& ctx, const Batch& eval) {
  Trained out;
  out.eval = t.evaluate(eval);
  t.optimizer().flush(ctx);
  for (const StateTensor& st : t.optimizer().state()) {
    out.state.push_back(testing::bytes_of(st.tensor));
  }
  out.host_bytes = t.host_bytes();
  return out;
}

// `steps` steps of batch 6 from the bundled corpus under `policy`, then one evaluation.
Trained train(const MemoryPolicy& policy, int steps) {
  Rig r(policy.dtype, policy.offload.any());
  Model m(testing::tiny_gpt_spec(kBlocks), r.ctx, Trainer::placement(policy));
  Trainer t(m, r.ctx, options(policy));
  Rng data(9);
  Trained out;
  std::vector<double> losses;
  std::size_t peak = 0;
  for (int i = 0; i < steps; ++i) {
    const StepResult s = t.step(testing::test_corpus().sample(6, 32, data));
    losses.push_back(s.loss);
    peak = std::max(peak, s.peaks.category_peaks[category_index(Category::kActivation)]);
    EXPECT_EQ(s.peaks.host_pinned, t.host_bytes());
  }
  Rng eval_data(4);
  out = read_out(t, r.ctx, testing::test_corpus().sample(5, 32, eval_data));
  out.losses = losses;
  out.activation_peak = peak;
  return out;
}

using Case = testing::OffloadCase;

class ActivationOffload : public ::testing::TestWithParam<Case> {};

TEST_P(ActivationOffload, TrainsBitForBitAsWithTheCheckpointsOnTheDevice) {
  const Case& c = GetParam();
  MemoryPolicy p;
  p.dtype = c.dtype;
  p.checkpoint = Checkpointing::parse(c.checkpoint, kBlocks);
  p.accum = c.accum;
  const bool checkpoints = !checkpoint_reads(p.checkpoint.schedule(kBlocks), kBlocks).empty();
  const Trained plain = train(p, 5);
  p.offload.activations = true;
  const Trained acts = train(p, 5);
  ASSERT_EQ(plain.losses.size(), 5u);
  EXPECT_NE(plain.losses.front(), plain.losses.back()) << "the model did not train";
  EXPECT_EQ(acts.losses, plain.losses);
  EXPECT_EQ(acts.eval, plain.eval);
  EXPECT_TRUE(acts.state == plain.state) << "weights or moments differ from the plain run";
  EXPECT_LE(acts.activation_peak, plain.activation_peak);
  // The room: one (rows x 32 x hidden) checkpoint per slot, rows the largest micro-batch's, in
  // the compute dtype.
  const std::vector<std::int64_t> sizes = p.micro_batches(6);
  const auto rows = static_cast<std::size_t>(*std::max_element(sizes.begin(), sizes.end()));
  const std::size_t one = rows * 32 * testing::tiny_gpt_spec(kBlocks).hidden * dtype_size(c.dtype);
  EXPECT_EQ(acts.host_bytes > 0, checkpoints);
  if (checkpoints) EXPECT_GE(acts.host_bytes, one);
  if (std::string(c.checkpoint) == "all") {
    // x0, x1, x2 held at the head without offload; only the latest, x2, with it.
    EXPECT_LT(acts.activation_peak, plain.activation_peak);
    EXPECT_EQ(acts.host_bytes, 3 * one);
  }
  // With every other switch: the same bits as those switches without activation offload.
  p.offload.optimizer = p.offload.gradients = p.offload.weights = true;
  const Trained all = train(p, 5);
  p.offload.activations = false;
  const Trained others = train(p, 5);
  EXPECT_EQ(all.losses, plain.losses);
  EXPECT_EQ(all.eval, others.eval);
  EXPECT_TRUE(all.state == others.state);
  EXPECT_LE(all.activation_peak, others.activation_peak);
  EXPECT_EQ(all.host_bytes, others.host_bytes + acts.host_bytes);
}

INSTANTIATE_TEST_SUITE_P(Policies, ActivationOffload, ::testing::ValuesIn(testing::offload_cases()),
                         testing::offload_case_name);

// More blocks: checkpoint all on 6 blocks keeps x0 .. x5; offloaded, the device holds the
// latest of them in the forward and at the head, and in the backward the one being read plus
// the one fetched ahead.
TEST(ActivationOffload, ManyCheckpointsLeaveTheDevice) {
  MemoryPolicy p;
  p.dtype = DType::kBF16;
  p.checkpoint = Checkpointing::all();
  Rig r(p.dtype, true);
  const int n = 6;
  std::vector<double> losses[2];
  std::size_t peaks[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    p.offload.activations = k == 1;
    Model m(testing::tiny_gpt_spec(n), r.ctx, Trainer::placement(p));
    Trainer t(m, r.ctx, options(p));
    Rng data(3);
    for (int i = 0; i < 3; ++i) {
      const StepResult s = t.step(testing::test_corpus().sample(8, 32, data));
      losses[k].push_back(s.loss);
      peaks[k] = std::max(peaks[k], s.peaks.category_peaks[category_index(Category::kActivation)]);
    }
  }
  EXPECT_EQ(losses[1], losses[0]);
  // At least n - 2 checkpoints of 8 x 32 x hidden bf16 fewer at the peak.
  const std::size_t one = 8 * 32 * testing::tiny_gpt_spec(n).hidden * 2;
  EXPECT_GE(peaks[0], peaks[1] + (n - 2) * one) << peaks[0] << " vs " << peaks[1];
}

// Resuming an activation-offloaded run from a saved state continues it bit for bit.
TEST(ActivationOffload, ResumeIsBitExact) {
  MemoryPolicy p;
  p.dtype = DType::kBF16;
  p.accum = 2;
  p.checkpoint = Checkpointing::every(2);
  p.offload.activations = true;
  const Trained straight = train(p, 4);
  const std::string path =
      (std::filesystem::temp_directory_path() / "memfit_activation_offload_resume.mfstate")
          .string();
  Rng data(9);
  {
    Rig r(p.dtype, true);
    Model m(testing::tiny_gpt_spec(kBlocks), r.ctx, Trainer::placement(p));
    Trainer t(m, r.ctx, options(p));
    for (int i = 0; i < 2; ++i) (void)t.step(testing::test_corpus().sample(6, 32, data));
    t.save(path);
  }
  Rig r(p.dtype, true);
  Model m(testing::tiny_gpt_spec(kBlocks), r.ctx, Trainer::placement(p));
  TrainerOptions o = options(p);
  o.seed = 77;  // the state file decides the weights, not the seed
  Trainer t(m, r.ctx, o);
  t.load(path);
  std::vector<double> losses;
  for (int i = 0; i < 2; ++i)
    losses.push_back(t.step(testing::test_corpus().sample(6, 32, data)).loss);
  EXPECT_EQ(losses, std::vector<double>(straight.losses.begin() + 2, straight.losses.end()));
  Rng eval_data(4);
  const Trained resumed = read_out(t, r.ctx, testing::test_corpus().sample(5, 32, eval_data));
  EXPECT_TRUE(resumed.state == straight.state);
  EXPECT_EQ(resumed.eval, straight.eval);
  std::filesystem::remove(path);
}

// The checkpoints' room counts against the host budget beside the optimizer's slab: over it,
// the first step fails before anything runs, saying what it needs, and the trainer stays as it
// was; RunSetup turns it into a HostBudgetError naming the need.
TEST(ActivationOffload, TheRoomIsWithinTheHostBudget) {
  MemoryPolicy p;
  p.checkpoint = Checkpointing::all();
  p.offload.activations = true;
  Rig r(p.dtype, false);
  Model m(testing::tiny_gpt_spec(kBlocks), r.ctx, Trainer::placement(p));
  TrainerOptions o = options(p);
  const std::size_t room = 3 * 6 * 32 * testing::tiny_gpt_spec(kBlocks).hidden * 4;
  o.host_budget = room - 1;
  Trainer t(m, r.ctx, o);
  Rng data(9);
  const Batch b = testing::test_corpus().sample(6, 32, data);
  try {
    (void)t.step(b);
    ADD_FAILURE() << "a step over the host budget ran";
  } catch (const OutOfMemory& e) {
    EXPECT_TRUE(e.info().host);
    EXPECT_EQ(e.info().requested_bytes, room);
    EXPECT_EQ(e.info().budget_bytes, room - 1);
    EXPECT_NE(std::string(e.what()).find("host budget"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.steps(), 0);
  EXPECT_EQ(t.host_bytes(), 0u);
  // A smaller batch fits the same budget.
  EXPECT_NO_THROW((void)t.step(testing::test_corpus().sample(3, 32, data)));
  EXPECT_EQ(t.host_bytes(), room / 2);

  RunSpec spec;
  spec.model = testing::tiny_gpt_spec(kBlocks);
  spec.trainer = o;
  spec.batch = 6;
  spec.seq_len = 32;
  RunSetup run(spec);
  try {
    (void)run.step(b);
    ADD_FAILURE() << "a RunSetup step over the host budget ran";
  } catch (const HostBudgetError& e) {
    EXPECT_EQ(e.need(), room);
    EXPECT_EQ(e.budget(), room - 1);
  }
}

// ---- the stash by hand --------------------------------------------------------------------

struct StashRig {
  StashRig() : rig(DType::kF32, true), stash(rig.ctx, host) {}
  Act filled(float v, std::int64_t n = 1000) {
    Act a = rig.ctx.make(Shape{n}, DType::kF32, Category::kActivation, "x");
    rig.be.fill(rig.ctx.stream, a->view(), v);
    return a;
  }
  float first(const Act& a) {
    rig.be.synchronize(rig.ctx.stream);
    float v = 0;
    std::memcpy(&v, a->view().raw(), sizeof v);
    return v;
  }
  Rig rig;
  HostProvider host;
  ActivationStash stash;
};

TEST(ActivationStash, PutAndTakeGiveTheSameBitsAndFetchOneAhead) {
  StashRig s;
  s.stash.reserve(s.rig.ctx, {0, 2, 4, 2}, 1000 * 4, 0, 0);
  EXPECT_EQ(s.stash.host_bytes(), 3u * 4032);  // 4000 rounded up to 64 bytes, three slots
  for (int i : {0, 2, 4}) {
    Act x = s.filled(1.5f + static_cast<float>(i));
    s.stash.put(s.rig.ctx, i, x);
    EXPECT_EQ(x, nullptr) << "slot " << i << " was not taken";
  }
  EXPECT_EQ(s.stash.puts(), 3);
  const std::size_t held = s.rig.alloc.stats().allocated_bytes[kStatAll].current;
  EXPECT_LT(held, 2u * 4096) << "more than the latest checkpoint stayed on the device";
  // The latest (4) is still on the device: no fetch; 2 is fetched ahead.
  const Act four = s.stash.take(s.rig.ctx, 4, 2);
  EXPECT_EQ(s.stash.fetches(), 1);
  EXPECT_EQ(s.first(four), 5.5f);
  const Act two = s.stash.take(s.rig.ctx, 2, -1);
  EXPECT_EQ(s.stash.fetches(), 1);
  EXPECT_EQ(s.first(two), 3.5f);
  const Act zero = s.stash.take(s.rig.ctx, 0, -1);  // not fetched ahead: fetched now
  EXPECT_EQ(s.stash.fetches(), 2);
  EXPECT_EQ(s.first(zero), 1.5f);
  EXPECT_TRUE(s.stash.idle());
  // The same room serves the next micro-batch.
  s.stash.reserve(s.rig.ctx, {0, 2, 4}, 500 * 4, 0, 0);
  EXPECT_EQ(s.stash.host_bytes(), 3u * 4032);
}

TEST(ActivationStash, ASharedCheckpointStaysWithItsHolders) {
  StashRig s;
  s.stash.reserve(s.rig.ctx, {1}, 4000, 0, 0);
  Act x = s.filled(2.0f);
  const Act other = x;  // a layer's saved state, say: the memory would not be freed
  s.stash.put(s.rig.ctx, 1, x);
  EXPECT_NE(x, nullptr);
  EXPECT_TRUE(s.stash.idle());
  EXPECT_EQ(s.stash.puts(), 0);
}

TEST(ActivationStash, ResetAfterAnErrorDropsEverything) {
  StashRig s;
  s.stash.reserve(s.rig.ctx, {0, 1}, 4000, 0, 0);
  for (int i : {0, 1}) {
    Act x = s.filled(1.0f);
    s.stash.put(s.rig.ctx, i, x);
  }
  (void)s.stash.take(s.rig.ctx, 1, 0);  // 0 fetched ahead, then the step fails
  s.stash.reset(s.rig.ctx);
  EXPECT_TRUE(s.stash.idle());
  s.rig.be.synchronize(s.rig.ctx.stream);
  EXPECT_EQ(s.rig.alloc.stats().allocated_bytes[kStatAll].current, 0u);
}

TEST(ActivationStash, MisuseIsAClearError) {
  StashRig s;
  Act x = s.filled(1.0f);
  testing::expect_invalid([&] { s.stash.put(s.rig.ctx, 0, x); }, {"no room for that slot"});
  s.stash.reserve(s.rig.ctx, {0}, 400, 0, 0);
  testing::expect_invalid([&] { s.stash.put(s.rig.ctx, 0, x); }, {"over the slot's room"});
  testing::expect_invalid([&] { (void)s.stash.take(s.rig.ctx, 0, -1); }, {"not stashed"});
  testing::expect_invalid([&] { s.stash.reserve(s.rig.ctx, {-1}, 4, 0, 0); }, {"x index >= 0"});
  Act small = s.filled(1.0f, 100);
  s.stash.put(s.rig.ctx, 0, small);
  Act again = s.filled(1.0f, 100);
  testing::expect_invalid([&] { s.stash.put(s.rig.ctx, 0, again); }, {"already stashed"});
  testing::expect_invalid(
      [&] {
        s.stash.reserve(s.rig.ctx, {0, 1}, 400, 0, 0);
      },
      {"between micro-batches"});
  (void)s.stash.take(s.rig.ctx, 0, -1);
  // Over the host budget beside what others pinned: nothing changes.
  try {
    s.stash.reserve(s.rig.ctx, {0, 1}, 6400, 10000, 1000);
    ADD_FAILURE() << "a reserve over the host budget passed";
  } catch (const OutOfMemory& e) {
    EXPECT_TRUE(e.info().host);
    EXPECT_EQ(e.info().requested_bytes, 1000u + 2 * 6400);
  }
  EXPECT_EQ(s.stash.host_bytes(), 448u);
}

// The dry run's providers: a NullProvider host, the meta backend; the same sequence, no bits.
TEST(ActivationStash, RunsOnTheMetaBackendForDryRuns) {
  RunSpec spec;
  spec.model = testing::tiny_gpt_spec(kBlocks);
  spec.trainer.policy.checkpoint = Checkpointing::all();
  spec.trainer.policy.offload.activations = true;
  spec.batch = 4;
  spec.seq_len = 32;
  const DryRunResult d = dry_run(spec);
  ASSERT_TRUE(d.fits) << d.failure;
  EXPECT_EQ(d.host_pinned, 3u * 4 * 32 * spec.model.hidden * 4);
  spec.trainer.policy.offload.activations = false;
  EXPECT_LT(d.step.category_peaks[category_index(Category::kActivation)],
            dry_run(spec).step.category_peaks[category_index(Category::kActivation)]);
}

}  // namespace
}  // namespace memfit
