// Parameter allocation (dtypes, categories, tags), master_view, Layer::allocate with tied
// parameters, LayerContext::make and LayerCost's sum.
#include <gtest/gtest.h>

#include "core/layer.h"
#include "core/layers/embedding.h"
#include "core/layers/linear.h"
#include "core/layers/lm_head.h"
#include "memory/check.h"
#include "memory/error.h"
#include "tests/core/layer_testutil.h"

namespace memfit {
namespace {

// Category and tag of the live block at `ptr`, from the snapshot.
const BlockInfo* find_block(const Snapshot& s, const void* ptr) {
  static BlockInfo found;
  for (const SegmentInfo& seg : s.segments) {
    for (const BlockInfo& b : seg.blocks) {
      if (b.address == reinterpret_cast<std::uintptr_t>(ptr) &&
          b.state == BlockState::kActiveAllocated) {
        found = b;
        return &found;
      }
    }
  }
  return nullptr;
}

TEST(ParameterTest, AllocatesWeightMasterGrad) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    testing::MetaEnv env;
    Parameter p;
    p.name = "h.0.attn.qkv.weight";
    p.shape = Shape{12, 4};
    allocate_parameter(p, {env.alloc, dt, Device::kMeta});
    EXPECT_EQ(p.weight.view().dtype(), dt);
    EXPECT_EQ(p.weight.view().shape(), p.shape);
    EXPECT_EQ(p.grad.view().dtype(), DType::kF32);
    EXPECT_EQ(p.master_on_device(), dt != DType::kF32);
    const Snapshot s = env.alloc.snapshot();
    const BlockInfo* w = find_block(s, p.weight.view().raw());
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->category, Category::kParameter);
    EXPECT_EQ(w->tag, p.name);
    const BlockInfo* g = find_block(s, p.grad.view().raw());
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->category, Category::kGradient);
    EXPECT_EQ(g->tag, p.name);
    if (dt != DType::kF32) {
      const BlockInfo* m = find_block(s, p.master.view().raw());
      ASSERT_NE(m, nullptr);
      EXPECT_EQ(m->category, Category::kOptimizerState);
      EXPECT_EQ(p.master_view().raw(), p.master.view().raw());
      EXPECT_EQ(p.master_view().dtype(), DType::kF32);
      // An offloaded master leaves no f32 copy on the device.
      p.master.reset();
      EXPECT_THROW(p.master_view(), CheckFailure);
    } else {
      EXPECT_EQ(p.master_view().raw(), p.weight.view().raw());
    }
    p.weight.reset();
    p.master.reset();
    p.grad.reset();
  }
}

TEST(ParameterTest, EmptyNameIsRejected) {
  testing::MetaEnv env;
  Parameter p;
  p.shape = Shape{3};
  testing::expect_invalid(
      [&] {
        allocate_parameter(p, {env.alloc, DType::kF32, Device::kMeta});
      },
      {"empty name", "(3)"});
  EXPECT_EQ(testing::live_bytes(env.alloc), 0);
}

TEST(ParameterTest, LayerAllocateSkipsTiedParameters) {
  testing::MetaEnv env;
  TokenEmbedding emb("emb", 16, 8, 4);
  LmHead head("head", 16, 4, &emb.wte());
  emb.allocate({env.alloc, DType::kBF16, Device::kMeta, kDefaultStream});
  const std::int64_t after_emb = testing::live_bytes(env.alloc);
  void* wte = emb.wte().weight.view().raw();
  head.allocate({env.alloc, DType::kBF16, Device::kMeta, kDefaultStream});
  EXPECT_EQ(emb.wte().weight.view().raw(), wte) << "the tied wte was allocated again";
  // lnf weight and bias: bf16 weight + f32 master + f32 grad, 512-byte granules each.
  EXPECT_EQ(testing::live_bytes(env.alloc) - after_emb, 2 * 3 * 512);

  // Layer::allocate (the default) allocates each parameter once and keeps allocated ones.
  Linear l("fc", 4, 4);
  l.allocate({env.alloc, DType::kF32, Device::kMeta, kDefaultStream});
  void* w = l.weight().weight.view().raw();
  l.allocate({env.alloc, DType::kF32, Device::kMeta, kDefaultStream});
  EXPECT_EQ(l.weight().weight.view().raw(), w);
  testing::FreeOnExit f{l};
  for (Parameter* p : head.parameters()) {
    p->weight.reset();
    p->master.reset();
    p->grad.reset();
  }
  for (Parameter* p : emb.parameters()) {
    p->weight.reset();
    p->master.reset();
    p->grad.reset();
  }
}

TEST(LayerContextTest, MakeAllocatesTaggedActs) {
  testing::MetaEnv env(DType::kF16);
  Act a = env.ctx.make(Shape{2, 3, 8}, DType::kF16, Category::kActivation, "blk");
  EXPECT_EQ(a->view().device(), Device::kMeta);
  EXPECT_EQ(a->view().shape(), (Shape{2, 3, 8}));
  const BlockInfo* b = find_block(env.alloc.snapshot(), a->view().raw());
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->category, Category::kActivation);
  EXPECT_EQ(b->tag, "blk");
  Act shared = a;
  a.reset();
  EXPECT_GT(testing::live_bytes(env.alloc), 0) << "freed while a handle remained";
  shared.reset();
  EXPECT_EQ(testing::live_bytes(env.alloc), 0);
}

TEST(LayerCostTest, SumsAndOrs) {
  LayerCost a{10, false, 20, 30, 40, 50};
  const LayerCost b{1, true, 2, 3, 4, 5};
  a += b;
  EXPECT_EQ(a.saved_bytes, 11);
  EXPECT_TRUE(a.saves_input);
  EXPECT_EQ(a.output_bytes, 22);
  EXPECT_EQ(a.workspace_bytes, 33);
  EXPECT_EQ(a.forward_flops, 44);
  EXPECT_EQ(a.backward_flops, 55);
  a += LayerCost{};
  EXPECT_TRUE(a.saves_input);
}

}  // namespace
}  // namespace memfit
