// CausalSelfAttention and MLP against double references, finite differences, cost() on the
// meta backend, low precision and recomputation.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "core/layers/attention.h"
#include "core/layers/mlp.h"
#include "memory/error.h"
#include "tests/core/layer_testutil.h"

namespace memfit {
namespace {

using testing::Params;
using testing::Vec;

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

testing::RefFn attn_ref(std::int64_t b, std::int64_t t, std::int64_t c, std::int64_t h) {
  return [=](const Vec& x, const Params& p) { return testing::ref_attention(x, b, t, c, h, p); };
}

TEST(AttentionTest, NamesShapesAndInit) {
  CausalSelfAttention a("h.1.attn", 32, 4, 0.01f);
  auto ps = a.parameters();
  ASSERT_EQ(ps.size(), 4u);
  EXPECT_EQ(ps[0]->name, "h.1.attn.qkv.weight");
  EXPECT_EQ(ps[0]->shape, (Shape{96, 32}));
  EXPECT_FLOAT_EQ(ps[0]->init.std, 0.02f);
  EXPECT_EQ(ps[1]->name, "h.1.attn.qkv.bias");
  EXPECT_EQ(ps[1]->shape, (Shape{96}));
  EXPECT_EQ(ps[2]->name, "h.1.attn.proj.weight");
  EXPECT_EQ(ps[2]->shape, (Shape{32, 32}));
  EXPECT_FLOAT_EQ(ps[2]->init.std, 0.01f);
  EXPECT_EQ(ps[3]->name, "h.1.attn.proj.bias");
  testing::expect_invalid([] { CausalSelfAttention("a", 30, 4); }, {"heads", "30"});
}

constexpr AttentionImpl kImpls[] = {AttentionImpl::kFlash, AttentionImpl::kMaterialized};

TEST(AttentionTest, GradientsMatchFiniteDifferences) {
  // T = 5 exercises rows with 1..5 visible keys; two heads check the head layout of qkv.
  for (AttentionImpl impl : kImpls) {
    SCOPED_TRACE(attention_impl_name(impl));
    CausalSelfAttention a("attn", 8, 2, 0.02f, impl);
    testing::check_gradients(a, Shape{2, 5, 8}, attn_ref(2, 5, 8, 2), 41);
  }
}

TEST(AttentionTest, LowPrecisionCloseToF32) {
  // Materialized: qkv, the scores, the probabilities, the merged heads and the output are each
  // rounded to the dtype and the errors pass through two more GEMMs (measured: 2.7 units;
  // tolerance 6). Flash keeps scores and probabilities in FP32, so it is at least as close.
  for (AttentionImpl impl : kImpls) {
    for (DType dt : {DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(std::string(attention_impl_name(impl)) + " " + dtype_name(dt));
      testing::check_low_precision(
          [impl] { return std::make_unique<CausalSelfAttention>("attn", 16, 2, 0.02f, impl); }, dt,
          Shape{2, 6, 16}, attn_ref(2, 6, 16, 2), 6.0, 42);
    }
  }
}

TEST(AttentionTest, RecomputeSavedStateMemory) {
  for (AttentionImpl impl : kImpls) {
    SCOPED_TRACE(attention_impl_name(impl));
    CausalSelfAttention a("attn", 16, 4, 0.02f, impl);
    testing::check_recompute(a, Shape{2, 8, 16}, 43);
    for (DType dt : kDTypes) {
      CausalSelfAttention m("h.0.attn", 64, 4, 0.02f, impl);
      testing::check_memory_of(m, dt, Shape{2, 64, 64});
      // T = 96: not a multiple of flash's 64-row tile (sizes stay whole allocator granules).
      CausalSelfAttention odd("h.0.attn", 128, 4, 0.02f, impl);
      testing::check_memory_of(odd, dt, Shape{2, 96, 128});
    }
    testing::MetaEnv meta(DType::kBF16);
    CausalSelfAttention s("attn", 16, 2, 0.02f, impl);
    s.allocate({meta.alloc, DType::kBF16, Device::kMeta, kDefaultStream});
    testing::check_saved_state(s, meta.ctx, Shape{2, 4, 16});
  }
}

TEST(AttentionTest, CostFormula) {
  // Written out independently of the implementation: T = 64, C = 64, H = 4, bf16.
  const std::int64_t c = 64 * 64 * 2, att = 4 * 64 * 64 * 2, lse = 4 * 64 * 4;
  const std::int64_t projections = 2 * 64 * 64 * 192 + 2 * 64 * 64 * 64;
  CausalSelfAttention m("attn", 64, 4, 0.02f, AttentionImpl::kMaterialized);
  const LayerCost k = m.cost(64, DType::kBF16);
  EXPECT_EQ(k.saved_bytes, 3 * c + att + c);
  EXPECT_EQ(k.output_bytes, c);
  EXPECT_EQ(k.workspace_bytes, 5 * c + att);
  EXPECT_TRUE(k.saves_input);
  EXPECT_EQ(k.forward_flops, projections + 4 * 64 * 64 * 64);
  EXPECT_EQ(k.backward_flops, 2 * k.forward_flops);
  // Flash: no T x T term saved or allocated; q.k and p.v over the T(T+1)/2 live pairs.
  CausalSelfAttention f("attn", 64, 4);
  EXPECT_EQ(f.impl(), AttentionImpl::kFlash);
  const LayerCost fk = f.cost(64, DType::kBF16);
  EXPECT_EQ(fk.saved_bytes, 3 * c + c + lse);
  EXPECT_EQ(fk.output_bytes, c);
  EXPECT_EQ(fk.workspace_bytes, 3 * c + lse);
  EXPECT_TRUE(fk.saves_input);
  const std::int64_t pair_flops = 64 * 65 / 2 * 4 * (2 * 2 * 16);  // pairs x heads x 2 x 2hs
  EXPECT_EQ(fk.forward_flops, projections + pair_flops);
  EXPECT_EQ(fk.backward_flops, 2 * projections + pair_flops * 5 / 2);
}

TEST(AttentionTest, FlashRefusesHeadsPastItsLimit) {
  testing::expect_invalid([] { CausalSelfAttention("a", 512, 1); }, {"512", "materialized"});
  CausalSelfAttention ok("a", 512, 1, 0.02f, AttentionImpl::kMaterialized);
  EXPECT_EQ(ok.impl(), AttentionImpl::kMaterialized);
}

TEST(AttentionTest, RejectsTwoDimensionalInput) {
  testing::CpuEnv env;
  CausalSelfAttention a("attn", 8, 2);
  a.allocate({env.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  Act x = env.ctx.make(Shape{6, 8}, DType::kF32, Category::kActivation, "x");
  testing::expect_invalid([&] { a.forward(env.ctx, x, true); }, {"attn", "(6, 8)"});
  EXPECT_FALSE(a.has_saved());
}

// ---- MLP ----------------------------------------------------------------------------------------

testing::RefFn mlp_ref(std::int64_t c, std::int64_t f) {
  return [=](const Vec& x, const Params& p) { return testing::ref_mlp(x, c, f, p); };
}

TEST(MlpTest, NamesShapesAndInit) {
  MLP m("h.4.mlp", 8, 32, 0.003f);
  auto ps = m.parameters();
  ASSERT_EQ(ps.size(), 4u);
  EXPECT_EQ(ps[0]->name, "h.4.mlp.fc.weight");
  EXPECT_EQ(ps[0]->shape, (Shape{32, 8}));
  EXPECT_FLOAT_EQ(ps[0]->init.std, 0.02f);
  EXPECT_EQ(ps[1]->name, "h.4.mlp.fc.bias");
  EXPECT_EQ(ps[2]->name, "h.4.mlp.proj.weight");
  EXPECT_EQ(ps[2]->shape, (Shape{8, 32}));
  EXPECT_FLOAT_EQ(ps[2]->init.std, 0.003f);
  EXPECT_EQ(ps[3]->name, "h.4.mlp.proj.bias");
}

TEST(MlpTest, GradientsMatchFiniteDifferences) {
  MLP m("mlp", 6, 12);
  testing::check_gradients(m, Shape{2, 3, 6}, mlp_ref(6, 12), 51);
}

TEST(MlpTest, LowPrecisionRecomputeMemory) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    testing::check_low_precision([] { return std::make_unique<MLP>("mlp", 16, 64); }, dt,
                                 Shape{2, 4, 16}, mlp_ref(16, 64), 4.0, 52);  // measured 1.6
  }
  MLP r("mlp", 16, 64);
  testing::check_recompute(r, Shape{2, 4, 16}, 53);
  for (DType dt : kDTypes) {
    MLP m("h.0.mlp", 64, 256);
    testing::check_memory_of(m, dt, Shape{2, 64, 64});
    MLP narrow("narrow", 64, 32);  // F < C: the backward peak is fc's dx, not proj's
    testing::check_memory_of(narrow, dt, Shape{2, 64, 64});
  }
  testing::CpuEnv cpu;
  MLP s("mlp", 8, 16);
  s.allocate({cpu.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  testing::check_saved_state(s, cpu.ctx, Shape{2, 3, 8});
}

}  // namespace
}  // namespace memfit
