// Weight offload (WeightRing inside OffloadOptimizer, driven by the Trainer): training with the
// working weights on the host is bit-identical to training with them on the device, for every
// dtype, with and without accumulation, checkpointing and gradient offload, for any number of
// buffers, on worker streams (the fetches really run beside the compute); evaluation and resume
// match; the device holds only the ring; a unit still in a buffer is not fetched again; misuse
// is a clear error.
#include "policies/offload_weight_ring.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "memory/error.h"
#include "policies/offload_optimizer.h"
#include "policies/trainer.h"
#include "tests/core/backend_testutil.h"  // expect_invalid
#include "tests/core/exec_testutil.h"
#include "tests/policies/offload_testutil.h"

namespace memfit {
namespace {

using Rig = testing::OffloadRig;

// The working weight's bits wherever it lives (the device's, or the host copy under weight
// offload).
std::vector<unsigned char> weight_bits(const Parameter& p) {
  return testing::bytes_of(p.weight_on_device() ? p.weight.view() : p.host_weight);
}

struct Trained {
  std::vector<double> losses;
  double eval = 0;
  std::vector<std::vector<unsigned char>> weights;  // every working weight after the run
  std::vector<std::vector<unsigned char>> state;    // masters and moments
  std::size_t parameter_peak = 0;
  std::int64_t fetches = 0;  // the weight ring's, over the run
};

constexpr int kBlocks = 3;

TrainerOptions options(const MemoryPolicy& policy, int buffers) {
  TrainerOptions o;
  o.policy = policy;
  o.adamw.lr = 3e-3;
  o.weight_buffers = buffers;
  return o;
}

Trained read_out(Trainer& t, Model& m, LayerContext& ctx, const Batch& eval) {
  Trained out;
  out.eval = t.evaluate(eval);
  t.optimizer().flush(ctx);
  for (Parameter* p : m.parameters()) out.weights.push_back(weight_bits(*p));
  for (const StateTensor& st : t.optimizer().state()) {
    if (st.tensor.device() == Device::kCpu) out.state.push_back(testing::bytes_of(st.tensor));
  }
  if (const auto* opt = dynamic_cast<const OffloadOptimizer*>(&t.optimizer())) {
    if (opt->weight_ring() != nullptr) out.fetches = opt->weight_ring()->fetches();
  }
  return out;
}

// `steps` steps of batch 6 from the bundled corpus under `policy`, then one evaluation.
Trained train(MemoryPolicy policy, int steps, int buffers = kDefaultWeightBuffers) {
  Rig r(policy.dtype, policy.offload.any());
  Model m(testing::tiny_gpt_spec(kBlocks), r.ctx, Trainer::placement(policy));
  Trainer t(m, r.ctx, options(policy, buffers));
  Rng data(9);
  std::vector<double> losses;
  std::size_t peak = 0;
  for (int i = 0; i < steps; ++i) {
    const StepResult s = t.step(testing::test_corpus().sample(6, 32, data));
    losses.push_back(s.loss);
    peak = std::max(peak, s.peaks.category_peaks[category_index(Category::kParameter)]);
  }
  Rng eval_data(4);
  Trained out = read_out(t, m, r.ctx, testing::test_corpus().sample(5, 32, eval_data));
  out.losses = losses;
  out.parameter_peak = peak;
  return out;
}

using Case = testing::OffloadCase;

class WeightOffload : public ::testing::TestWithParam<Case> {};

TEST_P(WeightOffload, TrainsBitForBitAsWithTheWeightsOnTheDevice) {
  const Case& c = GetParam();
  MemoryPolicy p;
  p.dtype = c.dtype;
  p.checkpoint = Checkpointing::parse(c.checkpoint, kBlocks);
  p.accum = c.accum;
  const Trained plain = train(p, 5);
  p.offload.optimizer = true;
  const Trained opt = train(p, 5);
  p.offload.weights = true;
  const Trained weights = train(p, 5);
  p.offload.gradients = true;
  const Trained all = train(p, 5);
  ASSERT_EQ(plain.losses.size(), 5u);
  EXPECT_NE(plain.losses.front(), plain.losses.back()) << "the model did not train";
  for (const Trained* t : {&weights, &all}) {
    EXPECT_EQ(t->losses, plain.losses);
    EXPECT_EQ(t->eval, plain.eval);
    EXPECT_TRUE(t->weights == plain.weights) << "working weights differ from the plain run";
    EXPECT_TRUE(t->state == opt.state) << "masters or moments differ from optimizer offload";
    EXPECT_LT(t->parameter_peak, opt.parameter_peak);
    EXPECT_GT(t->fetches, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, WeightOffload, ::testing::ValuesIn(testing::offload_cases()),
                         testing::offload_case_name);

// The ring's size changes when the fetches happen and how many there are, never the numbers;
// the device holds buffers x the largest unit's weights.
TEST(WeightOffload, AnyNumberOfBuffersGivesTheSameBits) {
  MemoryPolicy p;
  p.dtype = DType::kBF16;
  p.accum = 2;
  p.offload.optimizer = p.offload.weights = true;
  const Trained one = train(p, 3, 1);
  const Trained two = train(p, 3, 2);
  const Trained three = train(p, 3, 3);
  EXPECT_EQ(one.losses, two.losses);
  EXPECT_EQ(three.losses, two.losses);
  EXPECT_TRUE(one.state == two.state && three.state == two.state);
  EXPECT_LT(one.parameter_peak, two.parameter_peak);
  EXPECT_LT(two.parameter_peak, three.parameter_peak);
  // The largest unit is a block: 12C^2 + 13C bf16 values, C = 32, plus slice alignment and the
  // allocator's rounding.
  const std::size_t block = (12 * 32 * 32 + 13 * 32) * 2;
  EXPECT_GE(two.parameter_peak, one.parameter_peak + block);
  EXPECT_LT(two.parameter_peak - one.parameter_peak, block + 4096);
  // More buffers keep more units: never more fetches.
  EXPECT_GE(one.fetches, two.fetches);
  EXPECT_GE(two.fetches, three.fetches);
}

// With two buffers and no checkpointing, a micro-batch uses 0, 1, 2, 3, head, 3, 2, 1, 0:
// the last block is still held after the head (9 uses, 8 fetches); the next micro-batch starts
// with the two units the last one ended with (0 and 1: 6 fetches). A step's update makes every
// buffer stale.
TEST(WeightOffload, AUnitStillInABufferIsNotFetchedAgain) {
  EXPECT_EQ(weight_uses(Schedule::none(kBlocks), kBlocks).size(), 9u);
  MemoryPolicy p;
  p.offload.optimizer = p.offload.weights = true;
  Rig r(p.dtype, true);
  Model m(testing::tiny_gpt_spec(kBlocks), r.ctx, Trainer::placement(p));
  Rng data(9);
  {
    Trainer t(m, r.ctx, options(p, 2));
    const WeightRing& ring = *dynamic_cast<const OffloadOptimizer&>(t.optimizer()).weight_ring();
    (void)t.step(testing::test_corpus().sample(4, 32, data));
    EXPECT_EQ(ring.fetches(), 8);
    (void)t.evaluate(testing::test_corpus().sample(4, 32, data));  // 0 .. head: five fetches
    EXPECT_EQ(ring.fetches(), 8 + 5);
  }
  p.accum = 2;
  Trainer t2(m, r.ctx, options(p, 2));
  const WeightRing& ring2 = *dynamic_cast<const OffloadOptimizer&>(t2.optimizer()).weight_ring();
  (void)t2.step(testing::test_corpus().sample(4, 32, data));
  EXPECT_EQ(ring2.fetches(), 8 + 6);
}

// A model built with its weights on the device (not Trainer::placement) hands them to the
// host when the trainer offloads them, and trains the same.
TEST(WeightOffload, AModelBuiltWithDeviceWeightsIsOffloadedAtConstruction) {
  MemoryPolicy p;
  p.dtype = DType::kBF16;
  p.offload.optimizer = p.offload.weights = true;
  const Trained placed = train(p, 3);
  Rig r(p.dtype, true);
  Model m(testing::tiny_gpt_spec(kBlocks), r.ctx);  // weights, masters and gradients on device
  Trainer t(m, r.ctx, options(p, 2));
  for (Parameter* q : m.parameters()) EXPECT_FALSE(q->weight_on_device()) << q->name;
  Rng data(9);
  std::vector<double> losses;
  for (int i = 0; i < 3; ++i)
    losses.push_back(t.step(testing::test_corpus().sample(6, 32, data)).loss);
  EXPECT_EQ(losses, placed.losses);
}

// Whatever the model holds on the device when the optimizer takes over becomes the host
// weights: a device master without a device weight is rounded into them.
TEST(WeightOffload, ADeviceMasterBecomesTheHostWeights) {
  Rig r(DType::kBF16, false);
  Model m(testing::tiny_gpt_spec(2), r.ctx, ParamPlacement{.weight = false, .master = true});
  for (Parameter* p : m.parameters()) r.be.fill(r.ctx.stream, p->master.view(), 0.5f);
  r.be.synchronize(r.ctx.stream);
  HostProvider pinned;
  OffloadOptions oo;
  oo.weights = true;
  oo.units = m.weight_units();
  OffloadOptimizer opt(m.parameters(), oo, r.ctx, pinned);
  const std::uint16_t half = 0x3f00;  // 0.5 in bf16
  for (Parameter* p : m.parameters()) {
    EXPECT_FALSE(p->master_on_device()) << p->name;
    const auto* w = static_cast<const std::uint16_t*>(p->host_weight.raw());
    EXPECT_EQ(w[0], half) << p->name;
    EXPECT_EQ(w[p->numel() - 1], half) << p->name;
    EXPECT_EQ(static_cast<const float*>(p->host_master.raw())[0], 0.5f) << p->name;
  }
}

// Resuming a weight-offloaded run from a saved state continues it bit for bit.
TEST(WeightOffload, ResumeIsBitExact) {
  MemoryPolicy p;
  p.dtype = DType::kBF16;
  p.accum = 2;
  p.offload.optimizer = p.offload.weights = p.offload.gradients = true;
  const Trained straight = train(p, 4);
  const std::string path =
      (std::filesystem::temp_directory_path() / "memfit_weight_offload_resume.mfstate").string();
  Rng data(9);
  {
    Rig r(p.dtype, true);
    Model m(testing::tiny_gpt_spec(kBlocks), r.ctx, Trainer::placement(p));
    Trainer t(m, r.ctx, options(p, 2));
    for (int i = 0; i < 2; ++i) (void)t.step(testing::test_corpus().sample(6, 32, data));
    t.save(path);
  }
  Rig r(p.dtype, true);
  Model m(testing::tiny_gpt_spec(kBlocks), r.ctx, Trainer::placement(p));
  TrainerOptions o = options(p, 2);
  o.seed = 77;  // the state file decides the weights, not the seed
  Trainer t(m, r.ctx, o);
  t.load(path);
  std::vector<double> losses;
  for (int i = 0; i < 2; ++i)
    losses.push_back(t.step(testing::test_corpus().sample(6, 32, data)).loss);
  EXPECT_EQ(losses, std::vector<double>(straight.losses.begin() + 2, straight.losses.end()));
  Rng eval_data(4);
  const Trained resumed = read_out(t, m, r.ctx, testing::test_corpus().sample(5, 32, eval_data));
  EXPECT_TRUE(resumed.weights == straight.weights);
  EXPECT_TRUE(resumed.state == straight.state);
  std::filesystem::remove(path);
}

// By hand, as examples/custom_loop.cpp drives it: the optimizer's use calls around an
// executor's ops, and the mistakes a hand-written loop can make.
TEST(WeightOffload, MisuseIsAClearError) {
  Rig r(DType::kBF16, false);
  Model m(testing::tiny_gpt_spec(2), r.ctx, ParamPlacement{.weight = false, .master = false});
  for (Parameter* p : m.parameters()) EXPECT_FALSE(p->weight_on_device()) << p->name;
  HostProvider pinned;
  OffloadOptions oo;
  oo.weights = true;
  // No units: the ring cannot know what each use reads.
  testing::expect_invalid([&] { OffloadOptimizer(m.parameters(), oo, r.ctx, pinned); },
                          {"weight units"});
  oo.units = m.weight_units();
  oo.weight_buffers = 0;
  testing::expect_invalid([&] { OffloadOptimizer(m.parameters(), oo, r.ctx, pinned); },
                          {"buffers = 0"});
  oo.weight_buffers = 2;
  oo.delayed_update = true;
  testing::expect_invalid([&] { OffloadOptimizer(m.parameters(), oo, r.ctx, pinned); },
                          {"delayed update", "one of the two"});
  oo.delayed_update = false;
  // A unit reading a parameter the optimizer does not hold.
  std::vector<Parameter*> some = m.parameters();
  some.pop_back();
  testing::expect_invalid([&] { OffloadOptimizer(some, oo, r.ctx, pinned); },
                          {"is not one this optimizer holds"});
  // Without host weights there is nothing to fetch from.
  testing::expect_invalid([&] { WeightRing(r.ctx, m.weight_units(), 2); }, {"no host weight"});
  // A model without device weights cannot be initialized until host weights are bound.
  testing::expect_invalid([&] { m.init(1, r.ctx); }, {"no working weight"});

  OffloadOptimizer opt(m.parameters(), oo, r.ctx, pinned);
  m.init(1, r.ctx);
  EXPECT_GT(opt.weight_device_bytes(), 0u);
  Parameter* wpe = m.embedding_parameters().back();
  EXPECT_FALSE(wpe->weight_on_device());
  // Lent for a use, given back after it.
  opt.before_use(r.ctx, 0, 1);
  EXPECT_TRUE(wpe->weight_on_device());
  r.be.synchronize(r.ctx.stream);
  EXPECT_EQ(testing::bytes_of(wpe->weight.view()), testing::bytes_of(wpe->host_weight));
  testing::expect_invalid([&] { opt.before_use(r.ctx, 1, 2); }, {"while unit 0 is in use"});
  testing::expect_invalid([&] { opt.after_use(r.ctx, 1); }, {"in progress is unit 0"});
  opt.after_use(r.ctx, 0);
  EXPECT_FALSE(wpe->weight_on_device());
  testing::expect_invalid([&] { opt.after_use(r.ctx, 0); }, {"in progress is none"});
  testing::expect_invalid([&] { opt.before_use(r.ctx, 99, -1); }, {"valid: 0 to"});
  testing::expect_invalid([&] { opt.before_use(r.ctx, 0, 99); }, {"next"});
  // An abandoned use gives everything back.
  opt.before_use(r.ctx, 2, -1);
  opt.abandon_step(r.ctx);
  for (Parameter* p : m.parameters()) EXPECT_FALSE(p->weight_on_device()) << p->name;
}

}  // namespace
}  // namespace memfit
