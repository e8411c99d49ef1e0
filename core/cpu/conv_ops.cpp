// CPU reference of conv2d_forward / conv2d_backward (core/backend.h), channels-last:
//   inp (N,H,W,C), weight (K,R,S,C), out (N,P,Q,K).
// Direct loops over image rows: each output row (n, p) reads the R input rows under it, each
// input row (n, y) of dinp gathers from the output rows it fed, and each block of filters
// sums dweight over every (n, p, q). Values widen to f32, products accumulate in f32 (as
// cblas_sgemm and cuDNN's FP32 compute do) in a fixed order, and every output element is
// written by one thread, so the bits do not depend on the thread count. The innermost loops
// run over C, contiguous in both the image and the filters (omp simd: the reduction's lane
// order is fixed when the file is compiled).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/nn_util.h"

namespace memfit {
namespace {

using cpu::f32;
using cpu::kNnParallelMin;
using cpu::narrow;
using cpu::widen;

struct Dims {
  std::int64_t n, h, w, c, k, r, s, sh, sw, ph, pw, p, q, rsc;
};

Dims dims_of(const Conv2dDesc& d) {
  return {d.n,        d.h,        d.w,     d.c,     d.k,   d.r,   d.s,
          d.stride_h, d.stride_w, d.pad_h, d.pad_w, d.p(), d.q(), d.r * d.s * d.c};
}

// t[off, off + n) as f32: t's own memory when it is f32, else widened into buf.
const float* f32_run(const Tensor& t, std::int64_t off, std::int64_t n, float* buf) {
  if (t.dtype() == DType::kF32) return f32(t) + off;
  widen(t, off, n, buf);
  return buf;
}

// Per-thread scratch, sized before the parallel region so nothing allocates (or throws)
// inside it.
struct ThreadBufs {
  ThreadBufs(int threads, std::int64_t per_thread)
      : per(per_thread), data(static_cast<std::size_t>(threads * per_thread)) {}
  float* get() { return data.data() + static_cast<std::size_t>(omp_get_thread_num()) * per; }
  std::int64_t per;
  std::vector<float> data;
};

int team_size(std::int64_t work) { return work >= kNnParallelMin ? omp_get_max_threads() : 1; }

// The R input rows under output row p of image n: rows[rr] points at W*C floats, or is null
// where the row falls in the padding.
void input_rows(const Tensor& inp, const Dims& d, std::int64_t n, std::int64_t p, float* buf,
                const float** rows) {
  const std::int64_t wc = d.w * d.c;
  for (std::int64_t rr = 0; rr < d.r; ++rr) {
    const std::int64_t y = p * d.sh - d.ph + rr;
    rows[rr] = (y < 0 || y >= d.h) ? nullptr : f32_run(inp, (n * d.h + y) * wc, wc, buf + rr * wc);
  }
}

}  // namespace

void CpuBackend::run_conv2d_forward(const Conv2dDesc& desc, const Tensor& inp, const Tensor& weight,
                                    const Tensor& out) {
  const Dims d = dims_of(desc);
  const std::int64_t rows = d.n * d.p;
  if (rows == 0) return;
  std::vector<float> wbuf;
  const float* wf = f32(weight);
  if (weight.dtype() != DType::kF32) {
    wbuf.resize(static_cast<std::size_t>(d.k * d.rsc));
    widen(weight, 0, d.k * d.rsc, wbuf.data());
    wf = wbuf.data();
  }
  const int team = team_size(desc.flops() / 2);
  // Per thread: R input rows, R row pointers (as floats' worth of space), one output row.
  const std::int64_t wc = d.w * d.c, qk = d.q * d.k;
  ThreadBufs bufs(team, d.r * wc + qk);
  std::vector<const float*> ptrs(static_cast<std::size_t>(team * d.r));
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t n = row / d.p, p = row % d.p;
    float* buf = bufs.get();
    float* orow = buf + d.r * wc;
    const float** in = ptrs.data() + static_cast<std::size_t>(omp_get_thread_num()) * d.r;
    input_rows(inp, d, n, p, buf, in);
    for (std::int64_t q = 0; q < d.q; ++q) {
      for (std::int64_t k = 0; k < d.k; ++k) {
        const float* wk = wf + k * d.rsc;
        float acc = 0.0f;
        for (std::int64_t rr = 0; rr < d.r; ++rr) {
          if (in[rr] == nullptr) continue;
          for (std::int64_t ss = 0; ss < d.s; ++ss) {
            const std::int64_t x = q * d.sw - d.pw + ss;
            if (x < 0 || x >= d.w) continue;
            const float* a = in[rr] + x * d.c;
            const float* b = wk + (rr * d.s + ss) * d.c;
#pragma omp simd reduction(+ : acc)
            for (std::int64_t c = 0; c < d.c; ++c) acc += a[c] * b[c];
          }
        }
        orow[q * d.k + k] = acc;
      }
    }
    narrow(orow, out, row * qk, qk);
  }
}

void CpuBackend::run_conv2d_backward(const Conv2dDesc& desc, const Tensor& dout, const Tensor& inp,
                                     const Tensor& weight, const Tensor* dinp,
                                     const Tensor& dweight) {
  const Dims d = dims_of(desc);
  if (d.n == 0) return;
  const std::int64_t wc = d.w * d.c, qk = d.q * d.k;
  const int team = team_size(desc.flops() / 2);

  // dinp[n,y,x,c] = sum over the (p,q,r,s) with y = p*sh - ph + r, x = q*sw - pw + s of
  //   dout[n,p,q,k] * weight[k,r,s,c], gathered per input row (n, y).
  if (dinp != nullptr) {
    std::vector<float> wbuf;
    const float* wf = f32(weight);
    if (weight.dtype() != DType::kF32) {
      wbuf.resize(static_cast<std::size_t>(d.k * d.rsc));
      widen(weight, 0, d.k * d.rsc, wbuf.data());
      wf = wbuf.data();
    }
    // Per thread: R dout rows, one dinp row; pointers beside them.
    ThreadBufs bufs(team, d.r * qk + wc);
    std::vector<const float*> ptrs(static_cast<std::size_t>(team * d.r));
    const std::int64_t rows = d.n * d.h;
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t n = row / d.h, y = row % d.h;
      float* buf = bufs.get();
      float* irow = buf + d.r * qk;
      const float** g = ptrs.data() + static_cast<std::size_t>(omp_get_thread_num()) * d.r;
      for (std::int64_t rr = 0; rr < d.r; ++rr) {
        const std::int64_t t = y + d.ph - rr;  // = p * sh when output row p read this row
        const bool hit = t >= 0 && t % d.sh == 0 && t / d.sh < d.p;
        g[rr] = hit ? f32_run(dout, (n * d.p + t / d.sh) * qk, qk, buf + rr * qk) : nullptr;
      }
      for (std::int64_t x = 0; x < d.w; ++x) {
        float* acc = irow + x * d.c;
        std::fill(acc, acc + d.c, 0.0f);
        for (std::int64_t rr = 0; rr < d.r; ++rr) {
          if (g[rr] == nullptr) continue;
          for (std::int64_t ss = 0; ss < d.s; ++ss) {
            const std::int64_t u = x + d.pw - ss;  // = q * sw
            if (u < 0 || u % d.sw != 0 || u / d.sw >= d.q) continue;
            const float* gq = g[rr] + (u / d.sw) * d.k;
            for (std::int64_t k = 0; k < d.k; ++k) {
              const float gv = gq[k];
              const float* wv = wf + k * d.rsc + (rr * d.s + ss) * d.c;
#pragma omp simd
              for (std::int64_t c = 0; c < d.c; ++c) acc[c] += gv * wv[c];
            }
          }
        }
      }
      narrow(irow, *dinp, row * wc, wc);
    }
  }

  // dweight[k,r,s,c] += sum over (n,p,q) of dout[n,p,q,k] * inp[n, p*sh-ph+r, q*sw-pw+s, c],
  // blocks of filters in parallel; each filter's sum runs in (n,p,q,r,s) order whatever the
  // block size, so the block size may follow the team.
  const std::int64_t kb = std::max<std::int64_t>(1, (d.k + team - 1) / team);
  const std::int64_t blocks = (d.k + kb - 1) / kb;
  // Per thread: kb filters' f32 sums, R input rows, one dout row; pointers beside them.
  ThreadBufs bufs(team, kb * d.rsc + d.r * wc + qk);
  std::vector<const float*> ptrs(static_cast<std::size_t>(team * d.r));
  float* dw = f32(dweight);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t k0 = blk * kb, k1 = std::min(d.k, k0 + kb);
    float* buf = bufs.get();
    float* acc = buf;
    float* inbuf = acc + kb * d.rsc;
    float* gbuf = inbuf + d.r * wc;
    const float** in = ptrs.data() + static_cast<std::size_t>(omp_get_thread_num()) * d.r;
    std::fill(acc, acc + (k1 - k0) * d.rsc, 0.0f);
    for (std::int64_t n = 0; n < d.n; ++n) {
      for (std::int64_t p = 0; p < d.p; ++p) {
        input_rows(inp, d, n, p, inbuf, in);
        const float* g = f32_run(dout, (n * d.p + p) * qk, qk, gbuf);
        for (std::int64_t q = 0; q < d.q; ++q) {
          for (std::int64_t k = k0; k < k1; ++k) {
            const float gv = g[q * d.k + k];
            float* ak = acc + (k - k0) * d.rsc;
            for (std::int64_t rr = 0; rr < d.r; ++rr) {
              if (in[rr] == nullptr) continue;
              for (std::int64_t ss = 0; ss < d.s; ++ss) {
                const std::int64_t x = q * d.sw - d.pw + ss;
                if (x < 0 || x >= d.w) continue;
                const float* a = in[rr] + x * d.c;
                float* o = ak + (rr * d.s + ss) * d.c;
#pragma omp simd
                for (std::int64_t c = 0; c < d.c; ++c) o[c] += gv * a[c];
              }
            }
          }
        }
      }
    }
    float* dst = dw + k0 * d.rsc;
    for (std::int64_t i = 0; i < (k1 - k0) * d.rsc; ++i) dst[i] += acc[i];
  }
}

void CpuBackend::do_conv2d_forward(StreamId s, const Conv2dDesc& d, const Tensor& inp,
                                   const Tensor& weight, const Tensor& out) {
  if (streams_.runs_inline(s)) {
    run_conv2d_forward(d, inp, weight, out);
  } else {
    streams_.enqueue(s, [this, d, inp, weight, out] { run_conv2d_forward(d, inp, weight, out); });
  }
}

void CpuBackend::do_conv2d_backward(StreamId s, const Conv2dDesc& d, const Tensor& dout,
                                    const Tensor& inp, const Tensor& weight, const Tensor* dinp,
                                    const Tensor& dweight) {
  if (streams_.runs_inline(s)) {
    run_conv2d_backward(d, dout, inp, weight, dinp, dweight);
    return;
  }
  // The view is captured by value; the queued op points at its own copy.
  const bool has_dinp = dinp != nullptr;
  const Tensor dinp_view = has_dinp ? *dinp : Tensor();
  streams_.enqueue(s, [this, d, dout, inp, weight, has_dinp, dinp_view, dweight] {
    run_conv2d_backward(d, dout, inp, weight, has_dinp ? &dinp_view : nullptr, dweight);
  });
}

}  // namespace memfit
