// Model: parameter names, shapes, order and allocation per dtype; init's determinism and
// distributions; user chains; meta and CPU building the same allocator state.
#include "core/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/layers/linear.h"
#include "memory/error.h"
#include "tests/core/exec_testutil.h"

namespace memfit {
namespace {

using testing::bytes_of;
using testing::Rig;
using testing::to_host;

struct Expected {
  std::string name;
  Shape shape;
};

// /work/golden_spec.md's list: the order and shapes every other piece (golden file, training
// state, optimizers) relies on.
std::vector<Expected> gpt_names(const ModelSpec& s) {
  const std::int64_t c = s.hidden, f = s.mlp_ratio * c;
  std::vector<Expected> e = {{"wte", {s.vocab, c}}, {"wpe", {s.seq_len, c}}};
  for (int i = 0; i < s.layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    if (s.kind == ModelSpec::Kind::kGpt) {
      e.push_back({h + "ln1.weight", {c}});
      e.push_back({h + "ln1.bias", {c}});
      e.push_back({h + "attn.qkv.weight", {3 * c, c}});
      e.push_back({h + "attn.qkv.bias", {3 * c}});
      e.push_back({h + "attn.proj.weight", {c, c}});
      e.push_back({h + "attn.proj.bias", {c}});
      e.push_back({h + "ln2.weight", {c}});
      e.push_back({h + "ln2.bias", {c}});
    } else {
      e.push_back({h + "ln.weight", {c}});
      e.push_back({h + "ln.bias", {c}});
    }
    e.push_back({h + "mlp.fc.weight", {f, c}});
    e.push_back({h + "mlp.fc.bias", {f}});
    e.push_back({h + "mlp.proj.weight", {c, f}});
    e.push_back({h + "mlp.proj.bias", {c}});
  }
  e.push_back({"lnf.weight", {c}});
  e.push_back({"lnf.bias", {c}});
  if (!s.tied_head) e.push_back({"head.weight", {s.vocab, c}});
  return e;
}

void expect_names(Model& m) {
  const std::vector<Expected> want = gpt_names(m.spec());
  const std::vector<Parameter*> got = m.parameters();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i]->name, want[i].name) << i;
    EXPECT_EQ(got[i]->shape, want[i].shape) << want[i].name;
  }
  EXPECT_EQ(m.parameter_count(), m.spec().parameter_count());
}

TEST(Model, NamesShapesAndOrder) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  ModelSpec s = ModelSpec::preset("gpt-micro");
  {
    Model m(s, ctx);
    expect_names(m);
    EXPECT_EQ(m.num_blocks(), 2);
    EXPECT_EQ(m.block(1).name(), "h.1");
    EXPECT_TRUE(m.head().tied());
    // The tied wte appears once, in the embedding; the head's own are lnf only.
    EXPECT_EQ(m.head_parameters().size(), 2u);
    EXPECT_EQ(m.embedding_parameters()[0], &m.embedding().wte());
    EXPECT_THROW(m.block(2), InvalidArgument);
    EXPECT_THROW(m.block(-1), InvalidArgument);
  }
  s.tied_head = false;
  {
    Model m(s, ctx);
    expect_names(m);
    EXPECT_EQ(m.head_parameters().back()->name, "head.weight");
  }
  s.kind = ModelSpec::Kind::kMlp;
  {
    Model m(s, ctx);
    expect_names(m);
  }
}

TEST(Model, AllocatesPerDtype) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    Rig rig(false);
    LayerContext ctx = rig.ctx(dt);
    Model m(ModelSpec::preset("gpt-micro"), ctx);
    EXPECT_EQ(m.dtype(), dt);
    std::int64_t param = 0, master = 0, grad = 0;
    for (Parameter* p : m.parameters()) {
      EXPECT_EQ(p->weight.view().dtype(), dt) << p->name;
      EXPECT_EQ(p->grad.view().dtype(), DType::kF32) << p->name;
      EXPECT_EQ(p->master_on_device(), dt != DType::kF32) << p->name;
      param += static_cast<std::int64_t>(rig.alloc->round_size(p->weight.view().nbytes()));
      grad += static_cast<std::int64_t>(rig.alloc->round_size(p->grad.view().nbytes()));
      if (p->master_on_device()) {
        master += static_cast<std::int64_t>(rig.alloc->round_size(p->master.view().nbytes()));
      }
    }
    const AllocatorStats st = rig.alloc->stats();
    EXPECT_EQ(st.category_bytes[static_cast<int>(Category::kParameter)].current, param);
    EXPECT_EQ(st.category_bytes[static_cast<int>(Category::kGradient)].current, grad);
    EXPECT_EQ(st.category_bytes[static_cast<int>(Category::kOptimizerState)].current, master);
    EXPECT_EQ(st.category_bytes[static_cast<int>(Category::kActivation)].current, 0);
  }
}

TEST(Model, InitIsDeterministicAndDtypeIndependent) {
  Rig rig(false);
  LayerContext f32 = rig.ctx(DType::kF32);
  LayerContext bf16 = rig.ctx(DType::kBF16);
  const ModelSpec s = ModelSpec::preset("gpt-micro");
  Model a(s, f32), b(s, f32), c(s, bf16), d(s, f32);
  a.init(42, f32);
  b.init(42, f32);
  c.init(42, bf16);
  d.init(43, f32);
  const auto pa = a.parameters(), pb = b.parameters(), pc = c.parameters(), pd = d.parameters();
  bool any_diff = false;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(bytes_of(pa[i]->weight.view()), bytes_of(pb[i]->weight.view())) << pa[i]->name;
    // bf16's FP32 master holds exactly the f32 model's values; its weight is their rounding.
    EXPECT_EQ(bytes_of(pa[i]->weight.view()), bytes_of(pc[i]->master.view())) << pa[i]->name;
    std::vector<std::uint16_t> rounded(static_cast<std::size_t>(pa[i]->numel()));
    convert(pa[i]->weight.view().raw(), DType::kF32, rounded.data(), DType::kBF16, rounded.size());
    EXPECT_EQ(std::memcmp(rounded.data(), pc[i]->weight.view().raw(), rounded.size() * 2), 0)
        << pa[i]->name;
    any_diff = any_diff || bytes_of(pa[i]->weight.view()) != bytes_of(pd[i]->weight.view());
  }
  EXPECT_TRUE(any_diff) << "seeds 42 and 43 gave the same model";
}

TEST(Model, InitFollowsEachParametersScheme) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  ModelSpec s = ModelSpec::preset("gpt-tiny");  // big enough for the standard deviations
  s.layers = 2;
  Model m(s, ctx);
  m.init(1, ctx);
  const double resid = 0.02 / std::sqrt(2.0 * 2);
  for (Parameter* p : m.parameters()) {
    const std::vector<float> v = to_host(ctx, p->weight.view());
    double sum = 0, sq = 0;
    for (float x : v) {
      sum += x;
      sq += double{x} * x;
    }
    const double n = static_cast<double>(v.size());
    const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    const bool is_bias = p->name.find("bias") != std::string::npos;
    const bool is_ln = p->name.find("ln") != std::string::npos;
    if (is_bias) {
      EXPECT_EQ(sq, 0.0) << p->name;
    } else if (is_ln) {
      EXPECT_EQ(sum, n) << p->name;
      EXPECT_EQ(sd, 0.0) << p->name;
    } else {
      const bool proj = p->name.find("proj.weight") != std::string::npos;
      const double want = proj ? resid : 0.02;
      EXPECT_NEAR(sd, want, 0.05 * want) << p->name;  // >= 65536 samples: sd error ~0.3%
      EXPECT_NEAR(mean, 0.0, 0.05 * want) << p->name;
    }
  }
}

TEST(Model, ZeroGradAndReleaseSaved) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  Model m(ModelSpec::preset("gpt-micro"), ctx);
  m.init(3, ctx);
  for (Parameter* p : m.parameters()) rig.be->fill(ctx.stream, p->grad.view(), 7.0f);
  m.zero_grad(ctx);
  for (Parameter* p : m.parameters()) {
    for (float g : to_host(ctx, p->grad.view())) ASSERT_EQ(g, 0.0f) << p->name;
  }
  testing::Batch batch(rig, 2, 8, 64, 5);
  Act x = m.embedding().forward(ctx, batch.mb.tokens);
  Act y = m.block(0).forward(ctx, x, true);
  EXPECT_TRUE(m.any_saved());
  m.release_saved();
  EXPECT_FALSE(m.any_saved());
  x.reset();
  y.reset();
  EXPECT_EQ(testing::activation_bytes_now(*rig.alloc), 0);
}

TEST(Model, UserChain) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  ModelSpec s = ModelSpec::preset("gpt-micro");
  std::vector<std::unique_ptr<Layer>> blocks;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(std::make_unique<Linear>("lin." + std::to_string(i), s.hidden, s.hidden));
  }
  Model m(s, std::move(blocks), ctx);
  EXPECT_EQ(m.num_blocks(), 3);
  EXPECT_EQ(m.spec().layers, 3);
  EXPECT_EQ(m.parameters()[2]->name, "lin.0.weight");
  EXPECT_EQ(m.block_parameters(2).size(), 2u);

  EXPECT_THROW(Model(s, {}, ctx), InvalidArgument);
  std::vector<std::unique_ptr<Layer>> with_null;
  with_null.push_back(nullptr);
  EXPECT_THROW(Model(s, std::move(with_null), ctx), InvalidArgument);
  const std::int64_t before = rig.alloc->stats().allocated_bytes[kStatAll].current;
  std::vector<std::unique_ptr<Layer>> clash;
  clash.push_back(std::make_unique<Linear>("same", s.hidden, s.hidden));
  clash.push_back(std::make_unique<Linear>("same", s.hidden, s.hidden));
  try {
    Model bad(s, std::move(clash), ctx);
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("same.weight"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rig.alloc->stats().allocated_bytes[kStatAll].current, before);
}

TEST(Model, MetaBuildsTheSameAllocatorState) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Rig cpu(false), meta(true);
    LayerContext c = cpu.ctx(dt), mc = meta.ctx(dt);
    Model a(ModelSpec::preset("gpt-micro"), c), b(ModelSpec::preset("gpt-micro"), mc);
    a.init(1, c);
    b.init(1, mc);
    EXPECT_EQ(b.device(), Device::kMeta);
    const AllocatorStats sa = cpu.alloc->stats(), sb = meta.alloc->stats();
    EXPECT_EQ(sa.allocated_bytes[kStatAll].peak, sb.allocated_bytes[kStatAll].peak);
    EXPECT_EQ(sa.reserved_bytes[kStatAll].peak, sb.reserved_bytes[kStatAll].peak);
    for (std::size_t k = 0; k < kCategoryCount; ++k) {
      EXPECT_EQ(sa.category_bytes[k].peak, sb.category_bytes[k].peak) << k;
    }
  }
}

TEST(Model, CostsComeFromTheLayers) {
  Rig rig(true);
  LayerContext ctx = rig.ctx(DType::kBF16);
  Model m(ModelSpec::preset("gpt2"), ctx);  // meta: 124M parameters cost no memory
  EXPECT_EQ(m.parameter_count(), 124439808);
  const LayerCost b = m.block_cost(3, 1024, DType::kBF16);
  EXPECT_GT(b.saved_bytes, 0);
  EXPECT_GT(b.forward_flops, 0);
  EXPECT_EQ(m.head_cost(1024, DType::kBF16).saved_bytes,
            m.head().cost(1024, DType::kBF16).saved_bytes);
  EXPECT_EQ(m.embedding_cost(1024, DType::kBF16).output_bytes, 1024 * 768 * 2);
  EXPECT_THROW(m.block_cost(12, 1024, DType::kBF16), InvalidArgument);
}

}  // namespace
}  // namespace memfit
