// CPU neural-network ops against double-precision references written here: layernorm, GELU,
// residual and bias adds, embeddings, the AdamW op. Each backward is checked twice: the f64
// analytic gradient against central finite differences of the f64 forward, and the backend
// against that analytic gradient, for every storage dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu/adamw.h"
#include "core/cpu/cpu_backend.h"
#include "tests/core/nn_testutil.h"

namespace memfit {
namespace {

using namespace testing;  // NOLINT

constexpr StreamId s0 = kDefaultStream;

// ---- layernorm -----------------------------------------------------------------------------

struct LnRef {
  Vec out, mean, rstd;
};
LnRef ln_fwd(const Vec& x, const Vec& w, const Vec& b, std::int64_t n, std::int64_t c, double eps) {
  LnRef r{Vec(x.size()), Vec(n), Vec(n)};
  for (std::int64_t i = 0; i < n; ++i) {
    double m = 0, v = 0;
    for (std::int64_t j = 0; j < c; ++j) m += x[i * c + j];
    m /= c;
    for (std::int64_t j = 0; j < c; ++j) v += (x[i * c + j] - m) * (x[i * c + j] - m);
    const double rs = 1.0 / std::sqrt(v / c + eps);
    for (std::int64_t j = 0; j < c; ++j) r.out[i * c + j] = (x[i * c + j] - m) * rs * w[j] + b[j];
    r.mean[i] = m;
    r.rstd[i] = rs;
  }
  return r;
}
struct LnGrad {
  Vec dx, dw, db;
};
LnGrad ln_bwd(const Vec& dy, const Vec& x, const Vec& w, std::int64_t n, std::int64_t c,
              double eps) {
  const LnRef f = ln_fwd(x, w, Vec(c, 0.0), n, c, eps);
  LnGrad g{Vec(x.size()), Vec(c), Vec(c)};
  for (std::int64_t i = 0; i < n; ++i) {
    double mg = 0, mgn = 0;
    for (std::int64_t j = 0; j < c; ++j) {
      const double norm = (x[i * c + j] - f.mean[i]) * f.rstd[i];
      mg += w[j] * dy[i * c + j];
      mgn += w[j] * dy[i * c + j] * norm;
      g.dw[j] += norm * dy[i * c + j];
      g.db[j] += dy[i * c + j];
    }
    mg /= c;
    mgn /= c;
    for (std::int64_t j = 0; j < c; ++j) {
      const double norm = (x[i * c + j] - f.mean[i]) * f.rstd[i];
      g.dx[i * c + j] = f.rstd[i] * (w[j] * dy[i * c + j] - mg - norm * mgn);
    }
  }
  return g;
}

TEST(NnOps, LayerNormAnalyticMatchesFiniteDifferences) {
  std::mt19937 rng(1);
  const std::int64_t n = 3, c = 7;
  const double eps = 1e-5;
  Vec x(n * c), w(c), b(c), dy(n * c);
  std::uniform_real_distribution<double> u(-1, 1);
  for (auto* v : {&x, &w, &b, &dy})
    for (double& e : *v) e = u(rng);
  const LnGrad g = ln_bwd(dy, x, w, n, c, eps);
  expect_vec_near(
      g.dx, fd_grad([&](const Vec& xx) { return dot(dy, ln_fwd(xx, w, b, n, c, eps).out); }, x),
      1e-6, "dx");
  expect_vec_near(
      g.dw, fd_grad([&](const Vec& ww) { return dot(dy, ln_fwd(x, ww, b, n, c, eps).out); }, w),
      1e-6, "dw");
  expect_vec_near(
      g.db, fd_grad([&](const Vec& bb) { return dot(dy, ln_fwd(x, w, bb, n, c, eps).out); }, b),
      1e-6, "db");
}

TEST(NnOps, LayerNormForwardBackwardEveryDtype) {
  // C = 300 spans two 256-column blocks; N*C > 64K takes the OpenMP paths.
  for (auto [n, c] : {std::pair<std::int64_t, std::int64_t>{5, 3}, {4 * 60, 300}}) {
    for (DType dt : kAllDTypes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " C=" + std::to_string(c));
      CpuBackend be;
      std::mt19937 rng(2);
      const float eps = 1e-5f;
      HT x(n % 4 == 0 ? Shape{4, n / 4, c} : Shape{n, c}, dt), w({c}, dt), b({c}, dt);
      x.rand(rng, -2, 3);
      w.rand(rng, 0.5, 1.5);
      b.rand(rng);
      HT out({n, c}, dt), mean({n}, DType::kF32), rstd({n}, DType::kF32);
      out.poison();
      mean.poison();
      rstd.poison();
      be.layernorm_forward(s0, x, w, b, eps, out, mean, rstd);
      const LnRef r = ln_fwd(x.vals(), w.vals(), b.vals(), n, c, eps);
      expect_close(out, r.out, dt, "out", 4, 2);
      expect_close(mean, r.mean, DType::kF32, "mean");
      expect_close(rstd, r.rstd, DType::kF32, "rstd");

      // Gradients accumulate onto non-zero initial values.
      HT dy({n, c}, dt), dx({n, c}, dt), dw({c}, DType::kF32), db({c}, DType::kF32);
      dy.rand(rng);
      dx.rand(rng);
      dw.rand(rng);
      db.rand(rng);
      const Vec dx0 = dx.vals(), dw0 = dw.vals(), db0 = db.vals();
      be.layernorm_backward(s0, dy, x, w, mean, rstd, dx, dw, db);
      LnGrad g = ln_bwd(dy.vals(), x.vals(), w.vals(), n, c, eps);
      for (std::size_t i = 0; i < g.dx.size(); ++i) g.dx[i] += dx0[i];
      for (std::size_t i = 0; i < g.dw.size(); ++i) {
        g.dw[i] += dw0[i];
        g.db[i] += db0[i];
      }
      expect_close(dx, g.dx, dt, "dinp", 8, 2);
      // dweight/dbias are f32 sums over N rows of rounded-input terms.
      expect_close(dw, g.dw, DType::kF32, "dweight", 10 * n);
      expect_close(db, g.db, DType::kF32, "dbias", 10 * n);
    }
  }
}

// ---- GELU ----------------------------------------------------------------------------------

double gelu(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x) {
  const double s = std::sqrt(2.0 / M_PI), u = s * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * s * (1 + 3 * 0.044715 * x * x);
}

TEST(NnOps, GeluAnalyticMatchesFiniteDifferences) {
  Vec xs;
  for (double x = -6; x <= 6; x += 0.37) xs.push_back(x);
  for (double x : xs) {
    const double fd = (gelu(x + 1e-6) - gelu(x - 1e-6)) / 2e-6;
    EXPECT_NEAR(gelu_grad(x), fd, 1e-7) << x;
  }
}

TEST(NnOps, GeluForwardBackwardEveryDtypeAndInPlace) {
  for (std::int64_t n : {std::int64_t{37}, std::int64_t{70001}}) {
    for (DType dt : kAllDTypes) {
      SCOPED_TRACE(dtype_name(dt));
      CpuBackend be;
      std::mt19937 rng(3);
      HT x({n}, dt), y({n}, dt), dy({n}, dt), dx({n}, dt);
      x.rand(rng, -8, 8);
      dy.rand(rng);
      y.poison();
      dx.poison();
      be.gelu_forward(s0, x, y);
      Vec ref = x.vals(), gref(ref.size());
      const Vec dyv = dy.vals();
      for (std::size_t i = 0; i < ref.size(); ++i) {
        gref[i] = gelu_grad(ref[i]) * dyv[i];
        ref[i] = gelu(ref[i]);
      }
      expect_close(y, ref, dt, "gelu", 2, 2);
      be.gelu_backward(s0, dy, x, dx);
      expect_close(dx, gref, dt, "dgelu", 2, 2);
      // In place: dinp = dout, out = inp.
      be.gelu_backward(s0, dy, x, dy);
      for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(dy.get(i), dx.get(i)) << i;
      be.gelu_forward(s0, x, x);
      for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(x.get(i), y.get(i)) << i;
    }
  }
}

// ---- add, add_bias, bias_backward ------------------------------------------------------------

TEST(NnOps, AddAndBias) {
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    CpuBackend be;
    std::mt19937 rng(4);
    const std::int64_t n = 300, oc = 257;  // 257: a partial column block
    HT a({n, oc}, dt), b({n, oc}, DType::kF32), out({n, oc}, dt), bias({oc}, dt);
    a.rand(rng);
    b.rand(rng);
    bias.rand(rng);
    out.poison();
    be.add(s0, a, b, out);
    Vec av = a.vals(), bv = b.vals(), ref(av.size());
    for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = av[i] + bv[i];
    expect_close(out, ref, dt, "add");
    be.add(s0, a, b, a);  // in place
    for (std::int64_t i = 0; i < a.n(); ++i) ASSERT_EQ(a.get(i), out.get(i)) << i;

    const Vec before = out.vals(), bi = bias.vals();
    be.add_bias(s0, bias, out);
    for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = before[i] + bi[i % oc];
    expect_close(out, ref, dt, "add_bias", 2);

    HT dbias({oc}, DType::kF32);
    dbias.rand(rng);
    Vec dref = dbias.vals();
    const Vec ov = out.vals();
    for (std::size_t i = 0; i < ov.size(); ++i) dref[i % oc] += ov[i];
    be.bias_backward(s0, out, dbias);
    expect_close(dbias, dref, DType::kF32, "bias_backward");
  }
}

// ---- embeddings ----------------------------------------------------------------------------

TEST(NnOps, EmbeddingForwardBackward) {
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    CpuBackend be;
    std::mt19937 rng(5);
    const std::int64_t B = 3, T = 5, V = 11, C = 300, maxT = 8;
    std::vector<std::int32_t> tok(B * T);
    for (auto& t : tok) t = static_cast<std::int32_t>(rng() % V);
    tok[3] = tok[7] = tok[14] = 4;  // repeats
    Ids ids({B, T}, tok);
    HT wte({V, C}, dt), wpe({maxT, C}, dt), out({B, T, C}, dt);
    wte.rand(rng);
    wpe.rand(rng);
    out.poison();
    be.embedding_forward(s0, ids.view(), wte, wpe, out);
    const Vec te = wte.vals(), pe = wpe.vals();
    Vec ref(B * T * C);
    for (std::int64_t i = 0; i < B * T; ++i) {
      for (std::int64_t c = 0; c < C; ++c)
        ref[i * C + c] = te[tok[i] * C + c] + pe[(i % T) * C + c];
    }
    expect_close(out, ref, dt, "embedding");

    // Backward: exact f32 sums in (b,t) order onto non-zero initial gradients; the gradient
    // is linear, so the analytic scatter is its own finite-difference check.
    HT dout({B, T, C}, dt), dwte({V, C}, DType::kF32), dwpe({maxT, C}, DType::kF32);
    dout.rand(rng);
    dwte.rand(rng);
    dwpe.rand(rng);
    std::vector<float> ete(V * C), epe(maxT * C);
    for (std::int64_t i = 0; i < V * C; ++i) ete[i] = dwte.get(i);
    for (std::int64_t i = 0; i < maxT * C; ++i) epe[i] = dwpe.get(i);
    for (std::int64_t i = 0; i < B * T; ++i) {
      for (std::int64_t c = 0; c < C; ++c) {
        ete[tok[i] * C + c] += dout.get(i * C + c);
        epe[(i % T) * C + c] += dout.get(i * C + c);
      }
    }
    be.embedding_backward(s0, dout, ids.view(), dwte, dwpe);
    for (std::int64_t i = 0; i < V * C; ++i) ASSERT_EQ(dwte.get(i), ete[i]) << "dwte " << i;
    for (std::int64_t i = 0; i < maxT * C; ++i) ASSERT_EQ(dwpe.get(i), epe[i]) << "dwpe " << i;
  }
}

TEST(NnOps, EmbeddingWithoutPositionTable) {
  // The Llama family's embedding: out = wte[tok] exactly (a copy, rounded to out's dtype);
  // the backward adds into dwte alone.
  CpuBackend be;
  std::mt19937 rng(6);
  const std::int64_t B = 2, T = 4, V = 9, C = 40;
  std::vector<std::int32_t> tok(B * T);
  for (auto& t : tok) t = static_cast<std::int32_t>(rng() % V);
  tok[1] = tok[6] = 3;
  Ids ids({B, T}, tok);
  HT wte({V, C}, DType::kBF16), out({B, T, C}, DType::kBF16);
  wte.rand(rng);
  out.poison();
  be.embedding_forward(s0, ids.view(), wte, out);
  for (std::int64_t i = 0; i < B * T; ++i) {
    for (std::int64_t c = 0; c < C; ++c) ASSERT_EQ(out.get(i * C + c), wte.get(tok[i] * C + c));
  }
  HT dout({B, T, C}, DType::kF32), dwte({V, C}, DType::kF32);
  dout.rand(rng);
  dwte.fill(0.5f);
  std::vector<float> want(V * C, 0.5f);
  for (std::int64_t i = 0; i < B * T; ++i) {
    for (std::int64_t c = 0; c < C; ++c) want[tok[i] * C + c] += dout.get(i * C + c);
  }
  be.embedding_backward(s0, dout, ids.view(), dwte);
  for (std::int64_t i = 0; i < V * C; ++i) ASSERT_EQ(dwte.get(i), want[i]) << i;
  HT dwte16({V, C}, DType::kBF16);
  expect_invalid([&] { be.embedding_backward(s0, dout, ids.view(), dwte16); }, {"dwte", "f32"});
}

TEST(NnOps, EmbeddingBackwardDeterministicWithRepeatedTokens) {
  // Large enough for the parallel path; every token the same id, so all B*T rows add into
  // one row of dwte: the result must equal the sequential f32 sum bit for bit, every run.
  CpuBackend be;
  std::mt19937 rng(6);
  const std::int64_t B = 8, T = 64, C = 768, V = 3;
  Ids ids({B, T}, std::vector<std::int32_t>(B * T, 1));
  HT dout({B, T, C}, DType::kBF16);
  dout.rand(rng);
  std::vector<float> seq(C, 0.0f);
  for (std::int64_t i = 0; i < B * T; ++i) {
    for (std::int64_t c = 0; c < C; ++c) seq[c] += dout.get(i * C + c);
  }
  for (int run = 0; run < 3; ++run) {
    HT dwte({V, C}, DType::kF32), dwpe({T, C}, DType::kF32);
    dwte.fill(0);
    dwpe.fill(0);
    be.embedding_backward(s0, dout, ids.view(), dwte, dwpe);
    for (std::int64_t c = 0; c < C; ++c) {
      ASSERT_EQ(dwte.get(C + c), seq[c]) << "run " << run << " c " << c;
      ASSERT_EQ(dwte.get(c), 0.0f);
    }
  }
}

TEST(NnOps, EmbeddingRejectsOutOfRangeTokensBeforeWriting) {
  CpuBackend be;
  Ids ids({1, 3}, {0, 5, 2});
  HT wte({5, 4}, DType::kF32), wpe({3, 4}, DType::kF32), out({1, 3, 4}, DType::kF32);
  wte.fill(1);
  wpe.fill(1);
  out.fill(7);
  expect_invalid([&] { be.embedding_forward(s0, ids.view(), wte, wpe, out); },
                     {"embedding_forward", "tokens[1] = 5", "[0, 5)"});
  for (std::int64_t i = 0; i < out.n(); ++i) ASSERT_EQ(out.get(i), 7.0f);
}

// ---- AdamW ---------------------------------------------------------------------------------

TEST(NnOps, AdamWMatchesTheKernelBitForBit) {
  for (DType gdt : kAllDTypes) {
    SCOPED_TRACE(dtype_name(gdt));
    CpuBackend be;
    std::mt19937 rng(7);
    const std::int64_t n = 1000;
    HT p({n}, DType::kF32), g({n}, gdt), m({n}, DType::kF32), v({n}, DType::kF32),
        out({n}, DType::kBF16);
    p.rand(rng);
    g.rand(rng);
    m.rand(rng, -0.1f, 0.1f);
    v.rand(rng, 0.0f, 0.01f);
    out.poison();
    std::vector<float> ep(n), em(n), ev(n);
    for (std::int64_t i = 0; i < n; ++i) {
      ep[i] = p.get(i);
      em[i] = m.get(i);
      ev[i] = v.get(i);
    }
    AdamWOptions opt;
    opt.lr = 1e-3;
    const AdamWConstants k = adamw_constants(opt, 3, 1.0 / 1024);
    AdamWBuffers bufs;
    bufs.n = n;
    bufs.param = ep.data();
    bufs.exp_avg = em.data();
    bufs.exp_avg_sq = ev.data();
    bufs.grad = g.t().raw();
    bufs.grad_dtype = gdt;
    adamw_step(k, bufs);
    const Tensor out_t = out.t();
    be.adamw(s0, k, p, g, m, v, &out_t);
    for (std::int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(p.get(i), ep[i]) << i;
      ASSERT_EQ(m.get(i), em[i]) << i;
      ASSERT_EQ(v.get(i), ev[i]) << i;
      ASSERT_EQ(out.get(i), bf16_to_f32(f32_to_bf16(ep[i]))) << i;
    }
    be.adamw(s0, k, p, g, m, v);  // no copy-out
    AdamWConstants bad = k;
    bad.beta1 = 1.5f;
    expect_invalid([&] { be.adamw(s0, bad, p, g, m, v); }, {"Backend::adamw (cpu)", "beta1"});
  }
}

}  // namespace
}  // namespace memfit
