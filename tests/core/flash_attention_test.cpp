// The CPU backend's tiled causal attention (Backend::flash_attention_forward/backward,
// core/cpu/flash_attention*.cpp) against a double-precision grouped-query reference written
// here (its analytic backward checked against central finite differences first), against the
// materialized attention, across its vector builds and thread counts, and its argument checks.
#include "core/cpu/flash_attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/meta/meta_backend.h"
#include "tests/core/nn_testutil.h"

namespace memfit {
namespace {

using namespace testing;  // NOLINT
using i64 = std::int64_t;

constexpr StreamId s0 = kDefaultStream;

// B, T, H query heads, G kv heads, hs; qkv is (B,T,(H+2G)*hs).
struct Dims {
  i64 B, T, H, G, hs;
  i64 row() const { return (H + 2 * G) * hs; }
  i64 q(i64 b, i64 t, i64 h, i64 e) const { return (b * T + t) * row() + h * hs + e; }
  i64 k(i64 b, i64 t, i64 g, i64 e) const { return (b * T + t) * row() + (H + g) * hs + e; }
  i64 v(i64 b, i64 t, i64 g, i64 e) const { return (b * T + t) * row() + (H + G + g) * hs + e; }
  i64 o(i64 b, i64 t, i64 h, i64 e) const { return ((b * T + t) * H + h) * hs + e; }
  i64 g_of(i64 h) const { return h / (H / G); }
  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
           " G=" + std::to_string(G) + " hs=" + std::to_string(hs);
  }
};

// Probabilities p[b,h,i,j] (j <= i) of the reference.
Vec ref_probs(const Vec& qkv, const Dims& d, Vec* lse = nullptr) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hs));
  Vec p(d.B * d.H * d.T * d.T, 0.0);
  if (lse != nullptr) lse->assign(d.B * d.H * d.T, 0.0);
  for (i64 b = 0; b < d.B; ++b) {
    for (i64 h = 0; h < d.H; ++h) {
      for (i64 i = 0; i < d.T; ++i) {
        Vec s(i + 1, 0.0);
        double mx = -1e300;
        for (i64 j = 0; j <= i; ++j) {
          for (i64 e = 0; e < d.hs; ++e)
            s[j] += qkv[d.q(b, i, h, e)] * qkv[d.k(b, j, d.g_of(h), e)];
          s[j] *= scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (i64 j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        for (i64 j = 0; j <= i; ++j)
          p[((b * d.H + h) * d.T + i) * d.T + j] = std::exp(s[j] - mx) / sum;
        if (lse != nullptr) (*lse)[(b * d.H + h) * d.T + i] = mx + std::log(sum);
      }
    }
  }
  return p;
}

Vec ref_fwd(const Vec& qkv, const Dims& d, Vec* lse = nullptr) {
  const Vec p = ref_probs(qkv, d, lse);
  Vec out(d.B * d.T * d.H * d.hs, 0.0);
  for (i64 b = 0; b < d.B; ++b) {
    for (i64 h = 0; h < d.H; ++h) {
      for (i64 i = 0; i < d.T; ++i) {
        for (i64 j = 0; j <= i; ++j) {
          const double pij = p[((b * d.H + h) * d.T + i) * d.T + j];
          for (i64 e = 0; e < d.hs; ++e) out[d.o(b, i, h, e)] += pij * qkv[d.v(b, j, d.g_of(h), e)];
        }
      }
    }
  }
  return out;
}

// dqkv from dout: the analytic backward (dk, dv summed over each group's query heads).
Vec ref_bwd(const Vec& qkv, const Vec& dout, const Dims& d) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hs));
  const Vec p = ref_probs(qkv, d);
  Vec g(qkv.size(), 0.0);
  for (i64 b = 0; b < d.B; ++b) {
    for (i64 h = 0; h < d.H; ++h) {
      const i64 kv = d.g_of(h);
      for (i64 i = 0; i < d.T; ++i) {
        const double* pi = &p[((b * d.H + h) * d.T + i) * d.T];
        Vec dp(i + 1, 0.0);
        double dot_pdp = 0;
        for (i64 j = 0; j <= i; ++j) {
          for (i64 e = 0; e < d.hs; ++e) {
            const double dy = dout[d.o(b, i, h, e)];
            dp[j] += dy * qkv[d.v(b, j, kv, e)];
            g[d.v(b, j, kv, e)] += pi[j] * dy;
          }
          dot_pdp += pi[j] * dp[j];
        }
        for (i64 j = 0; j <= i; ++j) {
          const double ds = scale * pi[j] * (dp[j] - dot_pdp);
          for (i64 e = 0; e < d.hs; ++e) {
            g[d.q(b, i, h, e)] += ds * qkv[d.k(b, j, kv, e)];
            g[d.k(b, j, kv, e)] += ds * qkv[d.q(b, i, h, e)];
          }
        }
      }
    }
  }
  return g;
}

TEST(FlashAttention, ReferenceAnalyticMatchesFiniteDifferences) {
  const Dims d{2, 4, 4, 2, 3};  // two query heads per kv head
  std::mt19937 rng(21);
  std::uniform_real_distribution<double> u(-1, 1);
  Vec qkv(d.B * d.T * d.row()), dout(d.B * d.T * d.H * d.hs);
  for (double& v : qkv) v = u(rng);
  for (double& v : dout) v = u(rng);
  expect_vec_near(ref_bwd(qkv, dout, d),
                  fd_grad([&](const Vec& x) { return dot(dout, ref_fwd(x, d)); }, qkv), 1e-7,
                  "dqkv");
}

struct Outs {
  HT out, lse, delta, dqkv;
  explicit Outs(const Dims& d, DType dt)
      : out({d.B, d.T, d.H * d.hs}, dt),
        lse({d.B, d.H, d.T}, DType::kF32),
        delta({d.B, d.H, d.T}, DType::kF32),
        dqkv({d.B, d.T, d.row()}, dt) {
    for (HT* h : {&out, &lse, &delta, &dqkv}) h->poison();
  }
};

void run_flash(Backend& be, const HT& qkv, const HT& dout, const Dims& d, Outs& r) {
  be.flash_attention_forward(s0, qkv, d.H, d.G, r.out, r.lse);
  be.flash_attention_backward(s0, dout, qkv, r.out, r.lse, d.H, d.G, r.delta, r.dqkv);
  be.synchronize(s0);
}

TEST(FlashAttention, MatchesTheReferenceOnEveryShapeAndDtype) {
  // T = 1, below, at and past one 64-row tile (65, 130: partial tiles, several diagonals);
  // head sizes not a multiple of the 16-float vector (3, 24, 80) up to the limit (256);
  // multi-head (G = H), grouped (H/G = 2, 4) and multi-query (G = 1).
  const Dims shapes[] = {{1, 1, 2, 2, 16},   {2, 5, 4, 2, 3},    {1, 64, 2, 1, 24},
                         {2, 65, 4, 4, 16},  {1, 130, 8, 2, 64}, {1, 70, 2, 2, 80},
                         {1, 33, 4, 1, 128}, {1, 20, 2, 2, 256}, {2, 130, 4, 4, 64},
                         {2, 70, 4, 1, 32}};  // last: several batches sharing one kv head
  for (const Dims& d : shapes) {
    for (DType dt : kAllDTypes) {
      SCOPED_TRACE(d.str() + " " + dtype_name(dt));
      CpuBackend be;
      std::mt19937 rng(22);
      HT qkv({d.B, d.T, d.row()}, dt), dout({d.B, d.T, d.H * d.hs}, dt);
      qkv.rand(rng, -1.5f, 1.5f);
      dout.rand(rng);
      Outs r(d, dt);
      run_flash(be, qkv, dout, d, r);
      Vec lse;
      const Vec ref = ref_fwd(qkv.vals(), d, &lse);
      // FP32 arithmetic on the stored inputs, one rounding into the output's dtype: within a
      // couple of its units (f32: reassociation over up to T terms, ~1e-6 relative).
      expect_close(r.out, ref, dt, "out", 2, 2);
      expect_close(r.lse, lse, DType::kF32, "lse", 2, 2);
      // The backward reads the rounded out for delta = dout . out (as FlashAttention-2), so in
      // 16-bit storage ds carries that rounding too: a few units more.
      expect_close(r.dqkv, ref_bwd(qkv.vals(), dout.vals(), d), dt, "dqkv", 8, 8);
      // delta = dout . out per row, from the stored (rounded) out, in FP32.
      const Vec o = r.out.vals(), dy = dout.vals();
      Vec delta(d.B * d.H * d.T, 0.0);
      for (i64 b = 0; b < d.B; ++b) {
        for (i64 h = 0; h < d.H; ++h) {
          for (i64 t = 0; t < d.T; ++t) {
            for (i64 e = 0; e < d.hs; ++e) {
              delta[(b * d.H + h) * d.T + t] += dy[d.o(b, t, h, e)] * o[d.o(b, t, h, e)];
            }
          }
        }
      }
      expect_close(r.delta, delta, DType::kF32, "delta", 4, 4);
    }
  }
}

TEST(FlashAttention, AgreesWithTheMaterializedAttention) {
  // Same function, two algorithms, f32 storage: the materialized path rounds nothing either,
  // so they differ by FP32 reassociation only. Measured max |diff|: ~3e-7 (out), ~1e-6 (dqkv)
  // on values of order 1; the bound is 1e-5 relative to max(1, |value|).
  const i64 B = 2, T = 150, C = 128, H = 4;
  const Dims d{B, T, H, H, C / H};
  CpuBackend be;
  std::mt19937 rng(23);
  HT qkv({B, T, 3 * C}, DType::kF32), dout({B, T, C}, DType::kF32);
  qkv.rand(rng, -2.0f, 2.0f);
  dout.rand(rng);
  Outs r(d, DType::kF32);
  run_flash(be, qkv, dout, d, r);
  HT qkvr({3, B, H, T, C / H}, DType::kF32), att({B, H, T, T}, DType::kF32),
      scratch({B * T * C}, DType::kF32), out({B, T, C}, DType::kF32),
      datt({B, H, T, T}, DType::kF32), dqkvr({3 * B * T * C}, DType::kF32),
      dqkv({B, T, 3 * C}, DType::kF32);
  be.attention_forward(s0, qkv, H, qkvr, att, scratch, out);
  be.attention_backward(s0, dout, qkvr, att, H, datt, dqkvr, dqkv);
  double max_out = 0, max_dqkv = 0;
  for (i64 i = 0; i < out.n(); ++i) {
    const double diff = std::fabs(r.out.get(i) - out.get(i));
    max_out = std::max(max_out, diff);
    ASSERT_LE(diff, 1e-5 * std::max(1.0, std::fabs(double{out.get(i)}))) << "out[" << i << "]";
  }
  for (i64 i = 0; i < dqkv.n(); ++i) {
    const double diff = std::fabs(r.dqkv.get(i) - dqkv.get(i));
    max_dqkv = std::max(max_dqkv, diff);
    ASSERT_LE(diff, 1e-5 * std::max(1.0, std::fabs(double{dqkv.get(i)}))) << "dqkv[" << i << "]";
  }
  std::printf("flash vs materialized (f32, %s): max |diff| out %.2e, dqkv %.2e\n", d.str().c_str(),
              max_out, max_dqkv);
}

bool same_bits(const HT& a, const HT& b) {
  for (i64 i = 0; i < a.n(); ++i) {
    const float x = a.get(i), y = b.get(i);
    if (std::memcmp(&x, &y, sizeof x) != 0) return false;
  }
  return true;
}

TEST(FlashAttention, SameBitsWhateverTheThreadCountAndRun) {
  const Dims d{2, 200, 4, 2, 64};  // big enough for the OpenMP team (see team_for)
  std::mt19937 rng(24);
  HT qkv({d.B, d.T, d.row()}, DType::kBF16), dout({d.B, d.T, d.H * d.hs}, DType::kBF16);
  qkv.rand(rng, -2.0f, 2.0f);
  dout.rand(rng);
  CpuBackend be;
  const int threads = omp_get_max_threads();
  Outs a(d, DType::kBF16), b(d, DType::kBF16), c(d, DType::kBF16);
  run_flash(be, qkv, dout, d, a);
  run_flash(be, qkv, dout, d, b);
  omp_set_num_threads(1);
  run_flash(be, qkv, dout, d, c);
  omp_set_num_threads(threads);
  for (Outs* r : {&b, &c}) {
    EXPECT_TRUE(same_bits(a.out, r->out));
    EXPECT_TRUE(same_bits(a.lse, r->lse));
    EXPECT_TRUE(same_bits(a.dqkv, r->dqkv));
  }
}

TEST(FlashAttention, EveryVectorBuildThisCpuRunsAgrees) {
  const Dims d{1, 100, 4, 2, 40};
  std::mt19937 rng(25);
  HT qkv({d.B, d.T, d.row()}, DType::kF32), dout({d.B, d.T, d.H * d.hs}, DType::kF32);
  qkv.rand(rng, -2.0f, 2.0f);
  dout.rand(rng);
  const AttentionDims ad{d.B, d.T, d.H, d.G, d.hs};
  Outs best(d, DType::kF32);
  cpu::flash_forward(cpu::vec_isa_best(), qkv, ad, best.out, best.lse);
  cpu::flash_backward(cpu::vec_isa_best(), dout, qkv, best.out, best.lse, ad, best.delta,
                      best.dqkv);
  int ran = 0;
  for (cpu::VecIsa isa :
       {cpu::VecIsa::kGeneric, cpu::VecIsa::kAvx2, cpu::VecIsa::kAvx512}) {
    if (!cpu::vec_isa_available(isa)) {
      std::printf("flash attention: the %s build cannot run on this CPU; not compared\n",
                  cpu::vec_isa_name(isa));
      EXPECT_THROW(cpu::flash_forward(isa, qkv, ad, best.out, best.lse), InvalidArgument);
      continue;
    }
    SCOPED_TRACE(cpu::vec_isa_name(isa));
    Outs r(d, DType::kF32);
    cpu::flash_forward(isa, qkv, ad, r.out, r.lse);
    cpu::flash_backward(isa, dout, qkv, r.out, r.lse, ad, r.delta, r.dqkv);
    expect_close(r.out, best.out.vals(), DType::kF32, "out", 1, 1);
    expect_close(r.dqkv, best.dqkv.vals(), DType::kF32, "dqkv", 2, 2);
    ++ran;
  }
  EXPECT_GE(ran, 1);  // generic always runs
}

TEST(FlashAttention, RejectsBadArgumentsBeforeWriting) {
  CpuBackend be;
  const Dims d{1, 4, 2, 1, 8};
  HT qkv({1, 4, d.row()}, DType::kF32), out({1, 4, 16}, DType::kF32), lse({1, 2, 4}, DType::kF32);
  qkv.fill(0.5f);
  out.poison();
  expect_invalid([&] { be.flash_attention_forward(s0, qkv, 3, 1, out, lse); }, {"heads = 3"});
  expect_invalid([&] { be.flash_attention_forward(s0, qkv, 2, 0, out, lse); }, {"kv_heads"});
  HT lse16({1, 2, 4}, DType::kBF16);
  expect_invalid([&] { be.flash_attention_forward(s0, qkv, 2, 1, out, lse16); }, {"lse", "f32"});
  HT flat({4, d.row()}, DType::kF32);
  expect_invalid([&] { be.flash_attention_forward(s0, flat, 2, 1, out, lse); }, {"qkv"});
  HT wide({1, 4, 3 * 257}, DType::kF32), wide_out({1, 4, 257}, DType::kF32),
      wide_lse({1, 1, 4}, DType::kF32);
  expect_invalid([&] { be.flash_attention_forward(s0, wide, 1, 1, wide_out, wide_lse); },
                 {"hs from 1 to 256"});
  HT small_out({1, 4, 8}, DType::kF32);
  expect_invalid([&] { be.flash_attention_forward(s0, qkv, 2, 1, small_out, lse); }, {"out"});
  for (i64 i = 0; i < out.n(); ++i) ASSERT_TRUE(std::isnan(out.get(i)));  // nothing written
  HT dqkv({1, 4, d.row() - 1}, DType::kF32), delta({1, 2, 4}, DType::kF32);
  be.flash_attention_forward(s0, qkv, 2, 1, out, lse);
  expect_invalid([&] { be.flash_attention_backward(s0, out, qkv, out, lse, 2, 1, delta, dqkv); },
                 {"dqkv"});
  // An output overlapping an input.
  expect_invalid([&] { be.flash_attention_backward(s0, out, qkv, out, lse, 2, 1, lse, qkv); },
                 {"overlap"});
}

TEST(FlashAttention, MetaCountsLivePairsAtMatrixRates) {
  MetaBackend meta;
  const Dims d{2, 10, 4, 2, 8};
  // Meta tensors need addresses only; these never get dereferenced.
  HT qkv({d.B, d.T, d.row()}, DType::kBF16), out({d.B, d.T, d.H * d.hs}, DType::kBF16),
      lse({d.B, d.H, d.T}, DType::kF32), delta({d.B, d.H, d.T}, DType::kF32),
      dqkv({d.B, d.T, d.row()}, DType::kBF16);
  auto on_meta = [](const HT& h) {
    const Tensor t = h.t();
    return Tensor(t.raw(), t.shape(), t.dtype(), Device::kMeta);
  };
  meta.flash_attention_forward(s0, on_meta(qkv), d.H, d.G, on_meta(out), on_meta(lse));
  const i64 pairs = d.B * d.H * d.T * (d.T + 1) / 2;
  MetaStats s = meta.stats();
  EXPECT_EQ(s.calls(MetaOp::kFlashAttentionForward), 1);
  EXPECT_EQ(s.gemm_flops, pairs * 4 * d.hs);
  EXPECT_EQ(s.other_flops, pairs * MetaFlops::kSoftmaxForward);
  EXPECT_EQ(s.bytes_read, qkv.n() * 2);
  EXPECT_EQ(s.bytes_written, out.n() * 2 + lse.n() * 4);
  meta.reset_stats();
  meta.flash_attention_backward(s0, on_meta(out), on_meta(qkv), on_meta(out), on_meta(lse), d.H,
                                d.G, on_meta(delta), on_meta(dqkv));
  s = meta.stats();
  EXPECT_EQ(s.calls(MetaOp::kFlashAttentionBackward), 1);
  EXPECT_EQ(s.gemm_flops, pairs * 10 * d.hs);
  EXPECT_EQ(s.bytes_written, delta.n() * 4 + dqkv.n() * 2);
}

}  // namespace
}  // namespace memfit
