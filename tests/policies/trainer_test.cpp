// Trainer: accumulation equals the full batch, the f16 loss scaler skips poisoned steps,
// resume is bit-exact (device AdamW and offload), save/load are all or nothing, an
// OutOfMemory mid-step changes nothing, the dry run predicts the allocator's peak, and training
// lowers the loss on the bundled corpus, and clipping scales the update as clip_grad_norm_.
#include "policies/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/meta/meta_backend.h"
#include "core/model.h"
#include "memory/caching_allocator.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"
#include "policies/offload_optimizer.h"
#include "tests/core/exec_testutil.h"

namespace memfit {
namespace {

ModelSpec test_spec(std::int64_t layers = 2) { return testing::tiny_gpt_spec(layers); }
const TextDataset& corpus() { return testing::test_corpus(); }

// The checkpointing a test names, as the CLI would parse it (the test models have <= 3 blocks).
Checkpointing ck_of(const char* text) { return Checkpointing::parse(text, 3); }

// A CPU "device" with its allocator; members in construction order.
struct Rig {
  explicit Rig(DType dt, bool workers = false)
      : be(CpuBackendOptions{.worker_streams = workers}),
        alloc(host, {}, &be.stream_sync()),
        ctx{be, alloc, kDefaultStream, dt} {}
  // Trainer options for this rig's dtype (a trainer's policy dtype is its model's).
  TrainerOptions opts(TrainerOptions o = {}) const {
    o.policy.dtype = ctx.dtype;
    return o;
  }
  CpuBackend be;
  HostProvider host;
  CachingAllocator alloc;
  LayerContext ctx;
};

// The bits of everything a step may change: optimizer state (masters, moments) and the
// working weights.
using Snapshot = std::vector<std::vector<char>>;
Snapshot snapshot(Trainer& t) {
  LayerContext& ctx = t.context();
  t.optimizer().flush(ctx);
  std::vector<Tensor> ts;
  for (const StateTensor& s : t.optimizer().state()) ts.push_back(s.tensor);
  for (Parameter* p : t.model().parameters()) ts.push_back(p->weight.view());
  Snapshot out;
  for (const Tensor& x : ts) {
    std::vector<char> buf(x.nbytes() + 4);
    const Tensor host(buf.data(), x.shape(), x.dtype(), Device::kCpu);
    ctx.backend.copy(ctx.stream, x, host);
    ctx.backend.synchronize(ctx.stream);
    buf.resize(x.nbytes());
    out.push_back(std::move(buf));
  }
  return out;
}

std::vector<float> grad_values(Parameter& p, LayerContext& ctx) {
  std::vector<float> v(static_cast<std::size_t>(p.numel()));
  ctx.backend.copy(ctx.stream, p.grad.view(), Tensor(v.data(), p.shape, DType::kF32, Device::kCpu));
  ctx.backend.synchronize(ctx.stream);
  return v;
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "trainer_test_" + std::to_string(::getpid()) + "_" + name;
}

TEST(Trainer, AccumulationEqualsTheFullBatchWithinFp32Tolerance) {
  // Batch 7 in one piece, as 3 + 3 + 1 (accum 3, uneven) and as 2 + 2 + 2 + 1 (micro-batch 2).
  // Every micro-batch's loss gradient is 1/(B*T), so the accumulated gradient is the full
  // batch's up to FP32 summation order. Tolerance: each gradient element is a sum over the
  // 224 rows of the batch, regrouped into per-micro-batch partial sums; FP32 regrouping error
  // is bounded by ~rows * 2^-24 * sum|terms|; we allow 1e-5 of the tensor's largest
  // magnitude plus 1e-9 absolute (observed: below 2e-7 relative).
  const Batch b = corpus().sequential(7, 32, 1000);
  std::vector<std::vector<std::vector<float>>> grads;
  std::vector<double> losses;
  for (auto [micro, accum] : {std::pair<int, int>{0, 0}, {0, 3}, {2, 0}}) {
    Rig r(DType::kF32);
    Model m(test_spec(), r.ctx);
    TrainerOptions o;
    o.policy.micro_batch = micro;
    o.policy.accum = accum;
    Trainer t(m, r.ctx, r.opts(o));
    const StepResult s = t.step(b);
    EXPECT_EQ(s.micro_batches, micro == 2 ? 4 : accum == 3 ? 3 : 1);
    losses.push_back(s.loss);
    std::vector<std::vector<float>> g;
    for (Parameter* p : m.parameters()) g.push_back(grad_values(*p, r.ctx));
    grads.push_back(std::move(g));
  }
  for (std::size_t k = 1; k < grads.size(); ++k) {
    EXPECT_NEAR(losses[k], losses[0], 1e-6 * losses[0]) << "split " << k;
    for (std::size_t p = 0; p < grads[0].size(); ++p) {
      float mx = 0;
      for (float v : grads[0][p]) mx = std::max(mx, std::fabs(v));
      ASSERT_GT(mx, 0.0f) << "parameter " << p << " got no gradient";
      for (std::size_t i = 0; i < grads[0][p].size(); ++i) {
        ASSERT_NEAR(grads[k][p][i], grads[0][p][i], 1e-5 * mx + 1e-9)
            << "split " << k << " parameter " << p << " element " << i;
      }
    }
  }
}

TEST(Trainer, F16OverflowSkipsTheStepHalvesTheScaleAndLeavesWeights) {
  for (int mode : {0, 1, 2}) {  // device AdamW, optimizer offload, with gradient offload
    const bool offload = mode > 0;
    SCOPED_TRACE(mode == 0 ? "device adamw" : mode == 1 ? "offload" : "offload gradients");
    Rig r(DType::kF16, offload);
    TrainerOptions o;
    o.policy.offload.optimizer = offload;
    o.policy.offload.gradients = mode == 2;  // the inf/NaN check then reads the host's copy
    Model m(test_spec(), r.ctx, Trainer::placement(o.policy));
    Trainer t(m, r.ctx, r.opts(o));
    ASSERT_TRUE(t.scaler().enabled());
    const Batch b = corpus().sequential(4, 32, 0);
    // A loss scale this large overflows the f16 logits' gradient: inf/NaN gradients.
    t.scaler().set_state({std::ldexp(1.0, 100), 7});  // exact in float and double
    const Snapshot before = snapshot(t);
    const StepResult s = t.step(b);
    EXPECT_TRUE(s.skipped);
    EXPECT_EQ(s.loss_scale, std::ldexp(1.0, 100));
    EXPECT_TRUE(std::isfinite(s.loss));
    EXPECT_EQ(t.scaler().state().scale, std::ldexp(1.0, 99));
    EXPECT_EQ(t.scaler().state().growth_tracker, 0);
    EXPECT_EQ(t.steps(), 0);
    EXPECT_EQ(t.steps_attempted(), 1);
    EXPECT_TRUE(snapshot(t) == before) << "a skipped step changed the weights or moments";

    // A poisoned weight: the forward itself produces inf/NaN. Skipped, nothing else moves.
    t.scaler().set_state({1024, 0});
    Parameter& lnf = *m.head().parameters()[0];
    const std::uint16_t inf16 = 0x7C00;
    r.be.copy(r.ctx.stream,
              Tensor(const_cast<std::uint16_t*>(&inf16), Shape{1}, DType::kF16, Device::kCpu),
              lnf.weight.view().reshape(Shape{lnf.numel()}).slice0(0, 1));
    const Snapshot poisoned = snapshot(t);
    const StepResult s2 = t.step(b);
    EXPECT_TRUE(s2.skipped);
    EXPECT_EQ(t.scaler().state().scale, 512);
    EXPECT_TRUE(snapshot(t) == poisoned);
    EXPECT_EQ(t.steps(), 0);

    // A clean step at a sane scale updates.
    t.optimizer().state_loaded(r.ctx);  // the working copy from the (untouched) master again
    const StepResult s3 = t.step(b);
    EXPECT_FALSE(s3.skipped);
    EXPECT_EQ(t.steps(), 1);
    EXPECT_FALSE(snapshot(t) == before);
  }
}

struct ResumeCase {
  const char* name;
  DType dtype;
  const char* checkpoint;
  std::int64_t micro_batch;
  bool offload;
  bool delayed;
  bool grads = false;  // gradient offload too
};

class TrainerResume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(TrainerResume, LoadThenTrainEqualsTrainingOnBitForBit) {
  const ResumeCase& c = GetParam();
  TrainerOptions o;
  o.policy.checkpoint = ck_of(c.checkpoint);
  o.policy.micro_batch = c.micro_batch;
  o.policy.offload.optimizer = c.offload;
  o.policy.offload.delayed_update = c.delayed;
  o.policy.offload.gradients = c.grads;
  o.adamw.lr = 3e-3;
  const std::string path = temp_path(std::string(c.name) + ".mfstate");

  Rig ra(c.dtype, c.offload);
  Model ma(test_spec(), ra.ctx);
  Trainer ta(ma, ra.ctx, ra.opts(o));
  for (int i = 0; i < 3; ++i) ta.step(corpus().sample(4, 32, ta.rng()));
  ta.save(path);
  const std::int64_t saved_steps = ta.steps();
  std::vector<double> la;
  for (int i = 0; i < 3; ++i) la.push_back(ta.step(corpus().sample(4, 32, ta.rng())).loss);

  Rig rb(c.dtype, c.offload);
  Model mb(test_spec(), rb.ctx);
  TrainerOptions ob = o;
  ob.seed = 4242;  // a different initialization and data stream, all replaced by the load
  Trainer tb(mb, rb.ctx, rb.opts(ob));
  tb.load(path);
  EXPECT_EQ(tb.steps(), saved_steps);
  EXPECT_EQ(tb.steps_attempted(), 3);
  std::vector<double> lb;
  for (int i = 0; i < 3; ++i) lb.push_back(tb.step(corpus().sample(4, 32, tb.rng())).loss);

  EXPECT_EQ(la, lb);
  EXPECT_EQ(ta.scaler().state(), tb.scaler().state());
  EXPECT_EQ(ta.rng().state(), tb.rng().state());
  EXPECT_EQ(ta.steps(), tb.steps());
  EXPECT_TRUE(snapshot(ta) == snapshot(tb)) << "weights or optimizer state differ";
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Policies, TrainerResume,
    ::testing::Values(
        ResumeCase{"f32", DType::kF32, "none", 0, false, false},
        ResumeCase{"bf16_ckpt_micro", DType::kBF16, "all", 3, false, false},
        ResumeCase{"f16_scaler", DType::kF16, "every:2", 0, false, false},
        ResumeCase{"offload_bf16", DType::kBF16, "none", 0, true, false},
        ResumeCase{"offload_f32", DType::kF32, "sqrt", 2, true, false},
        ResumeCase{"offload_delayed", DType::kBF16, "none", 0, true, true},
        ResumeCase{"offload_grads_f16", DType::kF16, "every:2", 0, true, false, true},
        ResumeCase{"offload_grads_bf16_micro", DType::kBF16, "all", 2, true, false, true},
        ResumeCase{"offload_grads_delayed", DType::kBF16, "none", 2, true, true, true}),
    [](const ::testing::TestParamInfo<ResumeCase>& i) { return std::string(i.param.name); });

TEST(Trainer, InterruptedSaveLeavesThePreviousStateLoadable) {
  const std::string path = temp_path("interrupted.mfstate");
  Rig r(DType::kBF16);
  Model m(test_spec(), r.ctx);
  Trainer t(m, r.ctx, r.opts());
  t.step(corpus().sample(4, 32, t.rng()));
  t.save(path);
  const Snapshot at_save = snapshot(t);
  t.step(corpus().sample(4, 32, t.rng()));
  SaveOptions faulty;
  faulty.fail_after_bytes = 5000;
  EXPECT_THROW(t.save(path, faulty), TrainStateError);

  Rig r2(DType::kBF16);
  Model m2(test_spec(), r2.ctx);
  Trainer t2(m2, r2.ctx, r2.opts());
  t2.load(path);
  EXPECT_EQ(t2.steps(), 1);
  EXPECT_TRUE(snapshot(t2) == at_save);
  std::remove(path.c_str());
}

std::string load_error(Trainer& t, const std::string& path) {
  try {
    t.load(path);
  } catch (const TrainStateError& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(Trainer, CorruptTruncatedOrForeignStatesLeaveTheTrainerUntouched) {
  const std::string path = temp_path("corrupt.mfstate");
  {
    Rig r(DType::kF32);
    Model m(test_spec(), r.ctx);
    Trainer t(m, r.ctx, r.opts());
    t.step(corpus().sample(4, 32, t.rng()));
    t.save(path);
  }
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> good{std::istreambuf_iterator<char>(in), {}};
  auto write = [&](const std::vector<char>& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };

  Rig r(DType::kF32);
  Model m(test_spec(), r.ctx);
  TrainerOptions o;
  o.seed = 99;
  Trainer t(m, r.ctx, r.opts(o));
  t.step(corpus().sample(4, 32, t.rng()));
  const Snapshot before = snapshot(t);
  const RngState rng = t.rng().state();

  auto bad = good;
  bad[bad.size() * 3 / 4] ^= 0x20;
  write(bad);
  EXPECT_NE(load_error(t, path).find("checksum"), std::string::npos);
  write(std::vector<char>(good.begin(), good.end() - 100));
  EXPECT_NE(load_error(t, path).find("truncated"), std::string::npos);
  EXPECT_TRUE(snapshot(t) == before);
  EXPECT_EQ(t.steps(), 1);
  EXPECT_EQ(t.rng().state(), rng);

  // Intact files from another model, dtype or optimizer: refused by name, nothing written.
  write(good);
  Rig r3(DType::kF32);
  Model m3(test_spec(3), r3.ctx);
  Trainer t3(m3, r3.ctx, r3.opts());
  EXPECT_NE(load_error(t3, path).find("different model"), std::string::npos);
  Rig r4(DType::kBF16);
  Model m4(test_spec(), r4.ctx);
  Trainer t4(m4, r4.ctx, r4.opts());
  EXPECT_NE(load_error(t4, path).find("dtype"), std::string::npos);
  Rig r5(DType::kF32);
  Model m5(test_spec(), r5.ctx);
  TrainerOptions o5;
  o5.policy.offload.optimizer = true;
  Trainer t5(m5, r5.ctx, r5.opts(o5));
  const Snapshot before5 = snapshot(t5);
  EXPECT_NE(load_error(t5, path).find("offload"), std::string::npos);
  EXPECT_TRUE(snapshot(t5) == before5);
  // The same model computed by the other attention algorithm has the same parameters: it loads
  // (and so does a state saved before specs had an `attention` key, which reads as flash).
  Rig r6(DType::kF32);
  ModelSpec spec6 = test_spec();
  spec6.attention = AttentionImpl::kMaterialized;
  Model m6(spec6, r6.ctx);
  Trainer t6(m6, r6.ctx, r6.opts());
  t6.load(path);
  EXPECT_EQ(t6.steps(), 1);
  EXPECT_NE(load_error(t, temp_path("missing.mfstate")).find("cannot open"), std::string::npos);
  std::remove(path.c_str());
}

TEST(Trainer, OutOfMemoryDuringAStepChangesNothing) {
  for (int mode : {0, 1, 2}) {  // device AdamW, optimizer offload, with gradient offload
    SCOPED_TRACE(mode == 0 ? "device adamw" : mode == 1 ? "offload" : "offload gradients");
    TrainerOptions o;
    o.policy.offload.optimizer = mode > 0;
    o.policy.offload.gradients = mode == 2;
    o.policy.micro_batch = 32;  // OOMs can land in a later micro-batch, after gradients accumulated
    const Batch b = corpus().sequential(64, 32, 77);
    // What one step needs, from an identical trainer.
    std::size_t r0 = 0, peak = 0;
    {
      Rig p(DType::kBF16);
      Model m(test_spec(), p.ctx);
      Trainer t(m, p.ctx, p.opts(o));
      r0 = static_cast<std::size_t>(p.alloc.stats().reserved_bytes[kStatAll].current);
      peak = t.step(b).peaks.reserved;
      ASSERT_GT(peak, r0);
    }
    Rig r(DType::kBF16);
    Model m(test_spec(), r.ctx);
    Trainer t(m, r.ctx, r.opts(o));
    const Snapshot before = snapshot(t);
    const LossScalerState scaler = t.scaler().state();
    int ooms = 0;
    for (double frac : {0.0, 0.3, 0.6, 0.8, 0.95}) {
      r.alloc.set_budget(r0 + static_cast<std::size_t>(frac * double(peak - r0)));
      try {
        t.step(b);
        break;  // it fit; nothing more to learn at larger budgets
      } catch (const OutOfMemory&) {
        ++ooms;
        EXPECT_TRUE(snapshot(t) == before) << "budget fraction " << frac;
        EXPECT_EQ(t.steps(), 0);
        EXPECT_EQ(t.steps_attempted(), 0);
        EXPECT_EQ(t.scaler().state(), scaler);
        EXPECT_FALSE(m.any_saved());
      }
    }
    EXPECT_GE(ooms, 1);
    // Still usable, and the step it then takes is exactly a fresh trainer's first step.
    r.alloc.set_budget(0);
    if (t.steps_attempted() == 0) t.step(b);
    Rig f(DType::kBF16);
    Model mf(test_spec(), f.ctx);
    Trainer tf(mf, f.ctx, f.opts(o));
    tf.step(b);
    EXPECT_TRUE(snapshot(t) == snapshot(tf));
  }
}

TEST(Trainer, DryRunOnMetaPredictsTheAllocatorPeak) {
  // f32 needs no GEMM scratch on the CPU backend, so the meta dry run and the real step make
  // the same allocations through the same allocator: the peaks agree to the byte.
  const Batch b = corpus().sequential(8, 32, 0);
  for (const char* ckpt : {"none", "all"}) {
    SCOPED_TRACE(ckpt);
    TrainerOptions o;
    o.policy.checkpoint = ck_of(ckpt);
    MetaBackend meta;
    NullProvider null;
    CachingAllocator ma(null, {}, &meta.stream_sync());
    LayerContext mctx{meta, ma, kDefaultStream, DType::kF32};
    Model mm(test_spec(), mctx);
    Trainer mt(mm, mctx, o);
    const StepResult predicted = mt.step(b);
    EXPECT_EQ(predicted.loss, 0.0);

    Rig r(DType::kF32);
    Model m(test_spec(), r.ctx);
    Trainer t(m, r.ctx, r.opts(o));
    const StepResult measured = t.step(b);
    EXPECT_GT(measured.peaks.allocated, 0u);
    EXPECT_EQ(predicted.peaks.allocated, measured.peaks.allocated);
    EXPECT_EQ(predicted.peaks.reserved, measured.peaks.reserved);
    EXPECT_EQ(predicted.peaks, measured.peaks);
  }
}

TEST(Trainer, TrainingLowersTheLossOnTheBundledCorpus) {
  Rig r(DType::kBF16);
  Model m(test_spec(), r.ctx);
  TrainerOptions o;
  o.adamw.lr = 3e-3;
  o.policy.checkpoint = ck_of("all");
  Trainer t(m, r.ctx, r.opts(o));
  const Batch held_out = corpus().sequential(8, 32, corpus().size() / 2);
  const double before = t.evaluate(held_out);
  EXPECT_NEAR(before, std::log(256.0), 0.3);  // an untrained byte model is near uniform
  for (int i = 0; i < 30; ++i) t.step(corpus().sample(8, 32, t.rng()));
  const double after = t.evaluate(held_out);
  EXPECT_LT(after, before - 1.0) << "30 steps took the held-out loss only from " << before << " to "
                                 << after;
}

// Gradient clipping: the step's norm is the gradients' global L2 norm (read back here), and a
// clipped step's Adam moments are the unclipped ones times max_grad_norm / (norm + 1e-6), as
// if the gradients had been scaled in place; a bound above the norm changes no bit.
TEST(Trainer, ClippingScalesTheUpdateByMaxNormOverTheNorm) {
  const Batch b = corpus().sequential(4, 32, 0);
  struct Out {
    StepResult r;
    std::vector<std::vector<float>> grads, moments;
    Snapshot bits;
  };
  auto run = [&](double max_norm) {
    Rig rig(DType::kF32);
    Model m(test_spec(), rig.ctx);
    TrainerOptions o;
    o.max_grad_norm = max_norm;
    Trainer t(m, rig.ctx, rig.opts(o));
    Out out;
    out.r = t.step(b);
    for (Parameter* p : m.parameters()) out.grads.push_back(grad_values(*p, rig.ctx));
    for (const StateTensor& st : t.optimizer().state()) {
      if (st.name.rfind("exp_avg/", 0) != 0) continue;
      std::vector<float> v(static_cast<std::size_t>(st.tensor.numel()));
      rig.be.copy(rig.ctx.stream, st.tensor,
                  Tensor(v.data(), st.tensor.shape(), DType::kF32, Device::kCpu));
      rig.be.synchronize(rig.ctx.stream);
      out.moments.push_back(std::move(v));
    }
    out.bits = snapshot(t);
    return out;
  };
  const Out loose = run(1e9);  // computes the norm, never clips
  double sum = 0;
  for (const auto& g : loose.grads) {
    for (float x : g) sum += static_cast<double>(x) * x;
  }
  ASSERT_GT(sum, 0);
  EXPECT_NEAR(loose.r.grad_norm, std::sqrt(sum), 1e-5 * std::sqrt(sum));
  EXPECT_FALSE(loose.r.clipped);
  EXPECT_EQ(run(0).bits, loose.bits);  // no clipping at all: the same bits

  const double bound = loose.r.grad_norm / 8;
  const Out tight = run(bound);
  EXPECT_TRUE(tight.r.clipped);
  EXPECT_EQ(tight.r.grad_norm, loose.r.grad_norm);  // the gradients are the same
  const double coef = bound / (loose.r.grad_norm + 1e-6);
  ASSERT_EQ(tight.moments.size(), loose.moments.size());
  ASSERT_FALSE(tight.moments.empty());
  for (std::size_t k = 0; k < tight.moments.size(); ++k) {
    for (std::size_t i = 0; i < tight.moments[k].size(); ++i) {
      const double want = coef * loose.moments[k][i];
      ASSERT_NEAR(tight.moments[k][i], want, 1e-6 * std::abs(want) + 1e-30) << k << " " << i;
    }
  }
}

TEST(Trainer, BadOptionsAndBatchesAreClearErrors) {
  Rig r(DType::kF32);
  Model m(test_spec(), r.ctx);
  TrainerOptions both;
  both.policy.micro_batch = 2;
  both.policy.accum = 2;
  EXPECT_THROW(Trainer(m, r.ctx, r.opts(both)), InvalidArgument);
  TrainerOptions dpu;
  dpu.policy.offload.delayed_update = true;
  EXPECT_THROW(Trainer(m, r.ctx, r.opts(dpu)), InvalidArgument);
  EXPECT_THROW((void)ck_of("every:0"), InvalidArgument);
  for (double bad : {-1.0, std::nan(""), HUGE_VAL}) {
    TrainerOptions clip;
    clip.max_grad_norm = bad;
    EXPECT_THROW(Trainer(m, r.ctx, r.opts(clip)), InvalidArgument) << bad;
  }
  TrainerOptions bf16;
  bf16.policy.dtype = DType::kBF16;  // not the model's f32
  EXPECT_THROW(Trainer(m, r.ctx, bf16), InvalidArgument);

  TrainerOptions acc;
  acc.policy.accum = 3;
  Trainer t(m, r.ctx, r.opts(acc));
  try {
    t.step(corpus().sequential(2, 32, 0));  // 2 samples cannot make 3 micro-batches
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("3"), std::string::npos) << e.what();
  }
  Batch too_long = corpus().sequential(1, 33, 0);
  EXPECT_THROW(t.step(too_long), InvalidArgument);
  Batch ragged = corpus().sequential(3, 16, 0);
  ragged.targets.pop_back();
  EXPECT_THROW(t.step(ragged), InvalidArgument);
  EXPECT_EQ(t.steps_attempted(), 0);
}

}  // namespace
}  // namespace memfit
