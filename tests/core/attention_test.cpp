// Causal softmax, the composed attention and the fused softmax cross-entropy on the CPU
// backend, against double-precision references and finite differences written here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "tests/core/nn_testutil.h"

namespace memfit {
namespace {

using namespace testing;  // NOLINT

constexpr StreamId s0 = kDefaultStream;

// ---- causal softmax ------------------------------------------------------------------------

Vec softmax_fwd(const Vec& x, std::int64_t t, double scale) {
  Vec p(x.size(), 0.0);
  for (std::size_t r = 0; r < x.size() / t; ++r) {
    const std::int64_t i = r % t;
    double mx = -1e300, s = 0;
    for (std::int64_t j = 0; j <= i; ++j) mx = std::max(mx, scale * x[r * t + j]);
    for (std::int64_t j = 0; j <= i; ++j) s += std::exp(scale * x[r * t + j] - mx);
    for (std::int64_t j = 0; j <= i; ++j) p[r * t + j] = std::exp(scale * x[r * t + j] - mx) / s;
  }
  return p;
}
Vec softmax_bwd(const Vec& dp, const Vec& p, std::int64_t t, double scale) {
  Vec dx(p.size(), 0.0);
  for (std::size_t r = 0; r < p.size() / t; ++r) {
    const std::int64_t i = r % t;
    double d = 0;
    for (std::int64_t j = 0; j <= i; ++j) d += p[r * t + j] * dp[r * t + j];
    for (std::int64_t j = 0; j <= i; ++j)
      dx[r * t + j] = scale * p[r * t + j] * (dp[r * t + j] - d);
  }
  return dx;
}

TEST(Attention, SoftmaxAnalyticMatchesFiniteDifferences) {
  std::mt19937 rng(10);
  std::uniform_real_distribution<double> u(-2, 2);
  const std::int64_t t = 5;
  Vec x(2 * t * t), dp(x.size());
  for (double& v : x) v = u(rng);
  for (double& v : dp) v = u(rng);
  const double scale = 0.7;
  expect_vec_near(softmax_bwd(dp, softmax_fwd(x, t, scale), t, scale),
                  fd_grad([&](const Vec& xx) { return dot(dp, softmax_fwd(xx, t, scale)); }, x),
                  1e-7, "dsoftmax");
}

TEST(Attention, SoftmaxCausalEveryDtypeMaskExact) {
  for (std::int64_t t : {std::int64_t{1}, std::int64_t{7}, std::int64_t{64}}) {
    for (DType dt : kAllDTypes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " T=" + std::to_string(t));
      CpuBackend be;
      std::mt19937 rng(11);
      const std::int64_t r = 24;  // (2,12,T,T): 64K+ scores at T=64 takes the parallel path
      HT pre({2, r / 2, t, t}, dt), att({2, r / 2, t, t}, dt);
      pre.rand(rng, -4, 4);
      att.poison();
      const float scale = 0.3f;
      be.softmax_causal_forward(s0, pre, scale, att);
      const Vec p = softmax_fwd(pre.vals(), t, scale);
      expect_close(att, p, dt, "att", 1, 2);
      for (std::int64_t m = 0; m < r; ++m) {
        for (std::int64_t i = 0; i < t; ++i) {
          for (std::int64_t j = i + 1; j < t; ++j) {
            ASSERT_EQ(att.get((m * t + i) * t + j), 0.0f) << "above the diagonal";
          }
        }
      }
      HT datt({r, t, t}, dt), dpre({r, t, t}, dt);
      datt.rand(rng);
      dpre.poison();
      be.softmax_causal_backward(s0, datt, att, scale, dpre);
      expect_close(dpre, softmax_bwd(datt.vals(), att.vals(), t, scale), dt, "dpreatt", 1, 2);
      be.softmax_causal_backward(s0, datt, att, scale, datt);  // in place
      for (std::int64_t i = 0; i < dpre.n(); ++i) ASSERT_EQ(datt.get(i), dpre.get(i)) << i;
      be.softmax_causal_forward(s0, pre, scale, pre);  // in place
      for (std::int64_t i = 0; i < pre.n(); ++i) ASSERT_EQ(pre.get(i), att.get(i)) << i;
    }
  }
}

// ---- attention -----------------------------------------------------------------------------

struct Dims {
  std::int64_t B, T, C, H;
  std::int64_t hs() const { return C / H; }
};

// Element (b,t,part,h,d) of a (B,T,3C) qkv vector.
double at(const Vec& qkv, const Dims& d, std::int64_t b, std::int64_t t, std::int64_t part,
          std::int64_t h, std::int64_t e) {
  return qkv[((b * d.T + t) * 3 + part) * d.C + h * d.hs() + e];
}

// out (B,T,C) of causal self-attention, and the probabilities (B,H,T,T).
Vec attn_fwd(const Vec& qkv, const Dims& d, Vec* probs = nullptr) {
  const std::int64_t hs = d.hs();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Vec out(d.B * d.T * d.C, 0.0);
  if (probs != nullptr) probs->assign(d.B * d.H * d.T * d.T, 0.0);
  for (std::int64_t b = 0; b < d.B; ++b) {
    for (std::int64_t h = 0; h < d.H; ++h) {
      Vec s(d.T * d.T, 0.0);
      for (std::int64_t i = 0; i < d.T; ++i) {
        for (std::int64_t j = 0; j < d.T; ++j) {
          for (std::int64_t e = 0; e < hs; ++e)
            s[i * d.T + j] += at(qkv, d, b, i, 0, h, e) * at(qkv, d, b, j, 1, h, e);
        }
      }
      const Vec p = softmax_fwd(s, d.T, scale);
      for (std::int64_t i = 0; i < d.T; ++i) {
        for (std::int64_t e = 0; e < hs; ++e) {
          double y = 0;
          for (std::int64_t j = 0; j <= i; ++j) y += p[i * d.T + j] * at(qkv, d, b, j, 2, h, e);
          out[(b * d.T + i) * d.C + h * hs + e] = y;
        }
      }
      if (probs != nullptr)
        std::copy(p.begin(), p.end(), probs->begin() + (b * d.H + h) * d.T * d.T);
    }
  }
  return out;
}

// dqkv (B,T,3C) from dout (B,T,C): the analytic backward, per (b,h).
Vec attn_bwd(const Vec& qkv, const Vec& dout, const Dims& d) {
  const std::int64_t hs = d.hs(), T = d.T;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Vec probs;
  attn_fwd(qkv, d, &probs);
  Vec g(qkv.size(), 0.0);
  auto gi = [&](std::int64_t b, std::int64_t t, std::int64_t part, std::int64_t h,
                std::int64_t e) -> double& {
    return g[((b * T + t) * 3 + part) * d.C + h * hs + e];
  };
  for (std::int64_t b = 0; b < d.B; ++b) {
    for (std::int64_t h = 0; h < d.H; ++h) {
      const double* p = &probs[(b * d.H + h) * T * T];
      Vec dp(T * T, 0.0), pv(p, p + T * T);
      for (std::int64_t i = 0; i < T; ++i) {
        for (std::int64_t j = 0; j < T; ++j) {
          for (std::int64_t e = 0; e < hs; ++e) {
            const double dy = dout[(b * T + i) * d.C + h * hs + e];
            dp[i * T + j] += dy * at(qkv, d, b, j, 2, h, e);
            gi(b, j, 2, h, e) += p[i * T + j] * dy;  // dv = p^T dy
          }
        }
      }
      const Vec ds = softmax_bwd(dp, pv, T, scale);  // includes the scale
      for (std::int64_t i = 0; i < T; ++i) {
        for (std::int64_t j = 0; j < T; ++j) {
          for (std::int64_t e = 0; e < hs; ++e) {
            gi(b, i, 0, h, e) += ds[i * T + j] * at(qkv, d, b, j, 1, h, e);
            gi(b, j, 1, h, e) += ds[i * T + j] * at(qkv, d, b, i, 0, h, e);
          }
        }
      }
    }
  }
  return g;
}

TEST(Attention, AnalyticMatchesFiniteDifferences) {
  const Dims d{2, 4, 6, 2};
  std::mt19937 rng(12);
  std::uniform_real_distribution<double> u(-1, 1);
  Vec qkv(d.B * d.T * 3 * d.C), dout(d.B * d.T * d.C);
  for (double& v : qkv) v = u(rng);
  for (double& v : dout) v = u(rng);
  expect_vec_near(attn_bwd(qkv, dout, d),
                  fd_grad([&](const Vec& x) { return dot(dout, attn_fwd(x, d)); }, qkv), 1e-7,
                  "dqkv");
}

TEST(Attention, ForwardBackwardEveryDtype) {
  for (const Dims& d : {Dims{2, 5, 8, 2}, Dims{1, 33, 48, 3}}) {
    for (DType dt : kAllDTypes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " T=" + std::to_string(d.T));
      CpuBackend be;
      std::mt19937 rng(13);
      const std::int64_t btc = d.B * d.T * d.C, scores = d.B * d.H * d.T * d.T;
      HT qkv({d.B, d.T, 3 * d.C}, dt), qkvr({3, d.B, d.H, d.T, d.hs()}, dt),
          att({d.B, d.H, d.T, d.T}, dt), scratch({btc}, dt), out({d.B, d.T, d.C}, dt);
      qkv.rand(rng, -1.5f, 1.5f);
      for (HT* h : {&qkvr, &att, &scratch, &out}) h->poison();
      be.attention_forward(s0, qkv, d.H, qkvr, att, scratch, out);
      Vec probs;
      const Vec ref = attn_fwd(qkv.vals(), d, &probs);
      // Scores and y pass through the storage dtype once each: a few roundings' worth.
      expect_close(out, ref, dt, "out", 4, 4);
      expect_close(att, probs, dt, "att", 2, 4);
      for (std::int64_t m = 0; m < d.B * d.H; ++m) {
        for (std::int64_t i = 0; i < d.T; ++i) {
          for (std::int64_t j = i + 1; j < d.T; ++j)
            ASSERT_EQ(att.get((m * d.T + i) * d.T + j), 0.0f);
        }
      }
      HT dout({d.B, d.T, d.C}, dt), datt({scores}, dt), dqkvr({3 * btc}, dt),
          dqkv({d.B, d.T, 3 * d.C}, dt);
      dout.rand(rng);
      for (HT* h : {&datt, &dqkvr, &dqkv}) h->poison();
      be.attention_backward(s0, dout, qkvr, att, d.H, datt, dqkvr, dqkv);
      expect_close(dqkv, attn_bwd(qkv.vals(), dout.vals(), d), dt, "dqkv", 8, 8);
    }
  }
}

// ---- cross-entropy -------------------------------------------------------------------------

TEST(CrossEntropy, ForwardBackwardPaddedVocabEveryDtype) {
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    CpuBackend be;
    std::mt19937 rng(14);
    const std::int64_t B = 2, T = 3, N = B * T, V = 37, Vp = 40;
    HT logits({B, T, Vp}, dt), losses({N}, DType::kF32), lse({N}, DType::kF32);
    logits.rand(rng, -4, 4);
    for (std::int64_t r = 0; r < N; ++r) {
      for (std::int64_t j = V; j < Vp; ++j) logits.set(r * Vp + j, 1e4f);  // padding: ignored
    }
    std::vector<std::int32_t> tg(N);
    for (auto& t : tg) t = static_cast<std::int32_t>(rng() % V);
    Ids targets({B, T}, tg);
    losses.poison();
    lse.poison();
    be.crossentropy_forward(s0, logits, targets.view(), V, losses, lse);
    const Vec x = logits.vals();
    auto loss_of = [&](const Vec& xx, std::int64_t r, double* lse_out) {
      double mx = -1e300, s = 0;
      for (std::int64_t j = 0; j < V; ++j) mx = std::max(mx, xx[r * Vp + j]);
      for (std::int64_t j = 0; j < V; ++j) s += std::exp(xx[r * Vp + j] - mx);
      if (lse_out != nullptr) *lse_out = mx + std::log(s);
      return mx + std::log(s) - xx[r * Vp + tg[r]];
    };
    Vec lref(N), sref(N), gl(N);
    std::uniform_real_distribution<double> u(0.5, 1.5);
    for (std::int64_t r = 0; r < N; ++r) {
      lref[r] = loss_of(x, r, &sref[r]);
      gl[r] = u(rng);
    }
    expect_close(losses, lref, DType::kF32, "losses", 1, 2);
    expect_close(lse, sref, DType::kF32, "lse", 1, 2);

    // Analytic backward vs finite differences of sum_r dloss * gl_r * loss_r.
    const float dloss = 0.25f;
    HT dl({N}, DType::kF32);
    dl.assign(gl);
    const Vec gref = fd_grad(
        [&](const Vec& xx) {
          double s = 0;
          for (std::int64_t r = 0; r < N; ++r) s += dloss * dl.get(r) * loss_of(xx, r, nullptr);
          return s;
        },
        x);
    Vec analytic(x.size(), 0.0);
    for (std::int64_t r = 0; r < N; ++r) {
      for (std::int64_t j = 0; j < V; ++j) {
        analytic[r * Vp + j] =
            dloss * dl.get(r) * (std::exp(x[r * Vp + j] - sref[r]) - (j == tg[r]));
      }
    }
    expect_vec_near(analytic, gref, 1e-6, "analytic dlogits");
    HT dlogits({N, Vp}, dt);
    dlogits.poison();
    const Tensor dlt = dl.t();
    be.crossentropy_backward(s0, logits, lse, targets.view(), V, dloss, &dlt, dlogits);
    expect_close(dlogits, analytic, dt, "dlogits", 1, 2);
    // Uniform dloss, in place over the logits.
    be.crossentropy_backward(s0, logits, lse, targets.view(), V, dloss, nullptr, logits);
    for (std::int64_t r = 0; r < N; ++r) {
      for (std::int64_t j = 0; j < Vp; ++j) {
        const double want = analytic[r * Vp + j] / dl.get(r);
        ASSERT_NEAR(logits.get(r * Vp + j), want, dtype_eps(dt) * (1 + std::fabs(want)))
            << r << "," << j;
      }
    }
  }
}

TEST(CrossEntropy, ExtremeLogitsStayFinite) {
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    CpuBackend be;
    const std::int64_t N = 3, V = 5;
    HT logits({N, V}, dt), losses({N}, DType::kF32), lse({N}, DType::kF32), dlog({N, V}, dt);
    const float vals[N][V] = {{1e4f, -1e4f, 0, 0, 0},
                              {-1e4f, -1e4f, -1e4f, -1e4f, 1e4f},
                              {1e4f, 1e4f, 1e4f, -1e4f, 1e4f}};
    for (std::int64_t r = 0; r < N; ++r)
      for (std::int64_t j = 0; j < V; ++j) logits.set(r * V + j, vals[r][j]);
    Ids targets({N}, {1, 4, 3});
    be.crossentropy_forward(s0, logits, targets.view(), V, losses, lse);
    const double l0 = logits.get(0);  // 1e4 rounded to the dtype
    EXPECT_NEAR(losses.get(0), l0 - logits.get(1), 0.01);
    EXPECT_NEAR(losses.get(1), 0.0, 1e-6);  // the target owns all the mass
    EXPECT_NEAR(losses.get(2), logits.get(2 * V) + std::log(4.0) - logits.get(2 * V + 3), 0.01);
    be.crossentropy_backward(s0, logits, lse, targets.view(), V, 1.0f, nullptr, dlog);
    for (std::int64_t i = 0; i < dlog.n(); ++i) ASSERT_TRUE(std::isfinite(dlog.get(i))) << i;
    EXPECT_NEAR(dlog.get(0), 1.0, 1e-6);   // p = 1 for the max, not the target
    EXPECT_NEAR(dlog.get(1), -1.0, 1e-6);  // target with p = 0
    EXPECT_NEAR(dlog.get(V + 4), 0.0, 1e-6);
  }
}

TEST(CrossEntropy, RejectsOutOfRangeTargetsBeforeWriting) {
  CpuBackend be;
  HT logits({2, 8}, DType::kF32), losses({2}, DType::kF32), lse({2}, DType::kF32);
  logits.fill(0);
  losses.fill(3);
  Ids targets({2}, {1, 6});
  expect_invalid([&] { be.crossentropy_forward(s0, logits, targets.view(), 6, losses, lse); },
                     {"crossentropy_forward", "targets[1] = 6", "[0, 6)"});
  EXPECT_EQ(losses.get(0), 3.0f);
}

}  // namespace
}  // namespace memfit
