// TokenEmbedding and LmHead against double references and finite differences; their costs
// against the allocator on the meta backend; tying; the saved-state rules.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "core/layers/embedding.h"
#include "core/layers/lm_head.h"
#include "memory/check.h"
#include "memory/error.h"
#include "tests/core/layer_testutil.h"

namespace memfit {
namespace {

using testing::Params;
using testing::Vec;

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

void free_all(const std::vector<Parameter*>& ps) {
  for (Parameter* p : ps) {
    p->weight.reset();
    p->master.reset();
    p->grad.reset();
  }
}

// ---- TokenEmbedding -----------------------------------------------------------------------------

Vec ref_embedding(const std::vector<std::int32_t>& tok, std::int64_t t, std::int64_t c,
                  const Vec& wte, const Vec& wpe) {
  Vec y(tok.size() * static_cast<std::size_t>(c));
  for (std::size_t r = 0; r < tok.size(); ++r) {
    const auto pos = static_cast<std::int64_t>(r) % t;
    for (std::int64_t i = 0; i < c; ++i) {
      y[r * c + i] = wte[static_cast<std::size_t>(tok[r] * c + i)] +
                     wpe[static_cast<std::size_t>(pos * c + i)];
    }
  }
  return y;
}

TEST(TokenEmbeddingTest, NamesShapesInit) {
  TokenEmbedding e("emb", 64, 16, 32);
  auto ps = e.parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0]->name, "wte");
  EXPECT_EQ(ps[0]->shape, (Shape{64, 32}));
  EXPECT_EQ(ps[1]->name, "wpe");
  EXPECT_EQ(ps[1]->shape, (Shape{16, 32}));
  for (Parameter* p : ps) {
    EXPECT_EQ(p->init.kind, ParamInit::Kind::kNormal);
    EXPECT_FLOAT_EQ(p->init.std, 0.02f);
  }
  EXPECT_THROW(TokenEmbedding("e", 0, 16, 32), InvalidArgument);
}

TEST(TokenEmbeddingTest, ForwardAndGradients) {
  testing::CpuEnv env;
  TokenEmbedding e("emb", 7, 5, 4);
  e.allocate({env.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  std::mt19937 rng(81);
  const Params p = testing::rand_params(e.parameters(), rng);
  testing::set_params(e.parameters(), p);
  testing::zero_grads(env.ctx, e.parameters());
  // T = 3 < max_seq_len; token 2 repeats so dwte adds two rows.
  const testing::Ids tok(Shape{2, 3}, {2, 0, 6, 2, 5, 2});
  const std::int64_t base = testing::live_bytes(env.alloc);
  Act y = e.forward(env.ctx, tok.view());
  EXPECT_EQ(testing::live_bytes(env.alloc) - base,
            static_cast<std::int64_t>(env.alloc.round_size(y->view().nbytes())));
  EXPECT_EQ(y->view().shape(), (Shape{2, 3, 4}));
  auto ref = [&](const Params& q) { return ref_embedding(tok.data, 3, 4, q[0], q[1]); };
  const Vec got = testing::read(y->view());
  const Vec want = ref(p);
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6);

  const Vec dyv = testing::rand_vec(want.size(), rng);
  Act dy = testing::make_input(env.ctx, y->view().shape(), dyv);
  e.backward(env.ctx, tok.view(), dy);
  for (std::size_t k = 0; k < 2; ++k) {
    const Vec fd = testing::fd_grad(
        [&](const Vec& pk) {
          Params q = p;
          q[k] = pk;
          return testing::dot(dyv, ref(q));
        },
        p[k], 1e-5);
    // Sums of at most three f32 products: exact to ~1e-7.
    testing::expect_vec_near(testing::read(e.parameters()[k]->grad.view()), fd, 1e-6,
                             e.parameters()[k]->name);
  }
  y.reset();
  dy.reset();
  free_all(e.parameters());
}

TEST(TokenEmbeddingTest, LowPrecisionIsOneRounding) {
  testing::CpuEnv env(DType::kBF16);
  TokenEmbedding e("emb", 5, 4, 8);
  e.allocate({env.alloc, DType::kBF16, Device::kCpu, kDefaultStream});
  std::mt19937 rng(82);
  testing::set_params(e.parameters(), testing::rand_params(e.parameters(), rng));
  const Params p = testing::stored_params(e.parameters());
  const testing::Ids tok(Shape{1, 4}, {4, 1, 1, 0});
  Act y = e.forward(env.ctx, tok.view());
  EXPECT_EQ(y->view().dtype(), DType::kBF16);
  const Vec want = ref_embedding(tok.data, 4, 8, p[0], p[1]);
  const Vec got = testing::read(y->view());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(std::fabs(got[i] - want[i]), std::fabs(want[i]) * 0x1.0p-8 + 1e-30) << i;
  }
  y.reset();
  free_all(e.parameters());
}

TEST(TokenEmbeddingTest, MetaCostAndChecks) {
  for (DType dt : kDTypes) {
    testing::MetaEnv env(dt);
    TokenEmbedding e("emb", 128, 64, 64);
    e.allocate({env.alloc, dt, Device::kMeta, kDefaultStream});
    // Meta: the ids are never read, any aligned address will do.
    const IndexTensor tok{reinterpret_cast<const std::int32_t*>(std::uintptr_t{512}), Shape{2, 64},
                          Device::kMeta};
    const std::int64_t base = testing::live_bytes(env.alloc);
    Act y = e.forward(env.ctx, tok);
    EXPECT_EQ(testing::live_bytes(env.alloc) - base, 2 * e.cost(64, dt).output_bytes);
    EXPECT_EQ(env.be.stats().gemm_flops, 0);
    Act dy = env.ctx.make(y->view().shape(), dt, Category::kTemporary, "dy");
    e.backward(env.ctx, tok, dy);
    const IndexTensor too_long{tok.data, Shape{1, 65}, Device::kMeta};
    testing::expect_invalid([&] { e.forward(env.ctx, too_long); }, {"emb", "(1, 65)", "64"});
    const IndexTensor on_cpu{tok.data, Shape{2, 64}, Device::kCpu};
    testing::expect_invalid([&] { e.forward(env.ctx, on_cpu); }, {"cpu", "meta"});
    y.reset();
    dy.reset();
    free_all(e.parameters());
  }
}

// ---- LmHead -------------------------------------------------------------------------------------

// x (N,C) -> per-row cross-entropy of lnf(x) @ W^T against targets; logits out if asked.
Vec ref_head(const Vec& x, std::int64_t c, std::int64_t v, const Params& p,
             const std::vector<std::int32_t>& tgt, Vec* logits = nullptr) {
  const Vec xn = testing::ref_layernorm(x, c, p[0], p[1], 1e-5);
  const Vec lg = testing::ref_linear(xn, c, v, p[2], nullptr);
  Vec loss(tgt.size());
  for (std::size_t r = 0; r < tgt.size(); ++r) {
    double m = -1e300, z = 0;
    for (std::int64_t j = 0; j < v; ++j) m = std::max(m, lg[r * v + j]);
    for (std::int64_t j = 0; j < v; ++j) z += std::exp(lg[r * v + j] - m);
    loss[r] = m + std::log(z) - lg[r * v + static_cast<std::size_t>(tgt[r])];
  }
  if (logits) *logits = lg;
  return loss;
}

TEST(LmHeadTest, NamesUntiedAndTied) {
  LmHead own("head", 64, 32, nullptr);
  auto ps = own.parameters();
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[0]->name, "lnf.weight");
  EXPECT_EQ(ps[0]->init.kind, ParamInit::Kind::kOnes);
  EXPECT_EQ(ps[1]->name, "lnf.bias");
  EXPECT_EQ(ps[2]->name, "head.weight");
  EXPECT_EQ(ps[2]->shape, (Shape{64, 32}));
  EXPECT_FLOAT_EQ(ps[2]->init.std, 0.02f);
  EXPECT_FALSE(own.tied());
  TokenEmbedding emb("emb", 64, 16, 32);
  LmHead tied("head", 64, 32, &emb.wte());
  EXPECT_TRUE(tied.tied());
  EXPECT_EQ(tied.parameters()[2], &emb.wte());
  TokenEmbedding other("emb", 60, 16, 32);
  testing::expect_invalid([&] { LmHead("head", 64, 32, &other.wte()); }, {"wte", "(60, 32)"});
}

TEST(LmHeadTest, LossesLogitsAndGradients) {
  for (bool tie : {false, true}) {
    SCOPED_TRACE(tie ? "tied" : "untied");
    testing::CpuEnv env;
    const std::int64_t b = 2, t = 3, c = 6, v = 5;
    TokenEmbedding emb("emb", v, t, c);
    LmHead head("head", v, c, tie ? &emb.wte() : nullptr);
    emb.allocate({env.alloc, DType::kF32, Device::kCpu, kDefaultStream});
    head.allocate({env.alloc, DType::kF32, Device::kCpu, kDefaultStream});
    const std::vector<Parameter*> ps = head.parameters();
    std::mt19937 rng(91);
    const Params p = testing::rand_params(ps, rng);
    testing::set_params(ps, p);
    testing::zero_grads(env.ctx, ps);
    // A prior gradient in the projection (the embedding's share, when tied) must be kept.
    const Vec prior = testing::rand_vec(static_cast<std::size_t>(v * c), rng);
    testing::write(ps[2]->grad.view(), prior);
    const Vec xv = testing::rand_vec(static_cast<std::size_t>(b * t * c), rng);
    Act x = testing::make_input(env.ctx, Shape{b, t, c}, xv);
    const testing::Ids tgt(Shape{b, t}, {0, 4, 2, 2, 1, 3});

    Act losses = head.forward(env.ctx, x, tgt.view());
    EXPECT_EQ(losses->view().dtype(), DType::kF32);
    EXPECT_EQ(losses->view().numel(), b * t);
    Vec lg_ref;
    const Vec loss_ref = ref_head(xv, c, v, p, tgt.data, &lg_ref);
    ASSERT_NE(head.logits(), nullptr);
    testing::expect_vec_near(testing::read(*head.logits()), lg_ref, 1e-5, "logits");
    testing::expect_vec_near(testing::read(losses->view()), loss_ref, 1e-5, "losses");

    const float dloss = 0.37f;  // e.g. loss scale / rows
    Act dx = head.backward(env.ctx, tgt.view(), dloss);
    EXPECT_FALSE(head.has_saved());
    EXPECT_EQ(head.logits(), nullptr);
    auto total = [&](const Vec& xx, const Params& q) {
      double s = 0;
      for (double l : ref_head(xx, c, v, q, tgt.data)) s += l;
      return dloss * s;
    };
    // f32 sums of <= 6 terms of O(1) values against exact differences: 1e-4 relative to
    // (1 + |g|) is ~100x the rounding; a wrong term is O(|g|).
    testing::expect_vec_near(
        testing::read(dx->view()),
        testing::fd_grad([&](const Vec& xx) { return total(xx, p); }, xv, 1e-5), 1e-4, "dx");
    for (std::size_t k = 0; k < ps.size(); ++k) {
      Vec g = testing::fd_grad(
          [&](const Vec& pk) {
            Params q = p;
            q[k] = pk;
            return total(xv, q);
          },
          p[k], 1e-5);
      if (k == 2) g = testing::add(g, prior);
      testing::expect_vec_near(testing::read(ps[k]->grad.view()), g, 1e-4, ps[k]->name);
    }
    losses.reset();
    dx.reset();
    x.reset();
    free_all(emb.parameters());
    free_all(head.parameters());
  }
}

TEST(LmHeadTest, RecomputeAndLowPrecision) {
  const std::int64_t c = 16, v = 24;
  const testing::Ids tgt(Shape{2, 4}, {1, 23, 0, 7, 7, 12, 3, 19});
  std::mt19937 rng(92);
  const Vec xv = testing::rand_vec(2 * 4 * c, rng);
  Params p;
  std::vector<float> loss32;
  for (DType dt : kDTypes) {
    testing::CpuEnv env(dt);
    LmHead head("head", v, c, nullptr);
    head.allocate({env.alloc, dt, Device::kCpu, kDefaultStream});
    if (p.empty()) p = testing::rand_params(head.parameters(), rng);
    testing::set_params(head.parameters(), p);
    testing::zero_grads(env.ctx, head.parameters());
    Act x = testing::make_input(env.ctx, Shape{2, 4, c}, xv);
    const Vec ref = ref_head(testing::read(x->view()), c, v,
                             testing::stored_params(head.parameters()), tgt.data);
    std::vector<unsigned char> first;
    for (int pass = 0; pass < 2; ++pass) {
      Act losses = head.forward(env.ctx, x, tgt.view());
      if (pass == 0) first = testing::bits(losses->view());
      EXPECT_EQ(testing::bits(losses->view()), first);
      const Vec got = testing::read(losses->view());
      // Losses are f32 from logits rounded to dt (|logit| < ~4 here): the error is a few
      // units of the dtype's roundoff times the logits' size (measured below 2; allowed 8).
      const double u = dt == DType::kF32 ? 1e-6 : dt == DType::kF16 ? 0x1.0p-11 : 0x1.0p-8;
      for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 8 * 4 * u) << i;
      head.backward(env.ctx, tgt.view(), 1.0f / 8).reset();
    }
    x.reset();
    free_all(head.parameters());
  }
}

TEST(LmHeadTest, MemoryMatchesCost) {
  for (DType dt : kDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    testing::MetaEnv env(dt);
    const std::int64_t b = 2, t = 64, c = 64, v = 256;
    LmHead head("head", v, c, nullptr);
    head.allocate({env.alloc, dt, Device::kMeta, kDefaultStream});
    const LayerCost k = head.cost(t, dt);
    const IndexTensor tgt{reinterpret_cast<const std::int32_t*>(std::uintptr_t{512}), Shape{b, t},
                          Device::kMeta};
    Act x = env.ctx.make(Shape{b, t, c}, dt, Category::kActivation, "input");
    const std::int64_t base = testing::live_bytes(env.alloc);
    env.alloc.reset_peak_stats();
    Act losses = head.forward(env.ctx, x, tgt);
    EXPECT_EQ(env.be.stats().gemm_flops, b * k.forward_flops);
    const auto out = static_cast<std::int64_t>(losses->view().nbytes());
    EXPECT_EQ(out, b * k.output_bytes);
    const std::int64_t held = testing::live_bytes(env.alloc) - base - out;
    EXPECT_EQ(held, b * k.saved_bytes);
    EXPECT_EQ(testing::peak_bytes(env.alloc), testing::live_bytes(env.alloc));  // no workspace
    EXPECT_THROW(head.forward(env.ctx, x, tgt), CheckFailure);
    losses.reset();
    const std::int64_t base_b = testing::live_bytes(env.alloc);
    env.alloc.reset_peak_stats();
    env.be.reset_stats();
    Act dx = head.backward(env.ctx, tgt, 1.0f);
    EXPECT_EQ(env.be.stats().gemm_flops, b * k.backward_flops);
    const auto dxb = static_cast<std::int64_t>(dx->view().nbytes());
    EXPECT_EQ(testing::peak_bytes(env.alloc) - base_b - dxb, b * k.workspace_bytes);
    EXPECT_EQ(testing::live_bytes(env.alloc) - base_b, dxb - held);
    dx.reset();
    EXPECT_EQ(testing::live_bytes(env.alloc), base);
    losses = head.forward(env.ctx, x, tgt);
    EXPECT_TRUE(head.has_saved());
    head.release_saved();
    losses.reset();
    EXPECT_FALSE(head.has_saved());
    EXPECT_EQ(testing::live_bytes(env.alloc), base);
    x.reset();
    free_all(head.parameters());
  }
}

}  // namespace
}  // namespace memfit
