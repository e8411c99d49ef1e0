// LmHead's chunked loss (LossMode::kChunked) and its RMSNorm head: the chunk rule, the same
// losses and gradients as the whole-logits head (and as a double reference through finite
// differences), bytes and flops on the meta backend as cost() says, and that no (N, V) tensor
// is ever allocated.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "core/layers/embedding.h"
#include "core/layers/lm_head.h"
#include "memory/error.h"
#include "tests/core/layer_testutil.h"

namespace memfit {
namespace {

using testing::Params;
using testing::Vec;

void free_all(const std::vector<Parameter*>& ps) {
  for (Parameter* p : ps) {
    p->weight.reset();
    p->master.reset();
    p->grad.reset();
  }
}

// x (N,C) -> per-row cross-entropy of rmsnorm(x) @ W^T; p = {norm weight, W}.
Vec ref_rms_head(const Vec& x, std::int64_t c, std::int64_t v, const Params& p,
                 const std::vector<std::int32_t>& tgt, double eps) {
  const std::size_t n = tgt.size();
  Vec xn(x.size());
  for (std::size_t r = 0; r < n; ++r) {
    double ss = 0;
    for (std::int64_t i = 0; i < c; ++i) ss += x[r * c + i] * x[r * c + i];
    const double rstd = 1.0 / std::sqrt(ss / double(c) + eps);
    for (std::int64_t i = 0; i < c; ++i) xn[r * c + i] = x[r * c + i] * rstd * p[0][i];
  }
  const Vec lg = testing::ref_linear(xn, c, v, p[1], nullptr);
  Vec loss(n);
  for (std::size_t r = 0; r < n; ++r) {
    double m = -1e300, z = 0;
    for (std::int64_t j = 0; j < v; ++j) m = std::max(m, lg[r * v + j]);
    for (std::int64_t j = 0; j < v; ++j) z += std::exp(lg[r * v + j] - m);
    loss[r] = m + std::log(z) - lg[r * v + static_cast<std::size_t>(tgt[r])];
  }
  return loss;
}

TEST(LmHeadChunked, ChunkRule) {
  LmHead narrow("head", 5, 6, nullptr);  // V <= C: one chunk, so kWhole either way
  narrow.set_loss(LossMode::kChunked);
  EXPECT_EQ(narrow.loss_chunk_rows(100), 100);
  LmHead wide("head", 256, 64, nullptr, HeadNorm::kRMSNorm);  // k = 4 chunks
  EXPECT_EQ(wide.loss_chunk_rows(128), 128);                  // kWhole by default
  wide.set_loss(LossMode::kChunked);
  EXPECT_EQ(wide.loss(), LossMode::kChunked);
  EXPECT_EQ(wide.loss_chunk_rows(128), 32);
  EXPECT_EQ(wide.loss_chunk_rows(129), 33);  // ceil: at most k chunks, the last one shorter
  EXPECT_EQ(wide.loss_chunk_rows(3), 1);
  EXPECT_EQ(wide.loss_chunk_rows(1), 1);
  LmHead llama3("head", 128256, 4096, nullptr, HeadNorm::kRMSNorm);  // ceil(V/C) = 32: 8
  llama3.set_loss(LossMode::kChunked);
  EXPECT_EQ(llama3.loss_chunk_rows(2 * 2048), 2 * 2048 / kMaxLossChunks);
  LossMode m = LossMode::kWhole;
  EXPECT_TRUE(parse_loss_mode("chunked", &m));
  EXPECT_EQ(m, LossMode::kChunked);
  EXPECT_FALSE(parse_loss_mode("chunks", &m));
  EXPECT_STREQ(loss_mode_name(LossMode::kWhole), "whole");
}

TEST(LmHeadChunked, RmsNormHeadNamesAndGradients) {
  testing::CpuEnv env;
  const std::int64_t b = 2, t = 3, c = 4, v = 9;  // k = 3 chunks of 2 rows
  LmHead head("head", v, c, nullptr, HeadNorm::kRMSNorm, 1e-6f);
  head.set_loss(LossMode::kChunked);
  const std::vector<Parameter*> ps = head.parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0]->name, "norm.weight");
  EXPECT_EQ(ps[0]->init.kind, ParamInit::Kind::kOnes);
  EXPECT_EQ(ps[1]->name, "head.weight");
  head.allocate({env.alloc, DType::kF32, Device::kCpu, kDefaultStream});
  std::mt19937 rng(17);
  const Params p = testing::rand_params(ps, rng);
  testing::set_params(ps, p);
  testing::zero_grads(env.ctx, ps);
  const Vec xv = testing::rand_vec(static_cast<std::size_t>(b * t * c), rng);
  Act x = testing::make_input(env.ctx, Shape{b, t, c}, xv);
  const testing::Ids tgt(Shape{b, t}, {0, 8, 2, 5, 1, 3});
  Act losses = head.forward(env.ctx, x, tgt.view());
  EXPECT_EQ(head.logits(), nullptr);  // chunked: none saved
  testing::expect_vec_near(testing::read(losses->view()), ref_rms_head(xv, c, v, p, tgt.data, 1e-6),
                           1e-5, "losses");
  const float dloss = 0.41f;
  Act dx = head.backward(env.ctx, tgt.view(), dloss);
  auto total = [&](const Vec& xx, const Params& q) {
    double s = 0;
    for (double l : ref_rms_head(xx, c, v, q, tgt.data, 1e-6)) s += l;
    return dloss * s;
  };
  testing::expect_vec_near(testing::read(dx->view()),
                           testing::fd_grad([&](const Vec& xx) { return total(xx, p); }, xv, 1e-5),
                           1e-4, "dx");
  for (std::size_t k = 0; k < ps.size(); ++k) {
    const Vec g = testing::fd_grad(
        [&](const Vec& pk) {
          Params q = p;
          q[k] = pk;
          return total(xv, q);
        },
        p[k], 1e-5);
    testing::expect_vec_near(testing::read(ps[k]->grad.view()), g, 1e-4, ps[k]->name);
  }
  losses.reset();
  dx.reset();
  x.reset();
  free_all(ps);
}

// The chunked head computes what the whole one does, for both norms, tied or not, in every
// dtype, with a ragged last chunk. The losses and lse come from the same GEMM rows; the
// weight gradient sums the chunks' products in a different grouping, so the comparison is to
// the f32 accumulation's rounding (measured: losses bit-identical; gradients within 1e-6
// relative of the tensor's largest entry).
TEST(LmHeadChunked, SameLossesAndGradientsAsWhole) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (HeadNorm norm : {HeadNorm::kLayerNorm, HeadNorm::kRMSNorm}) {
      for (bool tie : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + (norm == HeadNorm::kRMSNorm ? " rms" : " ln") +
                     (tie ? " tied" : " untied"));
        const std::int64_t b = 3, t = 7, c = 8, v = 37;  // k = 5, 21 rows: chunks of 5, last 1
        std::mt19937 rng(23);
        const Vec xv = testing::rand_vec(static_cast<std::size_t>(b * t * c), rng, -2, 2);
        std::vector<std::int32_t> ids(static_cast<std::size_t>(b * t));
        for (auto& id : ids) id = static_cast<std::int32_t>(rng() % v);
        const testing::Ids tgt(Shape{b, t}, ids);
        Params p;
        std::vector<Vec> results[2];  // losses, dx, then each gradient
        for (LossMode mode : {LossMode::kWhole, LossMode::kChunked}) {
          testing::CpuEnv env(dt);
          TokenEmbedding emb("emb", v, t, c);
          LmHead head("head", v, c, tie ? &emb.wte() : nullptr, norm);
          head.set_loss(mode);
          EXPECT_EQ(head.loss_chunk_rows(b * t), mode == LossMode::kWhole ? b * t : 5);
          emb.allocate({env.alloc, dt, Device::kCpu, kDefaultStream});
          head.allocate({env.alloc, dt, Device::kCpu, kDefaultStream});
          const std::vector<Parameter*> ps = head.parameters();
          if (p.empty()) p = testing::rand_params(ps, rng);
          testing::set_params(ps, p);
          testing::zero_grads(env.ctx, ps);
          Act x = testing::make_input(env.ctx, Shape{b, t, c}, xv);
          Act losses = head.forward(env.ctx, x, tgt.view());
          Act dx = head.backward(env.ctx, tgt.view(), 1.0f / 21);
          auto& r = results[mode == LossMode::kChunked];
          r.push_back(testing::read(losses->view()));
          r.push_back(testing::read(dx->view()));
          for (Parameter* q : ps) r.push_back(testing::read(q->grad.view()));
          losses.reset();
          dx.reset();
          x.reset();
          free_all(head.parameters());
          free_all(emb.parameters());
        }
        ASSERT_EQ(results[0].size(), results[1].size());
        EXPECT_EQ(results[0][0], results[1][0]) << "losses";
        for (std::size_t i = 1; i < results[0].size(); ++i) {
          double scale = 0;
          for (double g : results[0][i]) scale = std::max(scale, std::fabs(g));
          // dx in dt: one rounding of the dtype apart at most.
          const double tol = (dt == DType::kF32 ? 1e-6 : 0x1.0p-8) * (scale + 1e-30);
          for (std::size_t j = 0; j < results[0][i].size(); ++j) {
            ASSERT_NEAR(results[1][i][j], results[0][i][j], tol)
                << "tensor " << i << " [" << j << "]";
          }
        }
      }
    }
  }
}

// On the meta backend: forward holds xn, the statistics and lse (no logits), and peaks one
// chunk's logits above that; backward peaks at dxn + one chunk beside the saved state, and
// runs one more GEMM than kWhole (the logits recomputed); nothing of size (N, V) is allocated.
TEST(LmHeadChunked, MemoryAndFlopsMatchCost) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (HeadNorm norm : {HeadNorm::kLayerNorm, HeadNorm::kRMSNorm}) {
      SCOPED_TRACE(dtype_name(dt));
      testing::MetaEnv env(dt);
      const std::int64_t b = 2, t = 64, c = 64, v = 256;  // 128 rows, 4 chunks of 32
      LmHead head("head", v, c, nullptr, norm);
      head.set_loss(LossMode::kChunked);
      head.allocate({env.alloc, dt, Device::kMeta, kDefaultStream});
      const LayerCost k = head.cost(t, dt);
      const LayerCost whole = [&] {
        LmHead w("head", v, c, nullptr, norm);
        return w.cost(t, dt);
      }();
      EXPECT_LT(k.saved_bytes, whole.saved_bytes);
      EXPECT_EQ(whole.saved_bytes - k.saved_bytes,
                static_cast<std::int64_t>(t * v * dtype_size(dt)));  // the logits
      EXPECT_EQ(k.workspace_bytes, static_cast<std::int64_t>(t / 4 * v * dtype_size(dt)));
      EXPECT_EQ(k.backward_flops, 3 * k.forward_flops);
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
      EXPECT_EQ(testing::peak_bytes(env.alloc) - testing::live_bytes(env.alloc),
                b * k.workspace_bytes);
      losses.reset();
      const std::int64_t base_b = testing::live_bytes(env.alloc);
      env.alloc.reset_peak_stats();
      env.be.reset_stats();
      Act dx = head.backward(env.ctx, tgt, 1.0f);
      EXPECT_EQ(env.be.stats().gemm_flops, b * k.backward_flops);
      const auto dxb = static_cast<std::int64_t>(dx->view().nbytes());
      EXPECT_EQ(testing::peak_bytes(env.alloc) - base_b - dxb, b * k.workspace_bytes);
      EXPECT_EQ(testing::live_bytes(env.alloc) - base_b, dxb - held);
      // The largest block ever allocated is no (N, V) tensor.
      EXPECT_LT(testing::peak_bytes(env.alloc) - base_b,
                static_cast<std::int64_t>(b * t * v * dtype_size(dt)));
      dx.reset();
      EXPECT_EQ(testing::live_bytes(env.alloc), base);
      x.reset();
      free_all(head.parameters());
    }
  }
}

TEST(LmHeadChunked, SetLossOnlyBetweenSteps) {
  testing::MetaEnv env;
  LmHead head("head", 256, 64, nullptr);
  head.allocate({env.alloc, DType::kF32, Device::kMeta, kDefaultStream});
  const IndexTensor tgt{reinterpret_cast<const std::int32_t*>(std::uintptr_t{512}), Shape{1, 8},
                        Device::kMeta};
  Act x = env.ctx.make(Shape{1, 8, 64}, DType::kF32, Category::kActivation, "input");
  Act losses = head.forward(env.ctx, x, tgt);
  testing::expect_invalid([&] { head.set_loss(LossMode::kChunked); }, {"between steps"});
  head.release_saved();
  head.set_loss(LossMode::kChunked);
  EXPECT_EQ(head.loss(), LossMode::kChunked);
  losses.reset();
  x.reset();
  free_all(head.parameters());
}

}  // namespace
}  // namespace memfit
