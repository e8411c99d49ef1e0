// The Llama family's layers: RMSNorm, GatedMLP (SwiGLU) and CausalSelfAttention with
// grouped-query heads, a rotary embedding, optional biases, an explicit head size and Qwen3's
// per-head q/k RMSNorm, each
// against a double-precision reference written here (through finite differences), in low
// precision, recomputed, and their memory on the meta backend. Also the rotary frequencies
// against HuggingFace's formulas and the Backend ops on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/layers/attention.h"
#include "core/layers/gated_mlp.h"
#include "core/layers/rmsnorm.h"
#include "core/layers/transformer_block.h"
#include "core/meta/meta_backend.h"
#include "core/rope.h"
#include "memory/error.h"
#include "tests/core/layer_testutil.h"
#include "tests/core/nn_testutil.h"

namespace memfit {
namespace {

using testing::Params;
using testing::Vec;
using i64 = std::int64_t;

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

Vec ref_rmsnorm(const Vec& x, i64 c, const Vec& w, double eps) {
  Vec y(x.size());
  for (std::size_t r = 0; r < x.size() / c; ++r) {
    double ss = 0;
    for (i64 j = 0; j < c; ++j) ss += x[r * c + j] * x[r * c + j];
    const double rs = 1.0 / std::sqrt(ss / c + eps);
    for (i64 j = 0; j < c; ++j) y[r * c + j] = x[r * c + j] * rs * w[j];
  }
  return y;
}

Vec ref_gated_mlp(const Vec& x, i64 c, i64 f, const Params& p, bool bias) {
  const Vec gu = testing::ref_linear(x, c, 2 * f, p[0], bias ? &p[1] : nullptr);
  Vec h(gu.size() / 2);
  for (std::size_t r = 0; r < h.size() / f; ++r) {
    for (i64 j = 0; j < f; ++j) {
      const double g = gu[r * 2 * f + j], u = gu[r * 2 * f + f + j];
      h[r * f + j] = g / (1.0 + std::exp(-g)) * u;
    }
  }
  return testing::ref_linear(h, f, c, p[bias ? 2 : 1], bias ? &p[3] : nullptr);
}

// Qwen3's q/k norm on qkv (rows of (H+2G)*hs) in place: each of the first H + G heads of a row
// RMS-normed over hs, q heads with wq, k heads with wk.
void ref_qk_norm(Vec& qkv, i64 h, i64 g, i64 hs, const Vec& wq, const Vec& wk, double eps) {
  const i64 row = (h + 2 * g) * hs;
  for (std::size_t r = 0; r < qkv.size() / static_cast<std::size_t>(row); ++r) {
    for (i64 e = 0; e < h + g; ++e) {
      double* v = &qkv[r * row + e * hs];
      double ss = 0;
      for (i64 j = 0; j < hs; ++j) ss += v[j] * v[j];
      const double rs = 1.0 / std::sqrt(ss / hs + eps);
      for (i64 j = 0; j < hs; ++j) v[j] *= rs * (e < h ? wq : wk)[j];
    }
  }
}

// proj(attention(rope(qk_norm(qkv(x))))) with H heads of hs, G kv heads, in double; parameters
// in CausalSelfAttention::parameters()'s order.
Vec ref_llama_attention(const Vec& x, i64 b, i64 t, i64 c, const AttentionShape& s,
                        const Params& p) {
  const i64 h = s.heads, g = s.kv_heads, hs = s.head_dim, row = (h + 2 * g) * hs;
  std::size_t k = 0;
  const Vec* qkv_b = s.qkv_bias ? &p[1] : nullptr;
  Vec qkv = testing::ref_linear(x, c, row, p[k], qkv_b);
  k += s.qkv_bias ? 2 : 1;
  if (s.qk_norm) {
    ref_qk_norm(qkv, h, g, hs, p[k], p[k + 1], s.qk_norm_eps);
    k += 2;
  }
  if (s.rope) {
    for (i64 r = 0; r < b * t; ++r) {
      for (i64 e = 0; e < h + g; ++e) {
        double* v = &qkv[static_cast<std::size_t>(r * row + e * hs)];
        for (i64 i = 0; i < hs / 2; ++i) {
          const double a = static_cast<double>(static_cast<float>(r % t) * s.freqs.inv_freq[i]);
          const double x0 = v[i], y0 = v[i + hs / 2];
          v[i] = x0 * std::cos(a) - y0 * std::sin(a);
          v[i + hs / 2] = y0 * std::cos(a) + x0 * std::sin(a);
        }
      }
    }
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Vec merged(static_cast<std::size_t>(b * t * h * hs));
  for (i64 bb = 0; bb < b; ++bb) {
    for (i64 hh = 0; hh < h; ++hh) {
      const i64 kv = hh / (h / g);
      for (i64 i = 0; i < t; ++i) {
        Vec sc(static_cast<std::size_t>(i + 1));
        double mx = -1e300;
        for (i64 j = 0; j <= i; ++j) {
          double dot = 0;
          for (i64 d = 0; d < hs; ++d) {
            dot +=
                qkv[(bb * t + i) * row + hh * hs + d] * qkv[(bb * t + j) * row + (h + kv) * hs + d];
          }
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        double z = 0;
        for (double& v : sc) z += (v = std::exp(v - mx));
        for (i64 d = 0; d < hs; ++d) {
          double o = 0;
          for (i64 j = 0; j <= i; ++j)
            o += sc[j] / z * qkv[(bb * t + j) * row + (h + g + kv) * hs + d];
          merged[(bb * t + i) * h * hs + hh * hs + d] = o;
        }
      }
    }
  }
  return testing::ref_linear(merged, h * hs, c, p[k], s.proj_bias ? &p[k + 1] : nullptr);
}

AttentionShape llama_shape(i64 heads, i64 kv, i64 hs, bool qkv_bias) {
  AttentionShape s;
  s.heads = heads;
  s.kv_heads = kv;
  s.head_dim = hs;
  s.qkv_bias = qkv_bias;
  s.proj_bias = false;
  s.rope = true;
  s.freqs = rope_frequencies(hs, 10000.0f);
  return s;
}

TEST(RopeFrequencies, FollowHuggingFacesFormulas) {
  // Default: 1 / theta^(2i/hs).
  const RopeFreqs f = rope_frequencies(128, 500000.0f);
  ASSERT_EQ(f.half, 64);
  for (i64 i = 0; i < 64; ++i) {
    EXPECT_NEAR(f.inv_freq[i], 1.0 / std::pow(500000.0, 2.0 * i / 128), 1e-6 * f.inv_freq[i]);
  }
  // Llama 3.1's rope_scaling (factor 8, low 1, high 4, original 8192): high frequencies
  // (wavelength below 8192/4) unchanged, low ones (above 8192) divided by 8, between smooth.
  RopeScaling s;
  s.kind = RopeScaling::Kind::kLlama3;
  const RopeFreqs l = rope_frequencies(128, 500000.0f, s);
  int high = 0, low = 0, mid = 0;
  for (i64 i = 0; i < 64; ++i) {
    const double wavelen = 2 * M_PI / f.inv_freq[i];
    if (wavelen < 2048) {
      EXPECT_FLOAT_EQ(l.inv_freq[i], f.inv_freq[i]);
      ++high;
    } else if (wavelen > 8192) {
      EXPECT_FLOAT_EQ(l.inv_freq[i], f.inv_freq[i] / 8);
      ++low;
    } else {
      const double smooth = (8192 / wavelen - 1) / (4 - 1);
      EXPECT_NEAR(l.inv_freq[i], (1 - smooth) * f.inv_freq[i] / 8 + smooth * f.inv_freq[i],
                  1e-6 * f.inv_freq[i]);
      ++mid;
    }
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
  testing::expect_invalid([] { rope_frequencies(63, 1e4f); }, {"head size 63", "even"});
  testing::expect_invalid([] { rope_frequencies(64, 0.5f); }, {"rope_theta"});
  RopeScaling bad = s;
  bad.high_freq_factor = 0.5f;
  testing::expect_invalid([&] { rope_frequencies(64, 1e4f, bad); }, {"high_freq_factor"});
}

TEST(LlamaOps, RopeInverseUndoesTheRotationAndLeavesV) {
  CpuBackend be;
  const i64 b = 2, t = 9, h = 4, g = 2, hs = 16, row = (h + 2 * g) * hs;
  testing::HT qkv({b, t, row}, DType::kF32);
  std::mt19937 rng(3);
  qkv.rand(rng);
  const Vec before = qkv.vals();
  const RopeFreqs f = rope_frequencies(hs, 10000.0f);
  be.rope(kDefaultStream, qkv, h, g, f, false);
  const Vec rotated = qkv.vals();
  be.rope(kDefaultStream, qkv, h, g, f, true);
  const Vec back = qkv.vals();
  int moved = 0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    const bool is_v = static_cast<i64>(i) % row >= (h + g) * hs;
    if (is_v) EXPECT_EQ(rotated[i], before[i]);
    if (std::fabs(rotated[i] - before[i]) > 1e-3) ++moved;
    EXPECT_NEAR(back[i], before[i], 1e-6);
  }
  EXPECT_GT(moved, 0);
  // Position 0 is the identity.
  for (i64 e = 0; e < row; ++e) EXPECT_EQ(rotated[e], before[e]);
  testing::expect_invalid(
      [&] { be.rope(kDefaultStream, qkv, h, g, rope_frequencies(8, 1e4f), false); },
      {"frequencies"});
}

TEST(LlamaOps, QkNormMatchesTheReferenceInEveryDtypeAndLeavesV) {
  const i64 b = 2, t = 5, h = 4, g = 2, hs = 24, row = (h + 2 * g) * hs, qk = h + g;
  for (DType dt : kDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    CpuBackend be;
    std::mt19937 rng(17);
    testing::HT qkv({b, t, row}, dt), wq({hs}, dt), wk({hs}, dt), in({b, t, qk * hs}, dt),
        rstd({b, t, qk}, DType::kF32), dy({b, t, row}, dt), dwq({hs}, DType::kF32),
        dwk({hs}, DType::kF32);
    qkv.rand(rng, -2, 2);
    wq.rand(rng, 0.5f, 1.5f);
    wk.rand(rng, -1.5f, -0.5f);  // a swapped q / k weight shows
    dy.rand(rng);
    dwq.fill(0.25f);  // the weight gradients accumulate
    dwk.fill(-0.5f);
    const Vec x = qkv.vals(), d = dy.vals(), vq = wq.vals(), vk = wk.vals();
    Vec want = x;
    ref_qk_norm(want, h, g, hs, vq, vk, 1e-6);
    be.qk_norm_forward(kDefaultStream, qkv, h, g, wq, wk, 1e-6f, in, rstd);
    testing::expect_close(qkv, want, dt, "qk_norm", 2, 2);
    const Vec got = qkv.vals(), kept = in.vals();
    for (i64 r = 0; r < b * t; ++r) {
      for (i64 e = 0; e < row; ++e) {
        const std::size_t i = static_cast<std::size_t>(r * row + e);
        if (e >= qk * hs) ASSERT_EQ(got[i], x[i]) << "v moved at " << i;
        if (e < qk * hs) ASSERT_EQ(kept[static_cast<std::size_t>(r * qk * hs + e)], x[i]) << i;
      }
    }
    // The backward against rmsnorm's gradient per head, in double.
    Vec dx = d, gq(hs, 0.25), gk(hs, -0.5);
    for (i64 r = 0; r < b * t; ++r) {
      for (i64 e = 0; e < qk; ++e) {
        const std::size_t o = static_cast<std::size_t>(r * row + e * hs);
        const Vec& w = e < h ? vq : vk;
        double ss = 0, sgn = 0;
        for (i64 j = 0; j < hs; ++j) ss += x[o + j] * x[o + j];
        const double rs = 1.0 / std::sqrt(ss / hs + 1e-6);
        for (i64 j = 0; j < hs; ++j) sgn += w[j] * d[o + j] * x[o + j] * rs;
        for (i64 j = 0; j < hs; ++j) {
          dx[o + j] = rs * (w[j] * d[o + j] - x[o + j] * rs * sgn / hs);
          (e < h ? gq : gk)[j] += x[o + j] * rs * d[o + j];
        }
      }
    }
    be.qk_norm_backward(kDefaultStream, dy, in, rstd, h, g, wq, wk, dwq, dwk);
    testing::expect_close(dy, dx, dt, "dqk_norm", 4, 4);
    testing::expect_close(dwq, gq, DType::kF32, "dq_weight", 2, 2);
    testing::expect_close(dwk, gk, DType::kF32, "dk_weight", 2, 2);
    const Vec dyv = dy.vals();
    for (i64 r = 0; r < b * t; ++r) {  // dv untouched
      for (i64 e = qk * hs; e < row; ++e) {
        ASSERT_EQ(dyv[static_cast<std::size_t>(r * row + e)],
                  d[static_cast<std::size_t>(r * row + e)]);
      }
    }
  }
}

TEST(LlamaOps, QkNormChecksNameWhatIsWrong) {
  CpuBackend be;
  const StreamId s0 = kDefaultStream;
  const i64 b = 1, t = 3, h = 2, g = 1, hs = 8, row = (h + 2 * g) * hs;
  testing::HT qkv({b, t, row}, DType::kF32), w({hs}, DType::kF32), w16({hs}, DType::kBF16),
      in({b, t, (h + g) * hs}, DType::kF32), rstd({b, t, h + g}, DType::kF32),
      rstd16({b, t, h + g}, DType::kBF16), short_in({b, t, h * hs}, DType::kF32),
      dw({hs}, DType::kF32), dw7({7}, DType::kF32);
  qkv.fill(1.0f);
  w.fill(1.0f);
  w16.fill(1.0f);
  testing::expect_invalid([&] { be.qk_norm_forward(s0, qkv, h, g, w, w16, 1e-6f, in, rstd); },
                          {"k_weight", "one dtype"});
  testing::expect_invalid([&] { be.qk_norm_forward(s0, qkv, h, g, w, w, 1e-6f, short_in, rstd); },
                          {"qk_in", "(B, T, (H + G) * hs)"});
  testing::expect_invalid([&] { be.qk_norm_forward(s0, qkv, h, g, w, w, 1e-6f, in, rstd16); },
                          {"rstd", "f32"});
  testing::expect_invalid([&] { be.qk_norm_forward(s0, qkv, h, g, w, w, 0.0f, in, rstd); },
                          {"eps"});
  testing::expect_invalid([&] { be.qk_norm_forward(s0, qkv, 3, g, w, w, 1e-6f, in, rstd); },
                          {"heads = 3"});
  testing::expect_invalid([&] { be.qk_norm_backward(s0, qkv, in, rstd, h, g, w, w, dw, dw7); },
                          {"dk_weight"});
  testing::expect_invalid([&] { be.qk_norm_backward(s0, qkv, in, rstd, h, g, w, w, dw, dw); },
                          {"overlap"});
}

TEST(LlamaOps, RmsNormAndSwiGluMatchTheReferenceInEveryDtype) {
  for (DType dt : kDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    CpuBackend be;
    std::mt19937 rng(5);
    const i64 n = 7, c = 40;
    testing::HT x({n, c}, dt), w({c}, dt), y({n, c}, dt), rstd({n}, DType::kF32);
    x.rand(rng, -2, 2);
    w.rand(rng);
    be.rmsnorm_forward(kDefaultStream, x, w, 1e-5f, y, rstd);
    testing::expect_close(y, ref_rmsnorm(x.vals(), c, w.vals(), 1e-5), dt, "rmsnorm", 2, 2);
    testing::HT gu({n, 2 * c}, dt), h({n, c}, dt), dh({n, c}, dt), dgu({n, 2 * c}, dt);
    gu.rand(rng, -3, 3);
    dh.rand(rng);
    be.swiglu_forward(kDefaultStream, gu, h);
    be.swiglu_backward(kDefaultStream, dh, gu, dgu);
    const Vec g = gu.vals(), d = dh.vals();
    Vec hr(n * c), dr(2 * n * c);
    for (i64 r = 0; r < n; ++r) {
      for (i64 j = 0; j < c; ++j) {
        const double a = g[r * 2 * c + j], u = g[r * 2 * c + c + j], s = 1 / (1 + std::exp(-a));
        hr[r * c + j] = a * s * u;
        dr[r * 2 * c + j] = d[r * c + j] * u * s * (1 + a * (1 - s));
        dr[r * 2 * c + c + j] = d[r * c + j] * a * s;
      }
    }
    testing::expect_close(h, hr, dt, "swiglu", 2, 2);
    testing::expect_close(dgu, dr, dt, "dswiglu", 2, 2);
  }
}

TEST(LlamaOps, ChecksNameWhatIsWrongAndSwiGluRunsInPlace) {
  CpuBackend be;
  const StreamId s0 = kDefaultStream;
  testing::HT x({4, 8}, DType::kF32), w({8}, DType::kF32), y({4, 8}, DType::kF32),
      rstd({4}, DType::kF32), rstd16({4}, DType::kBF16), dw({8}, DType::kF32);
  x.fill(1.0f);
  w.fill(1.0f);
  testing::expect_invalid([&] { be.rmsnorm_forward(s0, x, w, 1e-5f, y, rstd16); }, {"rstd", "f32"});
  testing::expect_invalid([&] { be.rmsnorm_forward(s0, x, w, 0.0f, y, rstd); }, {"eps"});
  testing::HT empty({4, 0}, DType::kF32);
  testing::expect_invalid([&] { be.rmsnorm_forward(s0, empty, w, 1e-5f, empty, rstd); }, {"C"});
  testing::expect_invalid([&] { be.rmsnorm_backward(s0, x, x, w, rstd, x, dw); }, {"overlap"});
  testing::HT odd({4, 7}, DType::kF32), h({4, 3}, DType::kF32);
  testing::expect_invalid([&] { be.swiglu_forward(s0, odd, h); }, {"gate_up", "even"});
  testing::HT gu({4, 8}, DType::kBF16), dh({4, 4}, DType::kBF16), dgu({4, 8}, DType::kBF16),
      small({4, 6}, DType::kBF16);
  std::mt19937 rng(9);
  gu.rand(rng, -2, 2);
  dh.rand(rng);
  testing::expect_invalid([&] { be.swiglu_backward(s0, dh, gu, small); }, {"dgate_up"});
  be.swiglu_backward(s0, dh, gu, dgu);
  be.swiglu_backward(s0, dh, gu, gu);  // in place: the same bits as out of place
  for (std::int64_t i = 0; i < gu.n(); ++i) ASSERT_EQ(gu.get(i), dgu.get(i)) << i;
}

TEST(LlamaOps, MetaCountsBytesAndFlops) {
  MetaBackend meta;
  auto on_meta = [](const testing::HT& t) {
    const Tensor v = t.t();
    return Tensor(v.raw(), v.shape(), v.dtype(), Device::kMeta);
  };
  const i64 n = 6, c = 16, b = 2, t = 3, h = 4, g = 2, hs = 8;
  testing::HT x({n, c}, DType::kBF16), y({n, c}, DType::kBF16), w({c}, DType::kF32),
      rstd({n}, DType::kF32);
  meta.rmsnorm_forward(kDefaultStream, on_meta(x), on_meta(w), 1e-5f, on_meta(y), on_meta(rstd));
  MetaStats st = meta.stats();
  EXPECT_EQ(st.calls(MetaOp::kRmsNormForward), 1);
  EXPECT_EQ(st.bytes_read, n * c * 2 + c * 4);
  EXPECT_EQ(st.bytes_written, n * c * 2 + n * 4);
  EXPECT_EQ(st.other_flops, MetaFlops::kRmsNormForward * n * c);
  meta.reset_stats();
  testing::HT qkv({b, t, (h + 2 * g) * hs}, DType::kBF16);
  meta.rope(kDefaultStream, on_meta(qkv), h, g, rope_frequencies(hs, 1e4f), false);
  st = meta.stats();
  EXPECT_EQ(st.bytes_read, b * t * (h + g) * hs * 2);  // q and k only
  EXPECT_EQ(st.bytes_written, st.bytes_read);
  meta.reset_stats();
  testing::HT gu({n, 2 * c}, DType::kBF16), o({n, c}, DType::kBF16);
  meta.swiglu_forward(kDefaultStream, on_meta(gu), on_meta(o));
  st = meta.stats();
  EXPECT_EQ(st.bytes_read, n * 2 * c * 2);
  EXPECT_EQ(st.bytes_written, n * c * 2);
  EXPECT_EQ(st.other_flops, MetaFlops::kSwiGluForward * n * c);
  EXPECT_EQ(st.gemm_flops, 0);
  // Qwen3's q/k norm reads and writes the q and k columns, writes qk_in and rstd.
  meta.reset_stats();
  testing::HT qkn({b, t, (h + 2 * g) * hs}, DType::kBF16), wn({hs}, DType::kBF16),
      qin({b, t, (h + g) * hs}, DType::kBF16), qrs({b, t, h + g}, DType::kF32);
  meta.qk_norm_forward(kDefaultStream, on_meta(qkn), h, g, on_meta(wn), on_meta(wn), 1e-6f,
                       on_meta(qin), on_meta(qrs));
  st = meta.stats();
  EXPECT_EQ(st.calls(MetaOp::kQkNormForward), 1);
  EXPECT_EQ(st.bytes_read, b * t * (h + g) * hs * 2 + 2 * hs * 2);
  EXPECT_EQ(st.bytes_written, b * t * (h + g) * hs * 2 * 2 + b * t * (h + g) * 4);
  EXPECT_EQ(st.other_flops, MetaFlops::kQkNormForward * b * t * (h + g) * hs);
  // An embedding without a position table reads one wte row per token.
  meta.reset_stats();
  const std::vector<std::int32_t> ids(b * t, 0);
  const IndexTensor tok{ids.data(), Shape{b, t}, Device::kMeta};
  testing::HT wte({5, c}, DType::kBF16), emb({b, t, c}, DType::kBF16);
  meta.embedding_forward(kDefaultStream, tok, on_meta(wte), on_meta(emb));
  st = meta.stats();
  EXPECT_EQ(st.bytes_read, b * t * 4 + b * t * c * 2);
  EXPECT_EQ(st.bytes_written, b * t * c * 2);
}

TEST(RMSNormTest, GradientsLowPrecisionRecomputeMemory) {
  RMSNorm n("norm", 8, 1e-5f);
  testing::check_gradients(
      n, Shape{2, 3, 8},
      [](const Vec& x, const Params& p) { return ref_rmsnorm(x, 8, p[0], 1e-5); }, 61);
  for (DType dt : {DType::kF16, DType::kBF16}) {
    testing::check_low_precision(
        [] { return std::make_unique<RMSNorm>("norm", 16, 1e-5f); }, dt, Shape{2, 4, 16},
        [](const Vec& x, const Params& p) { return ref_rmsnorm(x, 16, p[0], 1e-5); }, 3.0, 62);
  }
  RMSNorm r("norm", 16);
  testing::check_recompute(r, Shape{2, 8, 16}, 63);
  for (DType dt : kDTypes) {
    RMSNorm m("layers.0.input_layernorm", 128);
    testing::check_memory_of(m, dt, Shape{2, 128, 128});
  }
  EXPECT_EQ(r.cost(64, DType::kBF16).saved_bytes, 64 * 4);
  testing::expect_invalid([] { RMSNorm("n", 8, 0.0f); }, {"eps"});
}

TEST(GatedMlpTest, GradientsLowPrecisionRecomputeMemory) {
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    GatedMLP m("mlp", 6, 10, bias);
    EXPECT_EQ(m.parameters().size(), bias ? 4u : 2u);
    testing::check_gradients(
        m, Shape{2, 3, 6},
        [bias](const Vec& x, const Params& p) { return ref_gated_mlp(x, 6, 10, p, bias); }, 71);
  }
  for (DType dt : {DType::kF16, DType::kBF16}) {
    testing::check_low_precision(
        [] { return std::make_unique<GatedMLP>("mlp", 16, 40); }, dt, Shape{2, 4, 16},
        [](const Vec& x, const Params& p) { return ref_gated_mlp(x, 16, 40, p, false); }, 4.0, 72);
  }
  GatedMLP r("mlp", 16, 40);
  testing::check_recompute(r, Shape{2, 8, 16}, 73);
  for (DType dt : kDTypes) {
    GatedMLP m("layers.0.mlp", 64, 192);
    testing::check_memory_of(m, dt, Shape{2, 64, 64});
  }
  const LayerCost k = GatedMLP("m", 64, 192).cost(32, DType::kBF16);
  EXPECT_EQ(k.saved_bytes, 3 * 32 * 192 * 2);
  EXPECT_EQ(k.forward_flops, 6 * 32 * 64 * 192);
  EXPECT_EQ(k.backward_flops, 2 * k.forward_flops);
}

TEST(LlamaAttentionTest, GroupedRotaryBiasedHeadsMatchTheReference) {
  // C = 12 with 4 heads of 4 (head_dim * heads != C), 2 kv heads; with and without q/k/v
  // biases (Qwen2 has them, Llama not).
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "qkv bias" : "no bias");
    const AttentionShape s = llama_shape(4, 2, 4, bias);
    CausalSelfAttention a("self_attn", 12, s);
    EXPECT_EQ(a.kv_heads(), 2);
    EXPECT_EQ(a.parameters().size(), bias ? 3u : 2u);
    EXPECT_EQ(a.parameters()[0]->shape, (Shape{(4 + 2 * 2) * 4, 12}));
    testing::check_gradients(
        a, Shape{2, 5, 12},
        [s](const Vec& x, const Params& p) { return ref_llama_attention(x, 2, 5, 12, s, p); }, 81);
  }
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const AttentionShape s = llama_shape(4, 1, 8, false);
    testing::check_low_precision(
        [s] { return std::make_unique<CausalSelfAttention>("attn", 16, s); }, dt, Shape{2, 6, 16},
        [s](const Vec& x, const Params& p) { return ref_llama_attention(x, 2, 6, 16, s, p); }, 6.0,
        82);
  }
  // Llama's attention_bias: q/k/v and o biases, with the rotary embedding.
  AttentionShape all_bias = llama_shape(4, 2, 4, true);
  all_bias.proj_bias = true;
  CausalSelfAttention ab("self_attn", 12, all_bias);
  EXPECT_EQ(ab.parameters().size(), 4u);
  testing::check_gradients(
      ab, Shape{2, 5, 12},
      [all_bias](const Vec& x, const Params& p) {
        return ref_llama_attention(x, 2, 5, 12, all_bias, p);
      },
      84);
  // The rotary embedding under the materialized attention (multi-head only).
  const AttentionShape mha = llama_shape(2, 2, 4, false);
  CausalSelfAttention mat("self_attn", 8, mha, 0.02f, AttentionImpl::kMaterialized);
  testing::check_gradients(
      mat, Shape{2, 5, 8},
      [mha](const Vec& x, const Params& p) { return ref_llama_attention(x, 2, 5, 8, mha, p); }, 85);
  CausalSelfAttention r("attn", 32, llama_shape(8, 2, 8, false));
  testing::check_recompute(r, Shape{2, 8, 32}, 83);
  for (DType dt : kDTypes) {
    CausalSelfAttention m("layers.0.self_attn", 128, llama_shape(8, 2, 32, true));
    testing::check_memory_of(m, dt, Shape{2, 64, 128});
  }
}

AttentionShape qwen3_shape(i64 heads, i64 kv, i64 hs, bool qkv_bias) {
  AttentionShape s = llama_shape(heads, kv, hs, qkv_bias);
  s.qk_norm = true;
  s.qk_norm_eps = 1e-5f;
  return s;
}

TEST(LlamaAttentionTest, QkNormedHeadsMatchTheReference) {
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "qkv bias" : "no bias");
    const AttentionShape s = qwen3_shape(4, 2, 4, bias);
    CausalSelfAttention a("self_attn", 12, s);
    const auto ps = a.parameters();
    ASSERT_EQ(ps.size(), bias ? 5u : 4u);
    EXPECT_EQ(ps[bias ? 2 : 1]->name, "self_attn.q_norm.weight");
    EXPECT_EQ(ps[bias ? 3 : 2]->name, "self_attn.k_norm.weight");
    EXPECT_EQ(ps[bias ? 3 : 2]->shape, (Shape{4}));
    testing::check_gradients(
        a, Shape{2, 5, 12},
        [s](const Vec& x, const Params& p) { return ref_llama_attention(x, 2, 5, 12, s, p); }, 86);
  }
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const AttentionShape s = qwen3_shape(4, 1, 8, false);
    testing::check_low_precision(
        [s] { return std::make_unique<CausalSelfAttention>("attn", 16, s); }, dt, Shape{2, 6, 16},
        [s](const Vec& x, const Params& p) { return ref_llama_attention(x, 2, 6, 16, s, p); }, 6.0,
        87);
  }
  CausalSelfAttention r("attn", 32, qwen3_shape(8, 2, 8, false));
  testing::check_recompute(r, Shape{2, 8, 32}, 88);
  for (DType dt : kDTypes) {
    CausalSelfAttention m("layers.0.self_attn", 128, qwen3_shape(8, 2, 32, true));
    testing::check_memory_of(m, dt, Shape{2, 64, 128});
  }
  // What the norm adds to the saved state: q and k before it (mq + mk) and an f32 per head.
  const i64 t = 64, h = 8, g = 2, hs = 32;
  const LayerCost plain =
      CausalSelfAttention("a", 128, llama_shape(h, g, hs, false)).cost(t, DType::kBF16);
  const LayerCost normed =
      CausalSelfAttention("a", 128, qwen3_shape(h, g, hs, false)).cost(t, DType::kBF16);
  EXPECT_EQ(normed.saved_bytes - plain.saved_bytes, t * (h + g) * hs * 2 + t * (h + g) * 4);
  EXPECT_EQ(normed.workspace_bytes, plain.workspace_bytes);
  testing::expect_invalid(
      [] {
        CausalSelfAttention("a", 16, qwen3_shape(2, 2, 4, false), 0.02f,
                            AttentionImpl::kMaterialized);
      },
      {"qk_norm", "flash"});
  AttentionShape bad_eps = qwen3_shape(2, 2, 4, false);
  bad_eps.qk_norm_eps = 0.0f;
  testing::expect_invalid([&] { CausalSelfAttention("a", 16, bad_eps); }, {"qk_norm_eps"});
}

TEST(LlamaAttentionTest, RefusesShapesItCannotRun) {
  testing::expect_invalid([] { CausalSelfAttention("a", 16, llama_shape(4, 3, 4, false)); },
                          {"kv_heads = 3", "divisor of heads"});
  AttentionShape odd = llama_shape(4, 2, 4, false);
  odd.head_dim = 5;
  testing::expect_invalid([&] { CausalSelfAttention("a", 16, odd); }, {"rotary", "even"});
  testing::expect_invalid(
      [] {
        CausalSelfAttention("a", 16, llama_shape(4, 2, 4, false), 0.02f,
                            AttentionImpl::kMaterialized);
      },
      {"materialized", "kv_heads = 2"});
}

Vec ref_llama_block(const Vec& x, i64 b, i64 t, i64 c, const LlamaBlockShape& s, const Params& p) {
  const std::size_t na = (s.attention.qkv_bias ? 3 : 2) + (s.attention.qk_norm ? 2 : 0);
  const Params attn(p.begin() + 1, p.begin() + 1 + static_cast<std::ptrdiff_t>(na));
  const Params mlp(p.begin() + 2 + static_cast<std::ptrdiff_t>(na), p.end());
  const Vec x1 = testing::add(
      x, ref_llama_attention(ref_rmsnorm(x, c, p[0], s.rms_eps), b, t, c, s.attention, attn));
  return testing::add(
      x1, ref_gated_mlp(ref_rmsnorm(x1, c, p[1 + na], s.rms_eps), c, s.inner, mlp, s.mlp_bias));
}

TEST(LlamaBlockTest, MatchesTheReferenceRecomputesAndCountsItsMemory) {
  LlamaBlockShape s;
  s.attention = llama_shape(4, 2, 4, true);
  s.inner = 20;
  s.rms_eps = 1e-5f;
  LlamaBlock blk("layers.0", 12, s, 2);
  const auto ps = blk.parameters();
  ASSERT_EQ(ps.size(), 7u);  // norm, qkv w + b, o, norm, gate_up, down
  EXPECT_EQ(ps[0]->name, "layers.0.input_layernorm.weight");
  EXPECT_EQ(ps[1]->name, "layers.0.self_attn.qkv.weight");
  EXPECT_EQ(ps[4]->name, "layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(ps[5]->name, "layers.0.mlp.gate_up.weight");
  testing::check_gradients(
      blk, Shape{2, 5, 12},
      [s](const Vec& x, const Params& p) { return ref_llama_block(x, 2, 5, 12, s, p); }, 91);
  LlamaBlock r("layers.1", 12, s, 2);
  testing::check_recompute(r, Shape{2, 6, 12}, 92);
  LlamaBlockShape m = s;
  m.attention = llama_shape(8, 2, 16, false);
  m.inner = 256;
  for (DType dt : kDTypes) {
    LlamaBlock big("layers.0", 128, m, 4);
    testing::check_memory_of(big, dt, Shape{2, 64, 128});
  }
  // Qwen3's block: q/k norms after the qkv weight, no biases.
  LlamaBlockShape q3 = s;
  q3.attention = qwen3_shape(4, 2, 4, false);
  LlamaBlock qb("layers.0", 12, q3, 2);
  const auto qps = qb.parameters();
  ASSERT_EQ(qps.size(), 8u);  // norm, qkv, q_norm, k_norm, o, norm, gate_up, down
  EXPECT_EQ(qps[2]->name, "layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(qps[3]->name, "layers.0.self_attn.k_norm.weight");
  testing::check_gradients(
      qb, Shape{2, 5, 12},
      [q3](const Vec& x, const Params& p) { return ref_llama_block(x, 2, 5, 12, q3, p); }, 93);
  LlamaBlock qr("layers.1", 12, q3, 2);
  testing::check_recompute(qr, Shape{2, 6, 12}, 94);
}

}  // namespace
}  // namespace memfit
