// TransformerBlock and MLPBlock: golden-spec names and init, double references with finite
// differences, cost() against the allocator on the meta backend, low precision, recompute.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "core/layers/transformer_block.h"
#include "memory/error.h"
#include "tests/core/layer_testutil.h"

namespace memfit {
namespace {

using testing::Params;
using testing::Vec;

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

testing::RefFn block_ref(std::int64_t b, std::int64_t t, std::int64_t c, std::int64_t h,
                         std::int64_t f) {
  return [=](const Vec& x, const Params& p) {
    return testing::ref_transformer_block(x, b, t, c, h, f, p, 1e-5);
  };
}

TEST(TransformerBlockTest, ParameterNamesShapesInitAsTheGoldenSpec) {
  const std::int64_t c = 32, layers = 2;
  TransformerBlock blk("h.3", c, 4, 4, layers);
  const float res_std = 0.02f / std::sqrt(2.0f * layers);
  struct Want {
    const char* name;
    Shape shape;
    ParamInit::Kind kind;
    float std;
  };
  using K = ParamInit::Kind;
  const Want want[] = {
      {"h.3.ln1.weight", Shape{c}, K::kOnes, 0},
      {"h.3.ln1.bias", Shape{c}, K::kZeros, 0},
      {"h.3.attn.qkv.weight", Shape{3 * c, c}, K::kNormal, 0.02f},
      {"h.3.attn.qkv.bias", Shape{3 * c}, K::kZeros, 0},
      {"h.3.attn.proj.weight", Shape{c, c}, K::kNormal, res_std},
      {"h.3.attn.proj.bias", Shape{c}, K::kZeros, 0},
      {"h.3.ln2.weight", Shape{c}, K::kOnes, 0},
      {"h.3.ln2.bias", Shape{c}, K::kZeros, 0},
      {"h.3.mlp.fc.weight", Shape{4 * c, c}, K::kNormal, 0.02f},
      {"h.3.mlp.fc.bias", Shape{4 * c}, K::kZeros, 0},
      {"h.3.mlp.proj.weight", Shape{c, 4 * c}, K::kNormal, res_std},
      {"h.3.mlp.proj.bias", Shape{c}, K::kZeros, 0},
  };
  const auto ps = blk.parameters();
  ASSERT_EQ(ps.size(), std::size(want));
  for (std::size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(ps[i]->name, want[i].name);
    EXPECT_EQ(ps[i]->shape, want[i].shape) << want[i].name;
    EXPECT_EQ(ps[i]->init.kind, want[i].kind) << want[i].name;
    EXPECT_FLOAT_EQ(ps[i]->init.std, want[i].std) << want[i].name;
  }
  testing::expect_invalid([] { TransformerBlock("h.0", 30, 4, 4, 2); }, {"heads"});
  testing::expect_invalid([] { TransformerBlock("h.0", 32, 4, 0, 2); }, {"mlp_ratio"});
  testing::expect_invalid([] { TransformerBlock("h.0", 32, 4, 4, 0); }, {"layers"});
}

TEST(TransformerBlockTest, GradientsMatchFiniteDifferences) {
  TransformerBlock blk("h.0", 8, 2, 2, 1);
  testing::check_gradients(blk, Shape{2, 4, 8}, block_ref(2, 4, 8, 2, 16), 61);
}

TEST(TransformerBlockTest, LowPrecisionCloseToF32) {
  // About a dozen tensors rounded on the way through two sublayers, and LayerNorm's gain of
  // 1/std on the way back (measured: 3.7 units forward, 4.9 for dx; tolerance 12).
  for (DType dt : {DType::kF16, DType::kBF16}) {
    testing::check_low_precision(
        [] { return std::make_unique<TransformerBlock>("h.0", 16, 2, 4, 2); }, dt, Shape{2, 6, 16},
        block_ref(2, 6, 16, 2, 64), 12.0, 62);
  }
}

TEST(TransformerBlockTest, RecomputeIsBitwise) {
  TransformerBlock blk("h.0", 16, 2, 4, 2);
  testing::check_recompute(blk, Shape{2, 8, 16}, 63);
}

// A recomputation for the backward (forward_for_backward) skips the MLP's projection and the
// last residual add: one GEMM of 2*rows*C*F flops fewer, and no output allocated.
TEST(TransformerBlockTest, ForwardForBackwardSkipsTheLastProjection) {
  const std::int64_t b = 2, t = 16, c = 32, f = 4 * c;
  testing::MetaEnv env(DType::kBF16);
  TransformerBlock blk("h.0", c, 4, 4, 2);
  blk.allocate({env.alloc, DType::kBF16, Device::kMeta, kDefaultStream});
  testing::FreeOnExit free_params{blk};
  Act x = env.ctx.make(Shape{b, t, c}, DType::kBF16, Category::kActivation, "input");
  env.be.reset_stats();
  Act y = blk.forward(env.ctx, x, true);
  const MetaStats whole = env.be.stats();
  const std::int64_t with_output = testing::live_bytes(env.alloc);
  y.reset();
  const std::int64_t saved = testing::live_bytes(env.alloc);
  EXPECT_LT(saved, with_output);
  blk.release_saved();
  env.be.reset_stats();
  blk.forward_for_backward(env.ctx, x);
  const MetaStats part = env.be.stats();
  EXPECT_TRUE(blk.has_saved());
  EXPECT_EQ(part.gemm_flops, whole.gemm_flops - 2 * b * t * c * f);
  EXPECT_EQ(part.calls(MetaOp::kGemm), whole.calls(MetaOp::kGemm) - 1);
  EXPECT_EQ(testing::live_bytes(env.alloc), saved);  // what forward saved; no output
  blk.release_saved();
}

TEST(TransformerBlockTest, MemoryMatchesCost) {
  for (DType dt : kDTypes) {
    TransformerBlock blk("h.5", 64, 4, 4, 6);
    testing::check_memory_of(blk, dt, Shape{2, 64, 64});
  }
  testing::MetaEnv meta(DType::kBF16);
  TransformerBlock s("h.0", 16, 2, 4, 2);
  s.allocate({meta.alloc, DType::kBF16, Device::kMeta, kDefaultStream});
  testing::check_saved_state(s, meta.ctx, Shape{2, 4, 16});
  testing::CpuEnv cpu;
  TransformerBlock t("h.0", 16, 2, 4, 2);
  t.allocate({cpu.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  testing::check_saved_state(t, cpu.ctx, Shape{2, 4, 16});
}

TEST(TransformerBlockTest, SavedBytesFormula) {
  // Written out from the header's formula: 7c + 2f + 16T bytes per sample, plus the
  // attention's softmax state: 4*heads*T (flash's lse rows) or a = heads*T*T (materialized).
  const std::int64_t t = 128, c = 96, h = 6;
  for (AttentionImpl impl : {AttentionImpl::kFlash, AttentionImpl::kMaterialized}) {
    SCOPED_TRACE(attention_impl_name(impl));
    TransformerBlock blk("h.0", c, h, 4, 12, 1e-5f, impl);
    for (DType dt : kDTypes) {
      const std::int64_t e = static_cast<std::int64_t>(dtype_size(dt));
      const LayerCost k = blk.cost(t, dt);
      const bool flash = impl == AttentionImpl::kFlash;
      EXPECT_EQ(k.saved_bytes,
                7 * t * c * e + (flash ? 4 * h * t : h * t * t * e) + 2 * 4 * t * c * e + 16 * t);
      EXPECT_EQ(k.output_bytes, t * c * e);
      EXPECT_TRUE(k.saves_input);
      // GEMMs: qkv, attention (two T x T products; flash: over the T(T+1)/2 live pairs only),
      // proj, fc, mlp proj. Flash's backward: five pair products (q.k recomputed).
      const std::int64_t linear = 2 * t * c * 3 * c + 2 * t * c * c + 2 * 2 * t * c * 4 * c;
      EXPECT_EQ(k.forward_flops, linear + (flash ? 2 * t * (t + 1) * c : 4 * t * t * c));
      EXPECT_EQ(k.backward_flops, flash ? 2 * linear + 5 * t * (t + 1) * c : 2 * k.forward_flops);
      EXPECT_GT(k.workspace_bytes, 0);
    }
  }
}

TEST(TransformerBlockTest, ForwardFailureReleasesPartialState) {
  // Budgets growing from "nothing more" until the forward fits: wherever it runs out, the
  // block drops what its sublayers had saved, so a retry (smaller batch, other plan) starts
  // clean.
  testing::MetaEnv meta;
  TransformerBlock blk("h.0", 64, 4, 4, 2);
  blk.allocate({meta.alloc, DType::kF32, Device::kMeta, kDefaultStream});
  testing::FreeOnExit free_params{blk};
  Act x = meta.ctx.make(Shape{4, 128, 64}, DType::kF32, Category::kActivation, "input");
  const std::int64_t base = testing::live_bytes(meta.alloc);
  int failures = 0;
  for (std::size_t extra = 0;; extra += 256 * 1024) {
    meta.alloc.empty_cache();
    meta.alloc.set_budget(
        static_cast<std::size_t>(meta.alloc.stats().reserved_bytes[kStatAll].current) + extra);
    try {
      Act y = blk.forward(meta.ctx, x, true);
      break;
    } catch (const OutOfMemory&) {
      ++failures;
      EXPECT_FALSE(blk.has_saved()) << "budget +" << extra;
      EXPECT_EQ(testing::live_bytes(meta.alloc), base) << "budget +" << extra;
    }
    ASSERT_LT(extra, std::size_t{64} << 20);
  }
  EXPECT_GT(failures, 3);
  EXPECT_TRUE(blk.has_saved());
  meta.alloc.set_budget(0);
}

// ---- MLPBlock -----------------------------------------------------------------------------------

TEST(MlpBlockTest, NamesAndGradients) {
  MLPBlock blk("h.1", 6, 2, 3);
  const auto ps = blk.parameters();
  const char* want[] = {"h.1.ln.weight",   "h.1.ln.bias",         "h.1.mlp.fc.weight",
                        "h.1.mlp.fc.bias", "h.1.mlp.proj.weight", "h.1.mlp.proj.bias"};
  ASSERT_EQ(ps.size(), std::size(want));
  for (std::size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(ps[i]->name, want[i]);
  EXPECT_FLOAT_EQ(ps[4]->init.std, 0.02f / std::sqrt(6.0f));
  auto ref = [](const Vec& x, const Params& p) {
    return testing::ref_mlp_block(x, 6, 12, p, 1e-5);
  };
  testing::check_gradients(blk, Shape{2, 3, 6}, ref, 71);
}

TEST(MlpBlockTest, LowPrecisionRecomputeMemory) {
  auto ref = [](const Vec& x, const Params& p) {
    return testing::ref_mlp_block(x, 16, 64, p, 1e-5);
  };
  for (DType dt : {DType::kF16, DType::kBF16}) {
    testing::check_low_precision([] { return std::make_unique<MLPBlock>("h.0", 16, 4, 2); }, dt,
                                 Shape{2, 4, 16}, ref, 8.0, 72);  // measured 2.5
  }
  MLPBlock r("h.0", 16, 4, 2);
  testing::check_recompute(r, Shape{2, 4, 16}, 73);
  for (DType dt : kDTypes) {
    MLPBlock m("h.2", 64, 4, 4);
    testing::check_memory_of(m, dt, Shape{2, 64, 64});
  }
  testing::MetaEnv meta(DType::kF16);
  MLPBlock s("h.0", 16, 4, 2);
  s.allocate({meta.alloc, DType::kF16, Device::kMeta, kDefaultStream});
  testing::check_saved_state(s, meta.ctx, Shape{2, 4, 16});
}

}  // namespace
}  // namespace memfit
