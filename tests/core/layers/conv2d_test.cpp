// Conv2d and GlobalAvgPool, the layers a small CNN needs: against the naive convolution
// (tests/core/conv_testutil.h) and finite differences, low precision, recomputation, the
// saved-state contract and memory against cost() on the meta backend.
#include "core/layers/conv2d.h"

#include <gtest/gtest.h>

#include <memory>

#include "core/layers/global_avg_pool.h"
#include "memory/check.h"
#include "memory/error.h"
#include "tests/core/conv_testutil.h"
#include "tests/core/layer_testutil.h"

namespace memfit {
namespace {

using testing::Params;
using testing::Vec;

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

Conv2dSpec spec(std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t k, std::int64_t r,
                std::int64_t s, std::int64_t stride = 1, std::int64_t pad = 0, bool bias = true) {
  return Conv2dSpec{.height = h,
                    .width = w,
                    .in_channels = c,
                    .out_channels = k,
                    .kernel_h = r,
                    .kernel_w = s,
                    .stride_h = stride,
                    .stride_w = stride,
                    .pad_h = pad,
                    .pad_w = pad,
                    .bias = bias};
}

// y = conv(x, W) + b for x (B, H*W, C).
testing::RefFn conv_ref(const Conv2dSpec& sp) {
  return [sp](const Vec& x, const Params& p) {
    Conv2dDesc d =
        testing::conv(0, sp.height, sp.width, sp.in_channels, sp.out_channels, sp.kernel_h,
                      sp.kernel_w, sp.stride_h, sp.stride_w, sp.pad_h, sp.pad_w);
    d.n = static_cast<std::int64_t>(x.size()) / (sp.height * sp.width * sp.in_channels);
    Vec y = testing::ref_conv_forward(d, x, p[0]);
    if (sp.bias) {
      for (std::size_t i = 0; i < y.size(); ++i) y[i] += p[1][i % p[1].size()];
    }
    return y;
  };
}

TEST(Conv2dTest, NamesShapesAndInit) {
  Conv2d l("conv1", spec(6, 5, 3, 8, 3, 2, 2, 1));
  auto ps = l.parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0]->name, "conv1.weight");
  EXPECT_EQ(ps[0]->shape, (Shape{8, 3, 2, 3}));  // (K,R,S,C)
  EXPECT_EQ(ps[0]->init.kind, ParamInit::Kind::kNormal);
  EXPECT_FLOAT_EQ(ps[0]->init.std, 1.0f / std::sqrt(3.0f * 2.0f * 3.0f));  // fan-in
  EXPECT_EQ(ps[1]->name, "conv1.bias");
  EXPECT_EQ(ps[1]->shape, (Shape{8}));
  EXPECT_EQ(l.out_height(), (6 + 2 - 3) / 2 + 1);
  EXPECT_EQ(l.out_width(), (5 + 2 - 2) / 2 + 1);
  EXPECT_EQ(Conv2d("nb", spec(4, 4, 1, 2, 3, 3, 1, 0, false)).parameters().size(), 1u);
  testing::expect_invalid([] { Conv2d("bad", spec(2, 2, 1, 2, 5, 5)); },
                          {"Conv2d 'bad'", "h + 2*pad_h"});
  testing::expect_invalid([] { Conv2d("bad", spec(4, 4, 0, 2, 3, 3)); }, {"c = 0"});
}

TEST(Conv2dTest, GradientsMatchFiniteDifferences) {
  const Conv2dSpec a = spec(5, 4, 3, 4, 3, 3, 1, 1);
  Conv2d l("conv", a);
  testing::check_gradients(l, Shape{2, 20, 3}, conv_ref(a), 1);
  const Conv2dSpec b = spec(6, 7, 2, 3, 2, 3, 2, 0, false);
  Conv2d nb("conv_s2", b);
  testing::check_gradients(nb, Shape{1, 42, 2}, conv_ref(b), 2);
}

TEST(Conv2dTest, LowPrecisionCloseToF32) {
  const Conv2dSpec a = spec(6, 6, 8, 8, 3, 3, 1, 1);
  for (DType dt : {DType::kF16, DType::kBF16}) {
    // f32 accumulation, one rounding of the output and one of the bias add (as Linear).
    testing::check_low_precision([a] { return std::make_unique<Conv2d>("conv", a); }, dt,
                                 Shape{2, 36, 8}, conv_ref(a), 2.0, 4);
  }
}

TEST(Conv2dTest, RecomputeIsBitwise) {
  Conv2d l("conv", spec(8, 8, 16, 32, 3, 3, 2, 1));
  testing::check_recompute(l, Shape{4, 64, 16}, 5);
}

TEST(Conv2dTest, SavedStateAndMemory) {
  for (DType dt : kDTypes) {
    // Per sample: input 8*8*4 and output 8*8*8 elements, whole 512-byte granules in every dtype.
    Conv2d l("conv", spec(8, 8, 4, 8, 3, 3, 1, 1));
    testing::check_memory_of(l, dt, Shape{2, 64, 4});
    const LayerCost c = l.cost(64, dt);
    EXPECT_TRUE(c.saves_input);
    EXPECT_EQ(c.saved_bytes, 0);
    EXPECT_EQ(c.forward_flops, 2 * 64 * 8 * 9 * 4);
    EXPECT_EQ(c.backward_flops, 2 * c.forward_flops);
  }
  testing::CpuEnv cpu;
  Conv2d l("conv", spec(5, 5, 2, 3, 3, 3, 2, 1));
  l.allocate({cpu.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  testing::check_saved_state(l, cpu.ctx, Shape{2, 25, 2});
  testing::MetaEnv meta(DType::kBF16);
  Conv2d m("conv", spec(5, 5, 2, 3, 3, 3, 2, 1));
  m.allocate({meta.alloc, DType::kBF16, Device::kMeta, kDefaultStream});
  testing::check_saved_state(m, meta.ctx, Shape{2, 25, 2});
  l.release_saved();
  EXPECT_THROW(l.cost(24, DType::kF32), InvalidArgument);  // seq_len must be H*W
}

TEST(Conv2dTest, RejectsWrongInputs) {
  testing::CpuEnv env;
  Conv2d l("conv", spec(4, 4, 2, 3, 3, 3, 1, 1));
  l.allocate({env.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  Act wrong_c = env.ctx.make(Shape{2, 16, 3}, DType::kF32, Category::kActivation, "x");
  testing::expect_invalid([&] { l.forward(env.ctx, wrong_c, true); }, {"conv", "(2, 16, 3)"});
  Act wrong_t = env.ctx.make(Shape{2, 15, 2}, DType::kF32, Category::kActivation, "x");
  testing::expect_invalid([&] { l.forward(env.ctx, wrong_t, true); }, {"(2, 15, 2)", "4 x 4"});
  EXPECT_FALSE(l.has_saved());
  Act x = env.ctx.make(Shape{2, 16, 2}, DType::kF32, Category::kActivation, "x");
  env.be.fill(kDefaultStream, x->view(), 1.0f);
  l.forward(env.ctx, x, true).reset();
  Act dy = env.ctx.make(Shape{2, 16, 2}, DType::kF32, Category::kTemporary, "dy");
  testing::expect_invalid([&] { l.backward(env.ctx, dy); }, {"(2, 16, 2)", "(2, 16, 3)"});
  EXPECT_TRUE(l.has_saved());
  l.release_saved();
}

// ---- GlobalAvgPool -----------------------------------------------------------------------------

testing::RefFn pool_ref(std::int64_t t, std::int64_t c) {
  return [=](const Vec& x, const Params&) {
    const std::int64_t b = static_cast<std::int64_t>(x.size()) / (t * c);
    Vec y(static_cast<std::size_t>(b * c), 0.0);
    for (std::int64_t i = 0; i < b; ++i)
      for (std::int64_t j = 0; j < t; ++j)
        for (std::int64_t k = 0; k < c; ++k) y[i * c + k] += x[(i * t + j) * c + k] / t;
    return y;
  };
}

TEST(GlobalAvgPoolTest, GradientsMatchFiniteDifferences) {
  GlobalAvgPool p("pool", 6, 5);
  testing::check_gradients(p, Shape{3, 6, 5}, pool_ref(6, 5), 3);
  EXPECT_TRUE(p.parameters().empty());
  testing::expect_invalid([] { GlobalAvgPool("bad", 0, 4); }, {"GlobalAvgPool 'bad'", "positions"});
}

TEST(GlobalAvgPoolTest, LowPrecisionAndRecompute) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    testing::check_low_precision([] { return std::make_unique<GlobalAvgPool>("pool", 36, 8); }, dt,
                                 Shape{2, 36, 8}, pool_ref(36, 8), 2.0, 6);
  }
  GlobalAvgPool p("pool", 36, 32);
  testing::check_recompute(p, Shape{4, 36, 32}, 7);
}

TEST(GlobalAvgPoolTest, SavedStateAndMemory) {
  for (DType dt : kDTypes) {
    // Batch 1: the ones vector is per call, not per sample (global_avg_pool.h).
    GlobalAvgPool p("pool", 256, 256);
    testing::check_memory_of(p, dt, Shape{1, 256, 256});
  }
  // At batch 4 the forward's transient is still one ones vector, not four.
  testing::MetaEnv env(DType::kF32);
  GlobalAvgPool p("pool", 256, 256);
  Act x = env.ctx.make(Shape{4, 256, 256}, DType::kF32, Category::kActivation, "input");
  const std::int64_t base = testing::live_bytes(env.alloc);
  env.alloc.reset_peak_stats();
  Act y = p.forward(env.ctx, x, true);
  EXPECT_EQ(testing::peak_bytes(env.alloc) - base - 4 * 256 * 4, 256 * 4);
  EXPECT_EQ(env.be.stats().gemm_flops, 4 * p.cost(256, DType::kF32).forward_flops);
  y.reset();
  p.release_saved();

  testing::CpuEnv cpu;
  GlobalAvgPool q("pool", 9, 4);
  testing::check_saved_state(q, cpu.ctx, Shape{2, 9, 4});
}

}  // namespace
}  // namespace memfit
