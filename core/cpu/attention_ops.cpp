// CPU reference of the attention primitives (causal softmax, head permutes, rotary embedding)
// and of the fused softmax cross-entropy (core/backend.h). FP32 arithmetic on widened rows,
// double accumulators for the row sums, OpenMP over rows; each row is read whole before it is
// written, which is what makes the in-place forms (att = preatt, dpreatt = datt, dlogits =
// logits, rope's qkv) safe.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/nn_util.h"
#include "memory/error.h"

namespace memfit {

using cpu::f32;
using cpu::kNnParallelMin;
using cpu::narrow;
using cpu::widen;

// preatt (R,T,T) -> att (R,T,T); row i of a matrix uses columns [0, i], the rest become 0.
void CpuBackend::run_softmax_causal_forward(StreamId, const Tensor& preatt, float scale,
                                            const Tensor& att, std::int64_t t) {
  const std::int64_t rows = t == 0 ? 0 : preatt.numel() / t;
#pragma omp parallel if (preatt.numel() >= kNnParallelMin)
  {
    std::vector<float> v(static_cast<std::size_t>(t));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = r % t, live = i + 1;
      widen(preatt, r * t, live, v.data());
      float mx = -INFINITY;
      for (std::int64_t j = 0; j < live; ++j) {
        v[static_cast<std::size_t>(j)] *= scale;
        mx = std::max(mx, v[static_cast<std::size_t>(j)]);
      }
      double sum = 0.0;
      for (std::int64_t j = 0; j < live; ++j) {
        float& e = v[static_cast<std::size_t>(j)];
        e = std::exp(e - mx);
        sum += e;
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (std::int64_t j = 0; j < live; ++j) v[static_cast<std::size_t>(j)] *= inv;
      std::fill(v.begin() + live, v.end(), 0.0f);
      narrow(v.data(), att, r * t, t);
    }
  }
}

// datt, att (R,T,T) -> dpreatt = scale * att * (datt - sum_k att_k datt_k) on [0, i]; 0 above.
void CpuBackend::run_softmax_causal_backward(StreamId, const Tensor& datt, const Tensor& att,
                                             float scale, const Tensor& dpreatt, std::int64_t t) {
  const std::int64_t rows = t == 0 ? 0 : att.numel() / t;
#pragma omp parallel if (att.numel() >= kNnParallelMin)
  {
    std::vector<float> p(static_cast<std::size_t>(t)), d(static_cast<std::size_t>(t));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t live = r % t + 1;
      widen(att, r * t, live, p.data());
      widen(datt, r * t, live, d.data());
      double dot = 0.0;
      for (std::int64_t j = 0; j < live; ++j) {
        dot += static_cast<double>(p[static_cast<std::size_t>(j)]) * d[static_cast<std::size_t>(j)];
      }
      const float fdot = static_cast<float>(dot);
      for (std::int64_t j = 0; j < live; ++j) {
        const std::size_t k = static_cast<std::size_t>(j);
        d[k] = scale * p[k] * (d[k] - fdot);
      }
      std::fill(d.begin() + live, d.end(), 0.0f);
      narrow(d.data(), dpreatt, r * t, t);
    }
  }
}

namespace {

// Copies (converting) every hs-run between layouts (B,T,P,H,hs) and (P,B,H,T,hs).
void permute_heads(const Tensor& src, const Tensor& dst, const HeadDims& d, bool split) {
  const std::int64_t runs = d.b * d.t * d.parts * d.heads;
#pragma omp parallel for schedule(static) if (runs * d.hs >= kNnParallelMin)
  for (std::int64_t run = 0; run < runs; ++run) {
    // run indexes the (B,T,P,H) layout.
    const std::int64_t h = run % d.heads;
    const std::int64_t p = run / d.heads % d.parts;
    const std::int64_t t = run / (d.heads * d.parts) % d.t;
    const std::int64_t b = run / (d.heads * d.parts * d.t);
    const std::int64_t packed = run * d.hs;
    const std::int64_t heads_first = (((p * d.b + b) * d.heads + h) * d.t + t) * d.hs;
    const std::int64_t from = split ? packed : heads_first;
    const std::int64_t to = split ? heads_first : packed;
    convert(cpu::element(src, from), src.dtype(), cpu::element(dst, to), dst.dtype(),
            static_cast<std::size_t>(d.hs));
  }
}

void check_targets(const char* op, const IndexTensor& ids, std::int64_t vocab) {
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    const std::int32_t id = ids.data[i];
    if (id < 0 || id >= vocab) {
      throw InvalidArgument(std::string("Backend::") + op + " (cpu): targets[" + std::to_string(i) +
                            "] = " + std::to_string(id) + "; valid: [0, " + std::to_string(vocab) +
                            ")");
    }
  }
}

}  // namespace

// Rotary embedding in place on the q and k heads of each token's qkv row (backend.h).
void CpuBackend::run_rope(const Tensor& qkv, const AttentionDims& d, const RopeFreqs& f,
                          bool inverse) {
  const std::int64_t rows = d.b * d.t, heads = d.heads + d.kv_heads, half = f.half;
#pragma omp parallel if (rows * heads * d.hs >= kNnParallelMin)
  {
    std::vector<float> e(static_cast<std::size_t>(d.hs)), cs(static_cast<std::size_t>(half)),
        sn(cs.size());
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float pos = static_cast<float>(r % d.t);
      for (std::int64_t i = 0; i < half; ++i) {
        const float a = pos * f.inv_freq[i];
        cs[static_cast<std::size_t>(i)] = std::cos(a);
        sn[static_cast<std::size_t>(i)] = inverse ? -std::sin(a) : std::sin(a);
      }
      for (std::int64_t h = 0; h < heads; ++h) {  // q heads, then k heads: contiguous
        const std::int64_t off = r * d.row() + h * d.hs;
        widen(qkv, off, d.hs, e.data());
        for (std::size_t i = 0; i < cs.size(); ++i) {
          const float x = e[i], y = e[i + cs.size()];
          e[i] = x * cs[i] - y * sn[i];
          e[i + cs.size()] = y * cs[i] + x * sn[i];
        }
        narrow(e.data(), qkv, off, d.hs);
      }
    }
  }
}

void CpuBackend::run_split_heads(StreamId, const Tensor& src, const Tensor& dst,
                                 const HeadDims& d) {
  permute_heads(src, dst, d, true);
}

void CpuBackend::run_merge_heads(StreamId, const Tensor& src, const Tensor& dst,
                                 const HeadDims& d) {
  permute_heads(src, dst, d, false);
}

// logits (N,Vp), targets (N) -> lse (N) = log sum_{j<V} exp(logits_j), losses = lse - logits[y]
void CpuBackend::run_crossentropy_forward(StreamId, const Tensor& logits,
                                          const IndexTensor& targets, std::int64_t vocab,
                                          const Tensor& losses, const Tensor& lse) {
  check_targets("crossentropy_forward", targets, vocab);
  const std::int64_t vp = logits.size(logits.ndim() - 1), n = targets.numel();
#pragma omp parallel if (n * vocab >= kNnParallelMin)
  {
    std::vector<float> x(static_cast<std::size_t>(vocab));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      widen(logits, r * vp, vocab, x.data());
      const float mx = *std::max_element(x.begin(), x.end());
      double sum = 0.0;
      for (float v : x) sum += std::exp(v - mx);  // each term <= 1: no overflow
      const double l = static_cast<double>(mx) + std::log(sum);
      f32(lse)[r] = static_cast<float>(l);
      f32(losses)[r] = static_cast<float>(l - x[static_cast<std::size_t>(targets.data[r])]);
    }
  }
}

// dlogits[i,j] = g_i * (exp(logits[i,j] - lse[i]) - [j == y_i]) for j < V; 0 in the padding.
void CpuBackend::run_crossentropy_backward(StreamId, const Tensor& logits, const Tensor& lse,
                                           const IndexTensor& targets, std::int64_t vocab,
                                           float dloss, const Tensor* dlosses,
                                           const Tensor& dlogits) {
  check_targets("crossentropy_backward", targets, vocab);
  const std::int64_t vp = logits.size(logits.ndim() - 1), n = targets.numel();
#pragma omp parallel if (n * vp >= kNnParallelMin)
  {
    std::vector<float> x(static_cast<std::size_t>(vp));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      widen(logits, r * vp, vocab, x.data());
      const float g = dloss * (dlosses != nullptr ? f32(*dlosses)[r] : 1.0f);
      const float l = f32(lse)[r];
      for (std::int64_t j = 0; j < vocab; ++j) {
        float& v = x[static_cast<std::size_t>(j)];
        v = g * std::exp(v - l);
      }
      x[static_cast<std::size_t>(targets.data[r])] -= g;
      std::fill(x.begin() + vocab, x.end(), 0.0f);
      narrow(x.data(), dlogits, r * vp, vp);
    }
  }
}

}  // namespace memfit
