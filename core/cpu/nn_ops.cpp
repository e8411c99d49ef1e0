// CPU reference of the row-wise and elementwise neural-network ops (core/backend.h): layernorm,
// RMSNorm (and Qwen3's per-head q/k RMSNorm), GELU, SwiGLU, residual and bias adds, embeddings
// and AdamW. Every value is widened to f32, computed in FP32 with double accumulators for
// reductions, and rounded once to the output's dtype. Parallel (OpenMP) over rows, or over
// column blocks where rows are reduced, so no output element is ever written by two threads and
// results do not depend on the thread count. GELU runs vec_ops.h's vector kernels (a polynomial
// exp, a few ulp from std::tanh's form).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cpu/adamw.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/nn_util.h"
#include "core/cpu/vec_ops.h"
#include "memory/error.h"

namespace memfit {
namespace {

using cpu::f32;
using cpu::kColBlock;
using cpu::kNnParallelMin;
using cpu::narrow;
using cpu::widen;

constexpr std::int64_t kChunk = 4096;

// f(off, n) over [0, total) in chunks of kChunk; parallel when large. f must not throw.
template <typename F>
void for_chunks(std::int64_t total, F&& f) {
  const std::int64_t chunks = (total + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (total >= kNnParallelMin)
  for (std::int64_t i = 0; i < chunks; ++i) f(i * kChunk, std::min(kChunk, total - i * kChunk));
}

// Sums rows of a (rows, cols) tensor per column into double `acc` (cols), in row order,
// column blocks in parallel. g(row, col0, n, buf) must fill buf[0, n) with the row's terms.
template <typename G>
void column_sums(std::int64_t rows, std::int64_t cols, std::vector<double>& acc, G&& g) {
  acc.assign(static_cast<std::size_t>(cols), 0.0);
  const std::int64_t blocks = (cols + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (rows * cols >= kNnParallelMin && blocks > 1)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t c0 = blk * kColBlock, n = std::min(kColBlock, cols - c0);
    float buf[kColBlock];
    for (std::int64_t r = 0; r < rows; ++r) {
      g(r, c0, n, buf);
      for (std::int64_t j = 0; j < n; ++j) acc[static_cast<std::size_t>(c0 + j)] += buf[j];
    }
  }
}

// dst (f32) += acc, each element rounded once.
void add_into(const Tensor& dst, const std::vector<double>& acc) {
  float* d = f32(dst);
  for (std::size_t i = 0; i < acc.size(); ++i) d[i] = static_cast<float>(d[i] + acc[i]);
}

}  // namespace

// inp (N,C), weight (C), bias (C) -> out (N,C), mean (N), rstd (N)
void CpuBackend::run_layernorm_forward(StreamId, const Tensor& inp, const Tensor& weight,
                                       const Tensor& bias, float eps, const Tensor& out,
                                       const Tensor& mean, const Tensor& rstd) {
  const std::int64_t c = inp.size(inp.ndim() - 1), n = cpu::rows_of(inp);
  std::vector<float> w(static_cast<std::size_t>(c)), b(static_cast<std::size_t>(c));
  widen(weight, 0, c, w.data());
  widen(bias, 0, c, b.data());
#pragma omp parallel if (n * c >= kNnParallelMin)
  {
    std::vector<float> x(static_cast<std::size_t>(c));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      widen(inp, r * c, c, x.data());
      double s = 0.0;
      for (float v : x) s += v;
      const float m = static_cast<float>(s / static_cast<double>(c));
      double ss = 0.0;
      for (float v : x) ss += static_cast<double>(v - m) * (v - m);
      const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + eps));
      for (std::int64_t j = 0; j < c; ++j) {
        const std::size_t i = static_cast<std::size_t>(j);
        x[i] = (x[i] - m) * rs * w[i] + b[i];
      }
      narrow(x.data(), out, r * c, c);
      f32(mean)[r] = m;
      f32(rstd)[r] = rs;
    }
  }
}

// dout (N,C), inp (N,C), weight (C), mean (N), rstd (N) -> dinp +=, dweight +=, dbias +=
//   norm = (x - mean) * rstd, g = weight * dout
//   dinp += rstd * (g - mean(g) - norm * mean(g * norm)), dweight += sum norm * dout, dbias += sum
//   dout
void CpuBackend::run_layernorm_backward(StreamId, const Tensor& dout, const Tensor& inp,
                                        const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd, const Tensor& dinp,
                                        const Tensor& dweight, const Tensor& dbias) {
  const std::int64_t c = inp.size(inp.ndim() - 1), n = cpu::rows_of(inp);
  std::vector<float> w(static_cast<std::size_t>(c));
  widen(weight, 0, c, w.data());
  const float* mu = f32(mean);
  const float* rs = f32(rstd);
#pragma omp parallel if (n * c >= kNnParallelMin)
  {
    std::vector<float> x(static_cast<std::size_t>(c)), d(static_cast<std::size_t>(c)),
        acc(static_cast<std::size_t>(c));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      widen(inp, r * c, c, x.data());
      widen(dout, r * c, c, d.data());
      widen(dinp, r * c, c, acc.data());
      double sg = 0.0, sgn = 0.0;
      for (std::size_t j = 0; j < x.size(); ++j) {
        x[j] = (x[j] - mu[r]) * rs[r];  // norm
        const float g = w[j] * d[j];
        sg += g;
        sgn += static_cast<double>(g) * x[j];
      }
      const float mg = static_cast<float>(sg / static_cast<double>(c));
      const float mgn = static_cast<float>(sgn / static_cast<double>(c));
      for (std::size_t j = 0; j < x.size(); ++j) {
        acc[j] += rs[r] * (w[j] * d[j] - mg - x[j] * mgn);
      }
      narrow(acc.data(), dinp, r * c, c);
    }
  }
  std::vector<double> sums;
  column_sums(n, c, sums, [&](std::int64_t r, std::int64_t c0, std::int64_t m, float* buf) {
    float xb[kColBlock];
    widen(inp, r * c + c0, m, xb);
    widen(dout, r * c + c0, m, buf);
    for (std::int64_t j = 0; j < m; ++j) buf[j] *= (xb[j] - mu[r]) * rs[r];
  });
  add_into(dweight, sums);
  column_sums(n, c, sums, [&](std::int64_t r, std::int64_t c0, std::int64_t m, float* buf) {
    widen(dout, r * c + c0, m, buf);
  });
  add_into(dbias, sums);
}

// inp (N,C), weight (C) -> out (N,C), rstd (N): out = inp * rstd * weight.
void CpuBackend::run_rmsnorm_forward(const Tensor& inp, const Tensor& weight, float eps,
                                     const Tensor& out, const Tensor& rstd) {
  const std::int64_t c = inp.size(inp.ndim() - 1), n = cpu::rows_of(inp);
  std::vector<float> w(static_cast<std::size_t>(c));
  widen(weight, 0, c, w.data());
#pragma omp parallel if (n * c >= kNnParallelMin)
  {
    std::vector<float> x(static_cast<std::size_t>(c));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      widen(inp, r * c, c, x.data());
      double ss = 0.0;
      for (float v : x) ss += static_cast<double>(v) * v;
      const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + eps));
      for (std::size_t j = 0; j < x.size(); ++j) x[j] = x[j] * rs * w[j];
      narrow(x.data(), out, r * c, c);
      f32(rstd)[r] = rs;
    }
  }
}

// norm = inp * rstd, g = weight * dout: dinp += rstd * (g - norm * mean(g * norm)),
// dweight += sum over rows of norm * dout.
void CpuBackend::run_rmsnorm_backward(const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                      const Tensor& rstd, const Tensor& dinp,
                                      const Tensor& dweight) {
  const std::int64_t c = inp.size(inp.ndim() - 1), n = cpu::rows_of(inp);
  std::vector<float> w(static_cast<std::size_t>(c));
  widen(weight, 0, c, w.data());
  const float* rs = f32(rstd);
#pragma omp parallel if (n * c >= kNnParallelMin)
  {
    std::vector<float> x(static_cast<std::size_t>(c)), d(static_cast<std::size_t>(c)),
        acc(static_cast<std::size_t>(c));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      widen(inp, r * c, c, x.data());
      widen(dout, r * c, c, d.data());
      widen(dinp, r * c, c, acc.data());
      double sgn = 0.0;
      for (std::size_t j = 0; j < x.size(); ++j) {
        x[j] *= rs[r];  // norm
        sgn += static_cast<double>(w[j] * d[j]) * x[j];
      }
      const float mgn = static_cast<float>(sgn / static_cast<double>(c));
      for (std::size_t j = 0; j < x.size(); ++j) acc[j] += rs[r] * (w[j] * d[j] - x[j] * mgn);
      narrow(acc.data(), dinp, r * c, c);
    }
  }
  std::vector<double> sums;
  column_sums(n, c, sums, [&](std::int64_t r, std::int64_t c0, std::int64_t m, float* buf) {
    float xb[kColBlock];
    widen(inp, r * c + c0, m, xb);
    widen(dout, r * c + c0, m, buf);
    for (std::int64_t j = 0; j < m; ++j) buf[j] *= xb[j] * rs[r];
  });
  add_into(dweight, sums);
}

// Per-head RMSNorm of qkv's q and k heads, in place (backend.h). Row r of qk_in and rstd is head
// h = r % (H + G) of token r / (H + G); the heads of one token are contiguous in qkv.
void CpuBackend::run_qk_norm_forward(const Tensor& qkv, const AttentionDims& d,
                                     const Tensor& q_weight, const Tensor& k_weight, float eps,
                                     const Tensor& qk_in, const Tensor& rstd) {
  const std::int64_t hs = d.hs, qk = d.heads + d.kv_heads, n = d.b * d.t * qk;
  std::vector<float> wq(static_cast<std::size_t>(hs)), wk(wq.size());
  widen(q_weight, 0, hs, wq.data());
  widen(k_weight, 0, hs, wk.data());
#pragma omp parallel if (n * hs >= kNnParallelMin)
  {
    std::vector<float> x(static_cast<std::size_t>(hs));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t h = r % qk, off = (r / qk) * d.row() + h * hs;
      widen(qkv, off, hs, x.data());
      narrow(x.data(), qk_in, r * hs, hs);
      double ss = 0.0;
      for (float v : x) ss += static_cast<double>(v) * v;
      const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(hs) + eps));
      const std::vector<float>& w = h < d.heads ? wq : wk;
      for (std::size_t j = 0; j < x.size(); ++j) x[j] = x[j] * rs * w[j];
      narrow(x.data(), qkv, off, hs);
      f32(rstd)[r] = rs;
    }
  }
}

// The weight gradients first (they read dqkv's incoming values), then dqkv's q and k heads
// rewritten in place with rmsnorm's input gradient.
void CpuBackend::run_qk_norm_backward(const Tensor& dqkv, const Tensor& qk_in, const Tensor& rstd,
                                      const AttentionDims& d, const Tensor& q_weight,
                                      const Tensor& k_weight, const Tensor& dq_weight,
                                      const Tensor& dk_weight) {
  const std::int64_t hs = d.hs, qk = d.heads + d.kv_heads, tokens = d.b * d.t, n = tokens * qk;
  const float* rs = f32(rstd);
  // Rows of one weight's sum: the `count` heads from `first` of every token, in (token, head)
  // order.
  const auto weight_grad = [&](std::int64_t first, std::int64_t count, const Tensor& dweight) {
    std::vector<double> sums;
    column_sums(tokens * count, hs, sums,
                [&](std::int64_t i, std::int64_t c0, std::int64_t m, float* buf) {
                  const std::int64_t tok = i / count, h = first + i % count, r = tok * qk + h;
                  float xb[kColBlock];
                  widen(qk_in, r * hs + c0, m, xb);
                  widen(dqkv, tok * d.row() + h * hs + c0, m, buf);
                  for (std::int64_t j = 0; j < m; ++j) buf[j] *= xb[j] * rs[r];
                });
    add_into(dweight, sums);
  };
  weight_grad(0, d.heads, dq_weight);
  weight_grad(d.heads, d.kv_heads, dk_weight);
  std::vector<float> wq(static_cast<std::size_t>(hs)), wk(wq.size());
  widen(q_weight, 0, hs, wq.data());
  widen(k_weight, 0, hs, wk.data());
#pragma omp parallel if (n * hs >= kNnParallelMin)
  {
    std::vector<float> x(static_cast<std::size_t>(hs)), g(x.size());
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t h = r % qk, off = (r / qk) * d.row() + h * hs;
      const std::vector<float>& w = h < d.heads ? wq : wk;
      widen(qk_in, r * hs, hs, x.data());
      widen(dqkv, off, hs, g.data());
      double sgn = 0.0;
      for (std::size_t j = 0; j < x.size(); ++j) {
        x[j] *= rs[r];  // norm
        g[j] *= w[j];   // weight * dout
        sgn += static_cast<double>(g[j]) * x[j];
      }
      const float mgn = static_cast<float>(sgn / static_cast<double>(hs));
      for (std::size_t j = 0; j < x.size(); ++j) g[j] = rs[r] * (g[j] - x[j] * mgn);
      narrow(g.data(), dqkv, off, hs);
    }
  }
}

// gate_up (N,2F) -> out (N,F) = silu(g) * u. (F >= 1: the base class returns on no work.)
void CpuBackend::run_swiglu_forward(const Tensor& gate_up, const Tensor& out) {
  const std::int64_t f = gate_up.size(gate_up.ndim() - 1) / 2;
  const std::int64_t n = out.numel() / f;
#pragma omp parallel if (out.numel() >= kNnParallelMin)
  {
    std::vector<float> g(static_cast<std::size_t>(f)), u(g.size());
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      widen(gate_up, r * 2 * f, f, g.data());
      widen(gate_up, r * 2 * f + f, f, u.data());
      for (std::size_t j = 0; j < g.size(); ++j) g[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
      narrow(g.data(), out, r * f, f);
    }
  }
}

// s = sigmoid(g): dg = dout * u * s * (1 + g (1 - s)), du = dout * g * s. Each row is read
// whole before it is written, so dgate_up may be gate_up.
void CpuBackend::run_swiglu_backward(const Tensor& dout, const Tensor& gate_up,
                                     const Tensor& dgate_up) {
  const std::int64_t f = gate_up.size(gate_up.ndim() - 1) / 2;
  const std::int64_t n = dout.numel() / f;
#pragma omp parallel if (dout.numel() >= kNnParallelMin)
  {
    std::vector<float> g(static_cast<std::size_t>(f)), u(g.size()), d(g.size());
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      widen(gate_up, r * 2 * f, f, g.data());
      widen(gate_up, r * 2 * f + f, f, u.data());
      widen(dout, r * f, f, d.data());
      for (std::size_t j = 0; j < g.size(); ++j) {
        const float s = 1.0f / (1.0f + std::exp(-g[j]));
        const float du = d[j] * g[j] * s;
        g[j] = d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
        u[j] = du;
      }
      narrow(g.data(), dgate_up, r * 2 * f, f);
      narrow(u.data(), dgate_up, r * 2 * f + f, f);
    }
  }
}

void CpuBackend::run_gelu_forward(StreamId, const Tensor& inp, const Tensor& out) {
  const cpu::VecIsa isa = cpu::vec_isa_best();
  for_chunks(inp.numel(), [&](std::int64_t off, std::int64_t n) {
    if (inp.dtype() == DType::kF32 && out.dtype() == DType::kF32) {
      return cpu::gelu_forward(isa, f32(inp) + off, f32(out) + off, n);
    }
    float v[kChunk];
    widen(inp, off, n, v);
    cpu::gelu_forward(isa, v, v, n);
    narrow(v, out, off, n);
  });
}

void CpuBackend::run_gelu_backward(StreamId, const Tensor& dout, const Tensor& inp,
                                   const Tensor& dinp) {
  const cpu::VecIsa isa = cpu::vec_isa_best();
  for_chunks(inp.numel(), [&](std::int64_t off, std::int64_t n) {
    if (inp.dtype() == DType::kF32 && dout.dtype() == DType::kF32 &&
        dinp.dtype() == DType::kF32) {
      return cpu::gelu_backward(isa, f32(inp) + off, f32(dout) + off, f32(dinp) + off, n);
    }
    float x[kChunk];
    float d[kChunk];
    widen(inp, off, n, x);
    widen(dout, off, n, d);
    cpu::gelu_backward(isa, x, d, d, n);
    narrow(d, dinp, off, n);
  });
}

void CpuBackend::run_add(StreamId, const Tensor& a, const Tensor& b, const Tensor& out) {
  for_chunks(a.numel(), [&](std::int64_t off, std::int64_t n) {
    float x[kChunk];
    float y[kChunk];
    widen(a, off, n, x);
    widen(b, off, n, y);
    for (std::int64_t i = 0; i < n; ++i) x[i] += y[i];
    narrow(x, out, off, n);
  });
}

// bias (OC), out (N,OC): out += bias
void CpuBackend::run_add_bias(StreamId, const Tensor& bias, const Tensor& out) {
  const std::int64_t oc = out.size(out.ndim() - 1), n = cpu::rows_of(out);
  std::vector<float> b(static_cast<std::size_t>(oc));
  widen(bias, 0, oc, b.data());
#pragma omp parallel if (n * oc >= kNnParallelMin)
  {
    std::vector<float> row(static_cast<std::size_t>(oc));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      widen(out, r * oc, oc, row.data());
      for (std::size_t j = 0; j < row.size(); ++j) row[j] += b[j];
      narrow(row.data(), out, r * oc, oc);
    }
  }
}

// dout (N,OC) -> dbias (OC) += column sums
void CpuBackend::run_bias_backward(StreamId, const Tensor& dout, const Tensor& dbias) {
  const std::int64_t oc = dout.size(dout.ndim() - 1), n = cpu::rows_of(dout);
  std::vector<double> sums;
  column_sums(n, oc, sums, [&](std::int64_t r, std::int64_t c0, std::int64_t m, float* buf) {
    widen(dout, r * oc + c0, m, buf);
  });
  add_into(dbias, sums);
}

namespace {

// Token ids are data: checked here, before anything is written (backend.h).
void check_ids(const char* op, const IndexTensor& ids, std::int64_t limit, const char* what) {
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    const std::int32_t id = ids.data[i];
    if (id < 0 || id >= limit) {
      throw InvalidArgument(std::string("Backend::") + op + " (cpu): " + what + "[" +
                            std::to_string(i) + "] = " + std::to_string(id) + "; valid: [0, " +
                            std::to_string(limit) + ")");
    }
  }
}

}  // namespace

// tokens (B,T), wte (V,C), wpe (maxT,C) -> out (B,T,C) = wte[token] + wpe[t]
void CpuBackend::run_embedding_forward(StreamId, const IndexTensor& tokens, const Tensor& wte,
                                       const Tensor* wpe, const Tensor& out) {
  check_ids("embedding_forward", tokens, wte.size(0), "tokens");
  const std::int64_t bt = tokens.numel(), t = tokens.shape[1], c = wte.size(1);
#pragma omp parallel if (bt * c >= kNnParallelMin)
  {
    std::vector<float> e(static_cast<std::size_t>(c)), p(static_cast<std::size_t>(c));
#pragma omp for schedule(static)
    for (std::int64_t i = 0; i < bt; ++i) {
      widen(wte, tokens.data[i] * c, c, e.data());
      if (wpe != nullptr) {
        widen(*wpe, (i % t) * c, c, p.data());
        for (std::size_t j = 0; j < e.size(); ++j) e[j] += p[j];
      }
      narrow(e.data(), out, i * c, c);
    }
  }
}

// dout (B,T,C), tokens (B,T) -> dwte (V,C) +=, dwpe (maxT,C) += (when there is one)
// Column blocks in parallel; within a block, tokens in (b,t) order, so a repeated token's
// gradients add in the same order on every run and thread count.
void CpuBackend::run_embedding_backward(StreamId, const Tensor& dout, const IndexTensor& tokens,
                                        const Tensor& dwte, const Tensor* dwpe) {
  check_ids("embedding_backward", tokens, dwte.size(0), "tokens");
  const std::int64_t bt = tokens.numel(), t = tokens.shape[1], c = dwte.size(1);
  float* gte = f32(dwte);
  float* gpe = dwpe != nullptr ? f32(*dwpe) : nullptr;
  const std::int64_t blocks = (c + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (bt * c >= kNnParallelMin && blocks > 1)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t c0 = blk * kColBlock, m = std::min(kColBlock, c - c0);
    float d[kColBlock];
    for (std::int64_t i = 0; i < bt; ++i) {
      widen(dout, i * c + c0, m, d);
      float* we = gte + tokens.data[i] * c + c0;
      for (std::int64_t j = 0; j < m; ++j) we[j] += d[j];
      if (gpe == nullptr) continue;
      float* pe = gpe + (i % t) * c + c0;
      for (std::int64_t j = 0; j < m; ++j) pe[j] += d[j];
    }
  }
}

void CpuBackend::run_adamw(StreamId, const AdamWConstants& k, const Tensor& param,
                           const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                           const Tensor* param_out) {
  AdamWBuffers b;
  b.n = static_cast<std::size_t>(param.numel());
  b.param = f32(param);
  b.exp_avg = f32(exp_avg);
  b.exp_avg_sq = f32(exp_avg_sq);
  b.grad = grad.raw();
  b.grad_dtype = grad.dtype();
  if (param_out != nullptr && param_out->numel() > 0) {
    b.param_out = param_out->raw();
    b.out_dtype = param_out->dtype();
  }
  adamw_step(k, b);
}

}  // namespace memfit
