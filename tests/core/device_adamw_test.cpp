// DeviceAdamW: bit-equal to core/cpu/adamw.h's adamw_step on copies, in f32 and bf16; skip;
// state names; argument checks; no allocation in step().
#include "core/device_adamw.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/adamw.h"
#include "memory/error.h"
#include "tests/core/exec_testutil.h"

namespace memfit {
namespace {

using testing::bytes_of;
using testing::Rig;

// Random gradients, some entries large, some tiny, some exactly zero.
void random_grads(Model& m, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (Parameter* p : m.parameters()) {
    float* g = static_cast<float*>(p->grad.view().raw());
    for (std::int64_t i = 0; i < p->numel(); ++i) {
      const float v = n(rng);
      g[i] = i % 17 == 0 ? 0.0f : (i % 5 == 0 ? v * 1e-6f : v * 1e-2f);
    }
  }
}

// Host reference state of one parameter.
struct Ref {
  std::vector<float> p, m, v;
  std::vector<std::uint16_t> out;  // low-precision weights
};

void check_against_reference(DType dt) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(dt);
  Model model(ModelSpec::preset("gpt-micro"), ctx);
  model.init(4, ctx);
  AdamWOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  DeviceAdamW opt(model.parameters(), o, ctx);
  const auto params = model.parameters();
  std::vector<Ref> ref(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto n = static_cast<std::size_t>(params[i]->numel());
    ref[i].p.resize(n);
    std::memcpy(ref[i].p.data(), params[i]->master_view().raw(), n * 4);
    ref[i].m.assign(n, 0.0f);
    ref[i].v.assign(n, 0.0f);
    ref[i].out.assign(n, 0);
  }
  const double scales[] = {1.0, 0.5, 1.0 / 1024};
  for (int step = 1; step <= 3; ++step) {
    random_grads(model, static_cast<std::uint32_t>(step));
    const double gs = scales[step - 1];
    const AdamWConstants k = adamw_constants(o, step, gs);
    for (std::size_t i = 0; i < params.size(); ++i) {
      AdamWBuffers b;
      b.n = ref[i].p.size();
      b.param = ref[i].p.data();
      b.exp_avg = ref[i].m.data();
      b.exp_avg_sq = ref[i].v.data();
      b.grad = params[i]->grad.view().raw();
      b.grad_dtype = DType::kF32;
      if (dt != DType::kF32) {
        b.param_out = ref[i].out.data();
        b.out_dtype = dt;
      }
      adamw_step(k, b, 1);
    }
    opt.step(ctx, gs);
    EXPECT_EQ(opt.steps(), step);
  }
  const std::vector<StateTensor> st = opt.state();
  ASSERT_EQ(st.size(), 3 * params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = *params[i];
    const std::size_t n = ref[i].p.size();
    EXPECT_EQ(std::memcmp(p.master_view().raw(), ref[i].p.data(), n * 4), 0) << p.name;
    EXPECT_EQ(std::memcmp(st[3 * i + 1].tensor.raw(), ref[i].m.data(), n * 4), 0) << p.name;
    EXPECT_EQ(std::memcmp(st[3 * i + 2].tensor.raw(), ref[i].v.data(), n * 4), 0) << p.name;
    if (dt != DType::kF32) {
      // The working copy is the master rounded, written in the same pass.
      EXPECT_EQ(std::memcmp(p.weight.view().raw(), ref[i].out.data(), n * 2), 0) << p.name;
      EXPECT_EQ(st[3 * i].name, "master/" + p.name);
    } else {
      EXPECT_EQ(st[3 * i].name, "weight/" + p.name);
      EXPECT_EQ(st[3 * i].tensor.raw(), p.weight.view().raw());
    }
    EXPECT_EQ(st[3 * i + 1].name, "exp_avg/" + p.name);
    EXPECT_EQ(st[3 * i + 2].name, "exp_avg_sq/" + p.name);
    EXPECT_EQ(st[3 * i + 1].tensor.dtype(), DType::kF32);
  }
}

TEST(DeviceAdamW, MatchesHostAdamWBitForBitF32) { check_against_reference(DType::kF32); }
TEST(DeviceAdamW, MatchesHostAdamWBitForBitBF16) { check_against_reference(DType::kBF16); }
TEST(DeviceAdamW, MatchesHostAdamWBitForBitF16) { check_against_reference(DType::kF16); }

TEST(DeviceAdamW, MomentsAllocatedOnceAndStepNeverAllocates) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kBF16);
  Model model(ModelSpec::preset("gpt-micro"), ctx);
  model.init(1, ctx);
  const auto opt_state = [&] {
    return rig.alloc->stats().category_bytes[static_cast<int>(Category::kOptimizerState)].current;
  };
  const std::int64_t masters = opt_state();
  DeviceAdamW opt(model.parameters(), AdamWOptions{}, ctx);
  std::int64_t moments = 0;
  for (Parameter* p : model.parameters()) {
    moments += 2 * static_cast<std::int64_t>(rig.alloc->round_size(p->grad.view().nbytes()));
  }
  EXPECT_EQ(opt_state() - masters, moments);
  for (const StateTensor& s : opt.state()) {
    if (s.name.rfind("exp_avg", 0) != 0) continue;
    for (float v : testing::to_host(ctx, s.tensor)) ASSERT_EQ(v, 0.0f) << s.name;
  }
  random_grads(model, 3);
  const std::int64_t allocs = rig.alloc->stats().allocation[kStatAll].allocated;
  opt.step(ctx, 1.0);
  opt.step(ctx, 1.0);
  EXPECT_EQ(rig.alloc->stats().allocation[kStatAll].allocated, allocs);
}

TEST(DeviceAdamW, SkipChangesNothing) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kBF16);
  Model model(ModelSpec::preset("gpt-micro"), ctx);
  model.init(1, ctx);
  DeviceAdamW opt(model.parameters(), AdamWOptions{}, ctx);
  random_grads(model, 1);
  opt.step(ctx, 1.0);
  std::vector<std::vector<unsigned char>> before;
  for (const StateTensor& s : opt.state()) before.push_back(bytes_of(s.tensor));
  for (Parameter* p : model.parameters()) before.push_back(bytes_of(p->weight.view()));
  random_grads(model, 2);
  opt.skip(ctx);
  EXPECT_EQ(opt.steps(), 1);
  std::size_t k = 0;
  for (const StateTensor& s : opt.state()) EXPECT_EQ(bytes_of(s.tensor), before[k++]) << s.name;
  for (Parameter* p : model.parameters()) {
    EXPECT_EQ(bytes_of(p->weight.view()), before[k++]) << p->name;
  }
}

TEST(DeviceAdamW, StateLoadedRefreshesTheWorkingCopy) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kBF16);
  Model model(ModelSpec::preset("gpt-micro"), ctx);
  model.init(1, ctx);
  DeviceAdamW opt(model.parameters(), AdamWOptions{}, ctx);
  Parameter& p = *model.parameters()[2];
  rig.be->fill(ctx.stream, p.master.view(), 1.5f);  // as a load would overwrite it
  opt.state_loaded(ctx);
  for (float v : testing::to_host(ctx, p.weight.view())) ASSERT_EQ(v, 1.5f);
  opt.set_steps(7);
  EXPECT_EQ(opt.steps(), 7);
  EXPECT_THROW(opt.set_steps(-1), InvalidArgument);
  opt.set_lr(5e-4);
  EXPECT_EQ(opt.options().lr, 5e-4);
  EXPECT_THROW(opt.set_lr(-1.0), InvalidArgument);
  EXPECT_THROW(opt.set_lr(std::nan("")), InvalidArgument);
  EXPECT_STREQ(opt.name(), "adamw");
  // A bad grad scale is refused before any parameter moves.
  const std::vector<unsigned char> w = bytes_of(p.master.view());
  EXPECT_THROW(opt.step(ctx, 0.0), InvalidArgument);
  EXPECT_EQ(bytes_of(p.master.view()), w);
  EXPECT_EQ(opt.steps(), 7);
}

TEST(DeviceAdamW, RejectsBadConstruction) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  Model model(ModelSpec::preset("gpt-micro"), ctx);
  const std::int64_t before = rig.alloc->stats().allocated_bytes[kStatAll].current;
  AdamWOptions bad;
  bad.beta1 = 1.0;
  EXPECT_THROW(DeviceAdamW(model.parameters(), bad, ctx), InvalidArgument);
  auto twice = model.parameters();
  twice.push_back(twice.front());
  try {
    DeviceAdamW opt(twice, AdamWOptions{}, ctx);
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'wte' listed twice"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DeviceAdamW({nullptr}, AdamWOptions{}, ctx), InvalidArgument);
  EXPECT_EQ(rig.alloc->stats().allocated_bytes[kStatAll].current, before);
}

}  // namespace
}  // namespace memfit
