// Gradient offload (GradRing inside OffloadOptimizer, driven by the Trainer): training with the
// gradients on the host is bit-identical to training with them on the device, for every dtype,
// with and without accumulation and checkpointing, for any number of buckets, on worker streams
// (the copies really run beside the compute); the device holds only the ring; misuse is a
// clear error.
#include "policies/offload_grad_ring.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/cpu/sumsq.h"  // kSumSqBlock
#include "memory/error.h"
#include "policies/offload_optimizer.h"
#include "policies/trainer.h"
#include "tests/core/backend_testutil.h"  // expect_invalid
#include "tests/core/exec_testutil.h"
#include "tests/policies/offload_testutil.h"

namespace memfit {
namespace {

using Rig = testing::OffloadRig;

struct Trained {
  std::vector<double> losses;
  std::vector<std::vector<unsigned char>> weights;  // every working weight after the run
  std::vector<std::vector<unsigned char>> state;    // masters and moments
  std::size_t gradient_peak = 0;
  std::vector<double> norms;  // StepResult::grad_norm
  int clipped = 0;
};

// `steps` steps of batch 6 from the bundled corpus under `policy`, clipped to max_grad_norm.
Trained train(MemoryPolicy policy, int steps, int buckets = 2, double max_grad_norm = 0,
              const ModelSpec& spec = testing::tiny_gpt_spec(3)) {
  Rig r(policy.dtype, policy.offload.any());
  Model m(spec, r.ctx, Trainer::placement(policy));
  TrainerOptions o;
  o.policy = policy;
  o.adamw.lr = 3e-3;
  o.grad_buckets = buckets;
  o.max_grad_norm = max_grad_norm;
  Trainer t(m, r.ctx, o);
  Rng data(9);
  Trained out;
  for (int i = 0; i < steps; ++i) {
    const StepResult s = t.step(testing::test_corpus().sample(6, 32, data));
    out.losses.push_back(s.loss);
    out.norms.push_back(s.grad_norm);
    out.clipped += s.clipped ? 1 : 0;
    out.gradient_peak =
        std::max(out.gradient_peak, s.peaks.category_peaks[category_index(Category::kGradient)]);
  }
  t.optimizer().flush(r.ctx);
  for (Parameter* p : m.parameters()) out.weights.push_back(testing::bytes_of(p->weight.view()));
  for (const StateTensor& st : t.optimizer().state()) {
    if (st.tensor.device() == Device::kCpu) out.state.push_back(testing::bytes_of(st.tensor));
  }
  return out;
}

using Case = testing::OffloadCase;

class GradOffload : public ::testing::TestWithParam<Case> {};

TEST_P(GradOffload, TrainsBitForBitAsWithTheGradientsOnTheDevice) {
  const Case& c = GetParam();
  MemoryPolicy p;
  p.dtype = c.dtype;
  p.checkpoint = Checkpointing::parse(c.checkpoint, 3);
  p.accum = c.accum;
  const Trained plain = train(p, 6);
  p.offload.optimizer = true;
  const Trained opt = train(p, 6);
  p.offload.gradients = true;
  const Trained grads = train(p, 6);
  ASSERT_EQ(plain.losses.size(), 6u);
  EXPECT_NE(plain.losses.front(), plain.losses.back()) << "the model did not train";
  EXPECT_EQ(grads.losses, plain.losses);
  EXPECT_EQ(grads.losses, opt.losses);
  EXPECT_TRUE(grads.weights == plain.weights) << "working weights differ from the plain run";
  EXPECT_TRUE(grads.state == opt.state) << "masters or moments differ from optimizer offload";
  EXPECT_LT(grads.gradient_peak, opt.gradient_peak);
}

// Gradient clipping reads the offloaded gradients on the host (OffloadOptimizer::grads_sumsq),
// summed as the CPU backend's sumsq sums them on the device: over 10 steps clipped at a quarter
// of the first step's norm, the norms, losses and weights are bit-identical to the device's
// clipping.
TEST_P(GradOffload, ClippingOnTheHostIsBitIdenticalToTheDevices) {
  const Case& c = GetParam();
  MemoryPolicy p;
  p.dtype = c.dtype;
  p.checkpoint = Checkpointing::parse(c.checkpoint, 3);
  p.accum = c.accum;
  p.offload.optimizer = true;
  const double first = train(p, 1).norms.at(0);  // the f16 scaler computes it too; else:
  const double bound = (first > 0 ? first : train(p, 1, 2, 1e9).norms.at(0)) / 4;
  ASSERT_GT(bound, 0);
  const Trained device = train(p, 10, 2, bound);
  p.offload.gradients = true;
  const Trained host = train(p, 10, 2, bound);
  EXPECT_GE(device.clipped, 5) << "clipping was not exercised";
  EXPECT_EQ(host.clipped, device.clipped);
  ASSERT_EQ(host.losses.size(), device.losses.size());
  EXPECT_EQ(host.norms, device.norms);
  EXPECT_EQ(host.losses, device.losses);
  EXPECT_TRUE(host.weights == device.weights) << "working weights differ";
  EXPECT_NE(train(p, 10).losses, host.losses) << "clipping changed nothing";
}

// The same with tensors of several 64K-element sum blocks (a 1024 x 256 wte, 256 x 1024 MLP
// weights), where the host's sum runs in parallel over (parameter, block) tasks.
TEST(GradOffload, ClippingIsBitIdenticalOnTensorsOfManySumBlocks) {
  ModelSpec spec = testing::tiny_gpt_spec(2);
  spec.vocab = 1024;
  spec.hidden = 256;
  ASSERT_GT(spec.vocab * spec.hidden, 2 * kSumSqBlock);
  MemoryPolicy p;
  p.dtype = DType::kBF16;
  p.accum = 2;
  p.offload.optimizer = true;
  const double bound = train(p, 1, 2, 1e9, spec).norms.at(0) / 8;
  const Trained device = train(p, 4, 2, bound, spec);
  p.offload.gradients = true;
  const Trained host = train(p, 4, 2, bound, spec);
  EXPECT_GE(device.clipped, 3) << "clipping was not exercised";
  EXPECT_EQ(host.clipped, device.clipped);
  EXPECT_EQ(host.norms, device.norms);
  EXPECT_EQ(host.losses, device.losses);
  EXPECT_TRUE(host.weights == device.weights);
}

INSTANTIATE_TEST_SUITE_P(Policies, GradOffload, ::testing::ValuesIn(testing::offload_cases()),
                         testing::offload_case_name);

// The ring's size changes where the copies wait, never the numbers; the device holds
// buckets x the largest stage's gradients (plus the tied wte's buffer).
TEST(GradOffload, AnyNumberOfBucketsGivesTheSameBits) {
  MemoryPolicy p;
  p.dtype = DType::kBF16;
  p.accum = 2;
  p.offload.optimizer = p.offload.gradients = true;
  const Trained one = train(p, 3, 1);
  const Trained two = train(p, 3, 2);
  const Trained three = train(p, 3, 3);
  EXPECT_EQ(one.losses, two.losses);
  EXPECT_EQ(three.losses, two.losses);
  EXPECT_TRUE(one.state == two.state && three.state == two.state);
  EXPECT_LT(one.gradient_peak, two.gradient_peak);
  EXPECT_LT(two.gradient_peak, three.gradient_peak);
  // Each extra bucket is one block's gradients (the largest stage: 12C^2 + 13C floats, C = 32,
  // plus slice alignment and the allocator's rounding).
  const std::size_t block = (12 * 32 * 32 + 13 * 32) * 4;
  EXPECT_GE(two.gradient_peak, one.gradient_peak + block);
  EXPECT_LT(two.gradient_peak - one.gradient_peak, block + 4096);
}

// By hand, as examples/custom_loop.cpp drives it: the optimizer's stage calls around an
// executor's backward, and the mistakes a hand-written loop can make.
TEST(GradOffload, MisuseIsAClearError) {
  Rig r(DType::kF32, false);
  Model m(testing::tiny_gpt_spec(2), r.ctx, ParamPlacement{.master = true, .grad = false});
  HostProvider pinned;
  OffloadOptions oo;
  oo.gradients = true;
  // No stages: the ring cannot know the backward.
  testing::expect_invalid([&] { OffloadOptimizer(m.parameters(), oo, r.ctx, pinned); },
                          {"backward stages"});
  oo.stages = m.backward_stages();
  oo.grad_buckets = 0;
  testing::expect_invalid([&] { OffloadOptimizer(m.parameters(), oo, r.ctx, pinned); },
                          {"buckets = 0"});
  oo.grad_buckets = 2;
  // A stage writing a parameter the optimizer does not hold.
  std::vector<Parameter*> some = m.parameters();
  some.pop_back();
  testing::expect_invalid([&] { OffloadOptimizer(some, oo, r.ctx, pinned); },
                          {"is not one the optimizer holds"});

  OffloadOptimizer opt(m.parameters(), oo, r.ctx, pinned);
  m.init(1, r.ctx);
  for (Parameter* p : m.parameters()) EXPECT_FALSE(p->grad_on_device()) << p->name;
  // Lent for a stage, given back after it.
  Parameter* head_ln = m.head_parameters().front();
  opt.before_stage(r.ctx, 0, 0, 1);
  EXPECT_TRUE(head_ln->grad_on_device());
  opt.after_stage(r.ctx, 0, 0, 1);
  EXPECT_FALSE(head_ln->grad_on_device());
  testing::expect_invalid([&] { opt.after_stage(r.ctx, 1, 0, 1); }, {"without before_stage"});
  testing::expect_invalid([&] { opt.before_stage(r.ctx, 99, 0, 1); }, {"valid: 0 to"});
  // A step before every stage of the last micro-batch arrived.
  testing::expect_invalid([&] { opt.step(r.ctx, 1.0); }, {"never left the device"});
  opt.skip(r.ctx);  // drops what was sent; usable again
  EXPECT_FALSE(opt.grads_nonfinite(r.ctx));
}

}  // namespace
}  // namespace memfit
