// OffloadOptimizer against a reference loop of Backend::adamw on the device copies of the same
// data (what DeviceAdamW does): bit-identical weights, masters and moments over several steps in
// f32, bf16 and f16, with and without worker copy streams, whatever grads_ready was told; skip
// changes nothing; the delayed update lags one step until flush; host bytes; state round trip.
#include "policies/offload_optimizer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/device_adamw.h"
#include "memory/error.h"
#include "memory/pinned_host_provider.h"
#include "policies/loss_scaler.h"
#include "tests/policies/param_testutil.h"

namespace memfit {
namespace {

using testing::ParamSet;
using testing::ParamSpec;
using Bytes = std::vector<unsigned char>;

// Sizes around the AdamW tile (8192) and the parallel threshold (64K), odd ones, and an empty one.
const std::vector<ParamSpec> kSpecs = {
    {"wte", {97, 64}}, {"h.0.ln.weight", {64}}, {"h.0.fc.weight", {300, 257}},
    {"empty", {0}},    {"h.0.fc.bias", {300}},  {"lm.bias", {8193}},
};

AdamWOptions adam() {
  AdamWOptions o;
  o.lr = 1e-2;  // large enough that every step moves the rounded weights
  o.weight_decay = 0.1;
  return o;
}

Bytes bytes_of(const Tensor& t) {
  const auto* b = static_cast<const unsigned char*>(t.raw());
  return Bytes(b, b + t.nbytes());
}

// DeviceAdamW's loop, on a ParamSet of its own: Backend::adamw per parameter on the masters
// (the weight itself for f32), moments beside them, the rounded weight as param_out.
class Reference {
 public:
  Reference(DType dt, AdamWOptions o) : ps_(be_, dt, kSpecs), dt_(dt), opt_(o) {
    for (std::size_t i = 0; i < ps_.size(); ++i) {
      const std::size_t n = static_cast<std::size_t>(ps_[i].numel());
      m_.emplace_back(n + 1, 0.0f);
      v_.emplace_back(n + 1, 0.0f);
    }
  }
  void step(int t, double grad_scale) {
    ps_.set_step_grads(t);
    const AdamWConstants k = adamw_constants(opt_, t, grad_scale);
    for (std::size_t i = 0; i < ps_.size(); ++i) {
      Parameter& p = ps_[i];
      const Tensor master = dt_ == DType::kF32 ? p.weight.view() : p.master.view();
      const Tensor m(m_[i].data(), p.shape, DType::kF32, Device::kCpu);
      const Tensor v(v_[i].data(), p.shape, DType::kF32, Device::kCpu);
      const Tensor out = p.weight.view();
      be_.adamw(kDefaultStream, k, master, p.grad.view(), m, v,
                dt_ == DType::kF32 ? nullptr : &out);
    }
  }
  Bytes weight(std::size_t i) { return ps_.weight_bytes(i); }
  Bytes master(std::size_t i) {
    return bytes_of(dt_ == DType::kF32 ? ps_[i].weight.view() : ps_[i].master.view());
  }
  Bytes exp_avg(std::size_t i) {
    return Bytes(reinterpret_cast<unsigned char*>(m_[i].data()),
                 reinterpret_cast<unsigned char*>(m_[i].data() + ps_[i].numel()));
  }
  Bytes exp_avg_sq(std::size_t i) {
    return Bytes(reinterpret_cast<unsigned char*>(v_[i].data()),
                 reinterpret_cast<unsigned char*>(v_[i].data() + ps_[i].numel()));
  }

 private:
  CpuBackend be_;
  ParamSet ps_;
  DType dt_;
  AdamWOptions opt_;
  std::vector<std::vector<float>> m_, v_;
};

Bytes state_of(OffloadOptimizer& opt, const std::string& name) {
  for (const StateTensor& s : opt.state()) {
    if (s.name == name) return bytes_of(s.tensor);
  }
  ADD_FAILURE() << "no state tensor " << name;
  return {};
}

void expect_matches(ParamSet& ps, OffloadOptimizer& opt, Reference& ref, const std::string& when) {
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const std::string& name = ps[i].name;
    EXPECT_EQ(ps.weight_bytes(i), ref.weight(i)) << when << ": weight " << name;
    EXPECT_EQ(state_of(opt, "master/" + name), ref.master(i)) << when << ": master " << name;
    EXPECT_EQ(state_of(opt, "exp_avg/" + name), ref.exp_avg(i)) << when << ": exp_avg " << name;
    EXPECT_EQ(state_of(opt, "exp_avg_sq/" + name), ref.exp_avg_sq(i)) << when << ": v " << name;
  }
}

enum class Ready { kNone, kPartial, kAll, kRepeated };

using Case = std::tuple<DType, bool /*worker streams*/, Ready>;

class OffloadMatchesReference : public ::testing::TestWithParam<Case> {};

TEST_P(OffloadMatchesReference, BitExactOverSteps) {
  const auto [dt, workers, ready] = GetParam();
  CpuBackend be({.worker_streams = workers});
  PinnedHostProvider pinned;
  ParamSet ps(be, dt, kSpecs);
  LayerContext ctx = ps.ctx();
  OffloadOptions o;
  o.adamw = adam();
  OffloadOptimizer opt(ps.list(), o, ctx, pinned);
  EXPECT_STREQ(opt.name(), "offload-adamw");
  for (std::size_t i = 0; i < ps.size(); ++i) EXPECT_FALSE(ps[i].master_on_device());
  Reference ref(dt, adam());
  for (int t = 1; t <= 4; ++t) {
    const double gs = t == 3 ? 1.0 / 1024 : 1.0;  // a loss-scaled step among them
    ps.set_step_grads(t);
    const std::vector<Parameter*> all = ps.list();
    if (ready == Ready::kPartial) {
      opt.grads_ready(ctx, {all[5], all[4]});  // backward order: the last layers first
      opt.grads_ready(ctx, {all[2]});
    } else if (ready == Ready::kAll || ready == Ready::kRepeated) {
      opt.grads_ready(ctx, all);
      if (ready == Ready::kRepeated) opt.grads_ready(ctx, {all[0], all[0]});
    }
    opt.step(ctx, gs);
    ref.step(t, gs);
    be.synchronize(kDefaultStream);
    EXPECT_EQ(opt.steps(), t);
    expect_matches(ps, opt, ref, "step " + std::to_string(t));
  }
  EXPECT_GE(opt.last_timing().adamw_s, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    DTypesStreamsReady, OffloadMatchesReference,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16), ::testing::Bool(),
                       ::testing::Values(Ready::kNone, Ready::kPartial, Ready::kAll,
                                         Ready::kRepeated)));

// The bit-exact target itself: DeviceAdamW and OffloadOptimizer on identical parameters.
TEST(OffloadOptimizer, BitEqualToDeviceAdamW) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    CpuBackend be({.worker_streams = true});
    PinnedHostProvider pinned;
    // DeviceAdamW takes no empty parameter (an empty master has no address to tell it by).
    std::vector<ParamSpec> specs;
    for (const ParamSpec& s : kSpecs) {
      if (s.shape.numel() > 0) specs.push_back(s);
    }
    ParamSet on_device(be, dt, specs), offloaded(be, dt, specs);
    LayerContext cd = on_device.ctx(), co = offloaded.ctx();
    DeviceAdamW dev(on_device.list(), adam(), cd);
    OffloadOptions o;
    o.adamw = adam();
    OffloadOptimizer off(offloaded.list(), o, co, pinned);
    for (int t = 1; t <= 4; ++t) {
      const double gs = 1.0 / (t == 2 ? 4096 : 1);
      on_device.set_step_grads(t);
      offloaded.set_step_grads(t);
      off.grads_ready(co, offloaded.list());
      dev.step(cd, gs);
      off.step(co, gs);
      be.synchronize(kDefaultStream);
      ASSERT_EQ(dev.steps(), off.steps());
      for (std::size_t i = 0; i < specs.size(); ++i) {
        EXPECT_EQ(on_device.weight_bytes(i), offloaded.weight_bytes(i))
            << dtype_name(dt) << " step " << t << " " << specs[i].name;
      }
      // Same tensors by name (DeviceAdamW calls an f32 master "weight/<name>").
      std::vector<StateTensor> sd = dev.state(), so = off.state();
      for (const StateTensor& d : sd) {
        std::string name = d.name;
        if (name.rfind("weight/", 0) == 0) name = "master/" + name.substr(7);
        bool found = false;
        for (const StateTensor& x : so) {
          if (x.name != name) continue;
          found = true;
          EXPECT_EQ(bytes_of(d.tensor), bytes_of(x.tensor)) << dtype_name(dt) << " " << name;
        }
        EXPECT_TRUE(found) << name;
      }
    }
  }
}

TEST(OffloadOptimizer, InfSkipsStepHalvesScaleLeavesEverythingUnchanged) {
  for (bool workers : {false, true}) {
    CpuBackend be({.worker_streams = workers});
    PinnedHostProvider pinned;
    ParamSet ps(be, DType::kF16, kSpecs);
    LayerContext ctx = ps.ctx();
    OffloadOptions o;
    o.adamw = adam();
    OffloadOptimizer opt(ps.list(), o, ctx, pinned);
    LossScaler scaler;
    for (int t = 1; t <= 2; ++t) {
      ps.set_step_grads(t);
      opt.grads_ready(ctx, ps.list());
      ASSERT_FALSE(scaler.update(grads_nonfinite(ctx, ps.list())));
      opt.step(ctx, 1.0 / scaler.scale_used());
    }
    std::vector<Bytes> weights, state;
    for (std::size_t i = 0; i < ps.size(); ++i) weights.push_back(ps.weight_bytes(i));
    for (const StateTensor& s : opt.state()) state.push_back(bytes_of(s.tensor));
    ps.set_step_grads(3);
    ps.grad_ptr(2)[1234] = std::numeric_limits<float>::infinity();
    opt.grads_ready(ctx, ps.list());  // copies already on their way when the inf is found
    EXPECT_TRUE(scaler.update(grads_nonfinite(ctx, ps.list())));
    opt.skip(ctx);
    be.synchronize(kDefaultStream);
    EXPECT_EQ(scaler.scale(), 32768.0);
    EXPECT_EQ(opt.steps(), 2);
    for (std::size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(ps.weight_bytes(i), weights[i]);
    std::size_t j = 0;
    for (const StateTensor& s : opt.state()) EXPECT_EQ(bytes_of(s.tensor), state[j++]) << s.name;
    // The next clean step is step 3 of the reference: the skipped gradients left no trace.
    Reference ref(DType::kF16, adam());
    ref.step(1, 1.0 / 65536);
    ref.step(2, 1.0 / 65536);
    ps.set_step_grads(3);
    ASSERT_FALSE(scaler.update(grads_nonfinite(ctx, ps.list())));
    opt.step(ctx, 1.0 / scaler.scale_used());
    ref.step(3, 1.0 / 32768);
    be.synchronize(kDefaultStream);
    expect_matches(ps, opt, ref, workers ? "after skip (workers)" : "after skip");
  }
}

TEST(OffloadOptimizer, DelayedUpdateLagsOneStepUntilFlush) {
  for (bool workers : {false, true}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      CpuBackend be({.worker_streams = workers});
      PinnedHostProvider pinned;
      ParamSet ps(be, dt, kSpecs);
      LayerContext ctx = ps.ctx();
      OffloadOptions o;
      o.adamw = adam();
      o.delayed_update = true;
      OffloadOptimizer opt(ps.list(), o, ctx, pinned);
      Reference ref(dt, adam());
      std::vector<Bytes> initial;
      for (std::size_t i = 0; i < ps.size(); ++i) initial.push_back(ps.weight_bytes(i));
      std::vector<Bytes> prev = initial;  // the reference's weights one update behind
      for (int t = 1; t <= 4; ++t) {
        ps.set_step_grads(t);  // the update of step t-1 may still be running: grads are ours
        opt.grads_ready(ctx, ps.list());
        opt.step(ctx, 1.0);
        be.synchronize(kDefaultStream);
        for (std::size_t i = 0; i < ps.size(); ++i) {
          EXPECT_EQ(ps.weight_bytes(i), prev[i]) << "step " << t << " " << ps[i].name;
        }
        ref.step(t, 1.0);
        for (std::size_t i = 0; i < ps.size(); ++i) prev[i] = ref.weight(i);
      }
      EXPECT_EQ(opt.steps(), 4);
      opt.flush(ctx);
      be.synchronize(kDefaultStream);
      expect_matches(ps, opt, ref, "after flush");
      opt.flush(ctx);  // nothing in flight: a no-op
      expect_matches(ps, opt, ref, "after a second flush");
    }
  }
}

TEST(OffloadOptimizer, HostBytesAccounting) {
  CpuBackend be;
  std::int64_t total = 0;
  for (const ParamSpec& s : kSpecs) total += s.shape.numel();
  const auto n = static_cast<std::size_t>(total);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    PinnedHostProvider pinned;
    ParamSet ps(be, dt, kSpecs);
    LayerContext ctx = ps.ctx();
    const std::int64_t before = pinned.allocations();
    OffloadOptimizer opt(ps.list(), {}, ctx, pinned);
    EXPECT_EQ(pinned.allocations(), before + 1);  // one slab
    // 12 bytes (master, m, v) + 4 (gradient staging) + weight staging in the compute dtype;
    // f32 weights are copied back from the masters, so they need none. 64-byte alignment of
    // each region adds at most 64 bytes per region.
    const std::size_t per = 16 + (dt == DType::kF32 ? 0 : dtype_size(dt));
    EXPECT_GE(opt.host_bytes(), per * n) << dtype_name(dt);
    EXPECT_LE(opt.host_bytes(), per * n + 5 * 64) << dtype_name(dt);
  }
}

TEST(OffloadOptimizer, StateRoundTripResumesBitExactly) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    CpuBackend be({.worker_streams = true});
    PinnedHostProvider pinned;
    OffloadOptions o;
    o.adamw = adam();
    ParamSet a(be, dt, kSpecs);
    LayerContext ca = a.ctx();
    OffloadOptimizer oa(a.list(), o, ca, pinned);
    for (int t = 1; t <= 3; ++t) {
      a.set_step_grads(t);
      oa.step(ca, 1.0);
    }
    std::vector<StateTensor> saved_state = oa.state();
    EXPECT_EQ(saved_state.size(), 3 * kSpecs.size());
    std::vector<Bytes> saved;
    for (const StateTensor& s : saved_state) saved.push_back(bytes_of(s.tensor));

    ParamSet b(be, dt, kSpecs, /*seed=*/77);  // different starting weights
    LayerContext cb = b.ctx();
    OffloadOptimizer ob(b.list(), o, cb, pinned);
    std::vector<StateTensor> into = ob.state();
    ASSERT_EQ(into.size(), saved.size());
    for (std::size_t i = 0; i < into.size(); ++i) {
      ASSERT_EQ(into[i].name, saved_state[i].name);
      ASSERT_EQ(into[i].tensor.device(), Device::kCpu);
      if (!saved[i].empty()) std::memcpy(into[i].tensor.raw(), saved[i].data(), saved[i].size());
    }
    ob.set_steps(oa.steps());
    ob.state_loaded(cb);
    be.synchronize(kDefaultStream);
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b.weight_bytes(i), a.weight_bytes(i));
    for (int t = 4; t <= 5; ++t) {
      a.set_step_grads(t);
      b.set_step_grads(t);
      oa.step(ca, 1.0);
      ob.step(cb, 1.0);
    }
    be.synchronize(kDefaultStream);
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b.weight_bytes(i), a.weight_bytes(i));
    std::vector<StateTensor> sa = oa.state(), sb = ob.state();
    for (std::size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(bytes_of(sa[i].tensor), bytes_of(sb[i].tensor)) << sa[i].name;
    }
  }
}

TEST(OffloadOptimizer, BadArguments) {
  CpuBackend be;
  PinnedHostProvider pinned;
  ParamSet ps(be, DType::kBF16, kSpecs);
  LayerContext ctx = ps.ctx();
  OffloadOptions o;
  o.adamw.lr = -1;
  EXPECT_THROW(OffloadOptimizer(ps.list(), o, ctx, pinned), InvalidArgument);
  o = {};
  o.threads = -2;
  EXPECT_THROW(OffloadOptimizer(ps.list(), o, ctx, pinned), InvalidArgument);
  EXPECT_THROW(OffloadOptimizer({nullptr}, {}, ctx, pinned), InvalidArgument);
  // Nothing moved by the refused constructions.
  for (std::size_t i = 0; i < ps.size(); ++i)
    EXPECT_TRUE(ps[i].master_on_device() || ps[i].numel() == 0);

  std::vector<Parameter*> dup = ps.list();
  dup.push_back(dup[0]);  // as DeviceAdamW: a tied parameter is listed once
  EXPECT_THROW(OffloadOptimizer(dup, {}, ctx, pinned), InvalidArgument);
  OffloadOptimizer opt(ps.list(), {}, ctx, pinned);
  EXPECT_EQ(opt.state().size(), 3 * ps.size());
  ParamSet other(be, DType::kBF16, {{"stranger", {4}}});
  EXPECT_THROW(opt.grads_ready(ctx, other.list()), InvalidArgument);
  const Bytes w = ps.weight_bytes(0);
  EXPECT_THROW(opt.step(ctx, 0.0), InvalidArgument);
  EXPECT_THROW(opt.step(ctx, std::numeric_limits<double>::infinity()), InvalidArgument);
  EXPECT_EQ(opt.steps(), 0);
  EXPECT_EQ(ps.weight_bytes(0), w);
  EXPECT_THROW(opt.set_steps(-1), InvalidArgument);
  EXPECT_THROW(opt.set_lr(std::numeric_limits<double>::quiet_NaN()), InvalidArgument);
  opt.set_lr(0.5);
  EXPECT_EQ(opt.options().lr, 0.5);
  EXPECT_EQ(be.live_events(), 0u);
}

}  // namespace
}  // namespace memfit
