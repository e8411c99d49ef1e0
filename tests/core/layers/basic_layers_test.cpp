// Linear, LayerNorm, GELU and Residual against double references, finite differences, their
// cost() on the meta backend, low precision and recomputation.
#include <gtest/gtest.h>

#include <memory>

#include "core/layers/gelu.h"
#include "core/layers/layernorm.h"
#include "core/layers/linear.h"
#include "core/layers/residual.h"
#include "memory/error.h"
#include "tests/core/layer_testutil.h"

namespace memfit {
namespace {

using testing::Params;
using testing::Vec;

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// ---- Linear -----------------------------------------------------------------------------------

testing::RefFn linear_ref(std::int64_t in, std::int64_t out, bool bias) {
  return [=](const Vec& x, const Params& p) {
    return testing::ref_linear(x, in, out, p[0], bias ? &p[1] : nullptr);
  };
}

TEST(LinearTest, NamesShapesAndInit) {
  Linear l("h.0.mlp.fc", 8, 32, true, 0.5f);
  auto ps = l.parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0]->name, "h.0.mlp.fc.weight");
  EXPECT_EQ(ps[0]->shape, (Shape{32, 8}));
  EXPECT_EQ(ps[0]->init.kind, ParamInit::Kind::kNormal);
  EXPECT_FLOAT_EQ(ps[0]->init.std, 0.5f);
  EXPECT_EQ(ps[1]->name, "h.0.mlp.fc.bias");
  EXPECT_EQ(ps[1]->shape, (Shape{32}));
  EXPECT_EQ(ps[1]->init.kind, ParamInit::Kind::kZeros);
  EXPECT_EQ(Linear("nb", 3, 4, false).parameters().size(), 1u);
  EXPECT_THROW(Linear("bad", 0, 4), InvalidArgument);
}

TEST(LinearTest, GradientsMatchFiniteDifferences) {
  Linear l("fc", 5, 4);
  testing::check_gradients(l, Shape{2, 3, 5}, linear_ref(5, 4, true), 1);
  Linear nb("fc_nobias", 5, 3, false);
  testing::check_gradients(nb, Shape{2, 3, 5}, linear_ref(5, 3, false), 2);
}

TEST(LinearTest, GradientsAccumulate) {
  // A second backward adds to the first: the gradient doubles for the same x and dy.
  testing::CpuEnv env;
  Linear l("fc", 3, 2);
  l.allocate({env.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  std::mt19937 rng(3);
  testing::set_params(l.parameters(), testing::rand_params(l.parameters(), rng));
  testing::zero_grads(env.ctx, l.parameters());
  Act x = testing::make_input(env.ctx, Shape{1, 2, 3}, testing::rand_vec(6, rng));
  Act dy = testing::make_input(env.ctx, Shape{1, 2, 2}, testing::rand_vec(4, rng));
  Vec g1;
  for (int i = 0; i < 2; ++i) {
    l.forward(env.ctx, x, true).reset();
    l.backward(env.ctx, dy).reset();
    if (i == 0) g1 = testing::read(l.weight().grad.view());
  }
  const Vec g2 = testing::read(l.weight().grad.view());
  for (std::size_t i = 0; i < g1.size(); ++i) EXPECT_FLOAT_EQ(g2[i], 2 * g1[i]);
}

TEST(LinearTest, LowPrecisionCloseToF32) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    // One rounding of the output after f32 accumulation (inputs are the same rounded values):
    // under one unit of roundoff relative to the output's size (measured: 0.8; tolerance 2).
    testing::check_low_precision([] { return std::make_unique<Linear>("fc", 16, 8); }, dt,
                                 Shape{2, 4, 16}, linear_ref(16, 8, true), 2.0, 4);
  }
}

TEST(LinearTest, RecomputeIsBitwise) {
  Linear l("fc", 16, 24);
  testing::check_recompute(l, Shape{2, 8, 16}, 5);
}

TEST(LinearTest, SavedStateAndMemory) {
  for (DType dt : kDTypes) {
    Linear l("fc", 64, 192);
    testing::check_memory_of(l, dt, Shape{2, 64, 64});
  }
  testing::CpuEnv cpu;
  Linear l("fc", 8, 4);
  l.allocate({cpu.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  testing::check_saved_state(l, cpu.ctx, Shape{2, 3, 8});
  testing::MetaEnv meta(DType::kBF16);
  Linear m("fc", 8, 4);
  m.allocate({meta.alloc, DType::kBF16, Device::kMeta, kDefaultStream});
  testing::check_saved_state(m, meta.ctx, Shape{2, 3, 8});
}

TEST(LinearTest, RejectsWrongInputs) {
  testing::CpuEnv env;
  Linear l("fc", 8, 4);
  l.allocate({env.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  Act bad = env.ctx.make(Shape{2, 3, 7}, DType::kF32, Category::kActivation, "x");
  testing::expect_invalid([&] { l.forward(env.ctx, bad, true); }, {"fc", "(2, 3, 7)", "8"});
  EXPECT_FALSE(l.has_saved());
  Act half = env.ctx.make(Shape{2, 3, 8}, DType::kBF16, Category::kActivation, "x");
  testing::expect_invalid([&] { l.forward(env.ctx, half, true); }, {"bf16", "f32"});
  Act x = env.ctx.make(Shape{2, 3, 8}, DType::kF32, Category::kActivation, "x");
  env.be.fill(kDefaultStream, x->view(), 1.0f);
  l.forward(env.ctx, x, true).reset();
  Act dy = env.ctx.make(Shape{2, 3, 5}, DType::kF32, Category::kTemporary, "dy");
  testing::expect_invalid([&] { l.backward(env.ctx, dy); }, {"(2, 3, 5)", "(2, 3, 4)"});
  EXPECT_TRUE(l.has_saved());
  l.release_saved();
}

// ---- LayerNorm ----------------------------------------------------------------------------------

testing::RefFn ln_ref(std::int64_t c, double eps) {
  return
      [=](const Vec& x, const Params& p) { return testing::ref_layernorm(x, c, p[0], p[1], eps); };
}

TEST(LayerNormTest, NamesAndInit) {
  LayerNorm ln("h.2.ln1", 16);
  auto ps = ln.parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0]->name, "h.2.ln1.weight");
  EXPECT_EQ(ps[0]->init.kind, ParamInit::Kind::kOnes);
  EXPECT_EQ(ps[1]->name, "h.2.ln1.bias");
  EXPECT_EQ(ps[1]->init.kind, ParamInit::Kind::kZeros);
  EXPECT_THROW(LayerNorm("ln", 4, 0.0f), InvalidArgument);
}

TEST(LayerNormTest, GradientsMatchFiniteDifferences) {
  LayerNorm ln("ln", 6, 1e-5f);
  testing::check_gradients(ln, Shape{2, 3, 6}, ln_ref(6, 1e-5), 11);
}

TEST(LayerNormTest, BackwardIntoAccumulates) {
  testing::CpuEnv env;
  LayerNorm ln("ln", 4);
  ln.allocate({env.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  std::mt19937 rng(12);
  testing::set_params(ln.parameters(), testing::rand_params(ln.parameters(), rng));
  testing::zero_grads(env.ctx, ln.parameters());
  Act x = testing::make_input(env.ctx, Shape{1, 3, 4}, testing::rand_vec(12, rng));
  Act dy = testing::make_input(env.ctx, Shape{1, 3, 4}, testing::rand_vec(12, rng));
  ln.forward(env.ctx, x, true).reset();
  const Vec dx = testing::read(ln.backward(env.ctx, dy)->view());
  const Vec res = testing::rand_vec(12, rng);
  Act dres = testing::make_input(env.ctx, Shape{1, 3, 4}, res);
  ln.forward(env.ctx, x, true).reset();
  ln.backward_into(env.ctx, dy, dres->view());
  EXPECT_FALSE(ln.has_saved());
  const Vec got = testing::read(dres->view());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], res[i] + dx[i], 1e-6);
}

TEST(LayerNormTest, LowPrecisionRecomputeMemory) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    testing::check_low_precision([] { return std::make_unique<LayerNorm>("ln", 32); }, dt,
                                 Shape{2, 4, 32}, ln_ref(32, 1e-5), 2.0, 13);  // measured 0.6
  }
  LayerNorm ln("ln", 32);
  testing::check_recompute(ln, Shape{2, 8, 32}, 14);
  for (DType dt : kDTypes) {
    LayerNorm m("ln", 64);
    testing::check_memory_of(m, dt, Shape{2, 64, 64});
  }
  testing::MetaEnv meta(DType::kF16);
  LayerNorm m("ln", 8);
  m.allocate({meta.alloc, DType::kF16, Device::kMeta, kDefaultStream});
  testing::check_saved_state(m, meta.ctx, Shape{2, 3, 8});
}

// ---- GELU ---------------------------------------------------------------------------------------

TEST(GeluTest, GradientsLowPrecisionRecomputeMemory) {
  GELU g("gelu", 7);
  EXPECT_TRUE(g.parameters().empty());
  auto ref = [](const Vec& x, const Params&) { return testing::ref_gelu(x); };
  testing::check_gradients(g, Shape{2, 3, 7}, ref, 21);
  for (DType dt : {DType::kF16, DType::kBF16}) {
    testing::check_low_precision([] { return std::make_unique<GELU>("gelu", 16); }, dt,
                                 Shape{2, 4, 16}, ref, 2.0, 22);  // measured 0.6
  }
  GELU r("gelu", 16);
  testing::check_recompute(r, Shape{2, 4, 16}, 23);
  for (DType dt : kDTypes) {
    GELU m("gelu", 256);
    testing::check_memory_of(m, dt, Shape{2, 64, 256});
  }
  testing::CpuEnv cpu;
  GELU s("gelu", 8);
  testing::check_saved_state(s, cpu.ctx, Shape{2, 3, 8});
}

// ---- Residual -----------------------------------------------------------------------------------

TEST(ResidualTest, AddsTheSkipConnection) {
  Residual r("res", std::make_unique<Linear>("res.fc", 6, 6));
  ASSERT_EQ(r.parameters().size(), 2u);
  EXPECT_EQ(r.parameters()[0]->name, "res.fc.weight");
  auto ref = [](const Vec& x, const Params& p) {
    return testing::add(x, testing::ref_linear(x, 6, 6, p[0], &p[1]));
  };
  testing::check_gradients(r, Shape{2, 3, 6}, ref, 31);
  Residual q("res", std::make_unique<Linear>("res.fc", 16, 16));
  testing::check_recompute(q, Shape{2, 4, 16}, 32);
  for (DType dt : kDTypes) {
    testing::MetaEnv env(dt);
    Residual m("res", std::make_unique<Linear>("res.fc", 64, 64));
    m.allocate({env.alloc, dt, Device::kMeta, kDefaultStream});
    testing::check_memory(m, env, Shape{2, 64, 64}, 64, {m.cost(64, dt), PeakExcess{}});
  }
  testing::MetaEnv meta;
  Residual s("res", std::make_unique<GELU>("res.gelu", 8));
  testing::check_saved_state(s, meta.ctx, Shape{2, 3, 8});
  EXPECT_THROW(Residual("r", nullptr), InvalidArgument);
}

TEST(ResidualTest, RejectsAShapeChangingInner) {
  testing::CpuEnv env;
  Residual r("res", std::make_unique<Linear>("res.fc", 4, 3));
  r.allocate({env.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  Act x = env.ctx.make(Shape{1, 2, 4}, DType::kF32, Category::kActivation, "x");
  env.be.fill(kDefaultStream, x->view(), 1.0f);
  testing::expect_invalid([&] { r.forward(env.ctx, x, true); }, {"res", "(1, 2, 3)"});
  EXPECT_FALSE(r.has_saved());
}

}  // namespace
}  // namespace memfit
