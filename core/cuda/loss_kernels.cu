// The CUDA backend's kernels for embeddings, the fused cross-entropy and AdamW (launchers
// declared in nn_kernels.h; the row and elementwise ops are in nn_kernels.cu, whose header
// describes the layout of the work and the type scheme shared by both files).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "core/cuda/nn_kernel_util.cuh"
#include "core/cuda/nn_kernels.h"

namespace memfit::cuda {
namespace {

// ---- embeddings ----------------------------------------------------------------------------

// One block per position i of (B,T): out[i,:] = wte[tokens[i],:] + wpe[i % T,:] (no wpe term
// when wpe.p is null).
template <typename T>
__global__ void embedding_forward_kernel(const std::int32_t* tokens, In<T> wte, In<T> wpe,
                                         Out<T> out, i64 bt, i64 t, i64 c, i64 vocab) {
  for (i64 i = blockIdx.x; i < bt; i += gridDim.x) {
    const std::int32_t tok = tokens[i];
    if (tok < 0 || tok >= vocab) __trap();  // ids are data: see core/backend.h
    const i64 we = static_cast<i64>(tok) * c, pe = (i % t) * c;
    if (wpe.p == nullptr) {
      for (i64 j = threadIdx.x; j < c; j += blockDim.x) out(i * c + j, wte(we + j));
    } else {
      for (i64 j = threadIdx.x; j < c; j += blockDim.x) out(i * c + j, wte(we + j) + wpe(pe + j));
    }
  }
}

// Checks every id and writes the sort's values: positions 0..N-1.
__global__ void embedding_prepare_kernel(const std::int32_t* tokens, std::int32_t* positions, i64 n,
                                         i64 vocab) {
  for (i64 i = global_index(); i < n; i += global_stride()) {
    const std::int32_t tok = tokens[i];
    if (tok < 0 || tok >= vocab) __trap();
    positions[i] = static_cast<std::int32_t>(i);
  }
}

constexpr int kGather = 8;  // loads in flight per thread while a segment's terms are added

// x: sorted index k that starts a run of equal tokens (others return); y: column tile.
// dwte[tok, col] += dout[pos, col] for the run's positions, one by one in position order.
template <typename T>
__global__ void embedding_dwte_kernel(In<T> dout, const std::uint32_t* sorted_tok,
                                      const std::int32_t* sorted_pos, float* dwte, i64 n, i64 c) {
  const i64 col = static_cast<i64>(blockIdx.y) * blockDim.x + threadIdx.x;
  for (i64 k = blockIdx.x; k < n; k += gridDim.x) {
    const std::uint32_t tok = sorted_tok[k];
    if (k > 0 && sorted_tok[k - 1] == tok) continue;  // not the start of its run
    if (col >= c) continue;
    i64 end = k + 1;
    while (end < n && sorted_tok[end] == tok) ++end;
    float* dst = dwte + static_cast<i64>(tok) * c + col;
    float acc = *dst;
    for (i64 k2 = k; k2 < end; k2 += kGather) {
      // kGather independent loads in flight, then the adds in position order.
      float v[kGather];
#pragma unroll
      for (int q = 0; q < kGather; ++q) {
        v[q] = k2 + q < end ? dout(static_cast<i64>(sorted_pos[k2 + q]) * c + col) : 0.0f;
      }
#pragma unroll
      for (int q = 0; q < kGather; ++q) {
        if (k2 + q < end) acc += v[q];
      }
    }
    *dst = acc;
  }
}

// dwpe[tt, col] += dout[b, tt, col] for b = 0..B-1 in order; one thread per (tt, col).
template <typename T>
__global__ void embedding_dwpe_kernel(In<T> dout, float* dwpe, i64 b, i64 t, i64 c) {
  const i64 tc = t * c;
  for (i64 i = global_index(); i < tc; i += global_stride()) {
    float acc = dwpe[i];
    for (i64 bb = 0; bb < b; ++bb) acc += dout(bb * tc + i);
    dwpe[i] = acc;
  }
}

// Bits the radix sort must look at for ids in [0, vocab).
int id_bits(i64 vocab) {
  int bits = 1;
  while (bits < 32 && (i64{1} << bits) < vocab) ++bits;
  return bits;
}

struct EmbeddingScratch {
  std::size_t keys = 0, pos_in = 0, pos_out = 0, temp = 0, temp_bytes = 0, total = 0;
};

cudaError_t embedding_scratch_layout(i64 n, i64 vocab, EmbeddingScratch* s) {
  const std::size_t ids = static_cast<std::size_t>(n) * 4;
  s->keys = 0;
  s->pos_in = align_up(ids);
  s->pos_out = s->pos_in + align_up(ids);
  s->temp = s->pos_out + align_up(ids);
  std::size_t temp = 0;
  const cudaError_t e = cub::DeviceRadixSort::SortPairs(
      nullptr, temp, static_cast<const std::uint32_t*>(nullptr),
      static_cast<std::uint32_t*>(nullptr), static_cast<const std::int32_t*>(nullptr),
      static_cast<std::int32_t*>(nullptr), n, 0, id_bits(vocab));
  s->temp_bytes = temp;
  s->total = s->temp + align_up(temp);
  return e;
}

// ---- cross-entropy -------------------------------------------------------------------------

constexpr int kCeThreads = 256;

// (m, s): a running max and the sum of exp(x - m). Combining is exact for an empty side
// (m = -inf, s = 0), where exp(-inf - -inf) would be NaN.
struct MaxSum {
  float m;
  float s;
};
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  if (b.m > a.m) {
    const MaxSum t = a;
    a = b;
    b = t;
  }
  if (b.s != 0.0f) a.s += b.s * expf(b.m - a.m);
  return a;
}

// logits (N,Vp) -> lse (N), losses (N); one block per row.
template <typename T>
__global__ void crossentropy_forward_kernel(In<T> logits, const std::int32_t* targets, i64 vocab,
                                            float* losses, float* lse, i64 n, i64 vp) {
  __shared__ MaxSum warps[kCeThreads / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (i64 r = blockIdx.x; r < n; r += gridDim.x) {
    const i64 base = r * vp;
    MaxSum acc{-INFINITY, 0.0f};
    for (i64 j = threadIdx.x; j < vocab; j += blockDim.x) {
      const float x = logits(base + j);
      if (x > acc.m) {
        acc.s = acc.s * expf(acc.m - x) + 1.0f;
        acc.m = x;
      } else if (x != -INFINITY) {
        // Review fix: a -inf logit adds exp(-inf) = 0; with acc.m still -inf (the thread's
        // first logits all -inf) exp(-inf - -inf) would be NaN where the CPU gives a finite lse.
        acc.s += expf(x - acc.m);
      }
    }
    for (int off = kWarp / 2; off > 0; off /= 2) {
      const MaxSum o{__shfl_down_sync(kFull, acc.m, off), __shfl_down_sync(kFull, acc.s, off)};
      acc = combine(acc, o);
    }
    if (lane == 0) warps[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      MaxSum total = warps[0];
      for (int w = 1; w < kCeThreads / kWarp; ++w) total = combine(total, warps[w]);
      const std::int32_t y = targets[r];
      if (y < 0 || y >= vocab) __trap();
      const float l = total.m + logf(total.s);
      lse[r] = l;
      losses[r] = l - logits(base + y);
    }
    __syncthreads();  // warps[] is reused by the next row
  }
}

// dlogits[r, j] = g (exp(logits[r, j] - lse[r]) - [j == y]) for j < V, 0 for j >= V.
template <typename T>
__global__ void crossentropy_backward_kernel(In<T> logits, const float* lse,
                                             const std::int32_t* targets, i64 vocab, float dloss,
                                             const float* dlosses, Out<T> dlogits, i64 n, i64 vp) {
  for (i64 r = blockIdx.x; r < n; r += gridDim.x) {
    const std::int32_t y = targets[r];
    if (y < 0 || y >= vocab) __trap();
    const float g = dloss * (dlosses != nullptr ? dlosses[r] : 1.0f);
    const float l = lse[r];
    const i64 base = r * vp;
    for (i64 j = threadIdx.x; j < vp; j += blockDim.x) {
      float v = 0.0f;
      if (j < vocab) {
        v = g * expf(logits(base + j) - l);
        if (j == y) v -= g;
      }
      dlogits(base + j, v);
    }
  }
}

// ---- AdamW ---------------------------------------------------------------------------------

// core/adamw.h step 2, one operation per statement, each with an explicitly rounded intrinsic
// so nvcc's -fmad contraction cannot fuse anything the specification does not.
__global__ void adamw_kernel(AdamWConstants k, float* param, In<Dyn> grad, float* exp_avg,
                             float* exp_avg_sq, void* param_out, int out_dt, i64 n) {
  for (i64 i = global_index(); i < n; i += global_stride()) {
    const float g = __fmul_rn(grad(i), k.grad_scale);
    const float m = __fmaf_rn(k.beta1, exp_avg[i], __fmul_rn(k.one_minus_beta1, g));
    const float t = __fmul_rn(k.one_minus_beta2, g);
    const float v = __fmaf_rn(k.beta2, exp_avg_sq[i], __fmul_rn(t, g));
    const float d = __fmaf_rn(__fsqrt_rn(v), k.inv_bc2_sqrt, k.eps);
    const float u = __fdiv_rn(m, d);
    const float pd = __fmul_rn(param[i], k.decay);
    const float p = __fmaf_rn(k.neg_step_size, u, pd);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p;
    if (param_out != nullptr) store_code(param_out, out_dt, i, p);
  }
}

}  // namespace

// ---- launchers -----------------------------------------------------------------------------

cudaError_t launch_embedding_forward(const std::int32_t* tokens, const void* wte, int wte_dt,
                                     const void* wpe, int wpe_dt, void* out, int out_dt,
                                     std::int64_t b, std::int64_t t, std::int64_t c,
                                     std::int64_t vocab, cudaStream_t stream) {
  const i64 bt = b * t;
  if (bt == 0 || c == 0) return cudaSuccess;
  const int threads = c >= kThreads ? kThreads : 128;
  return dispatch({wte_dt, wpe_dt, out_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    embedding_forward_kernel<T><<<grid_for(bt, 1), threads, 0, stream>>>(
        tokens, In<T>::make(wte, wte_dt), In<T>::make(wpe, wpe_dt), Out<T>::make(out, out_dt), bt,
        t, c, vocab);
    return cudaGetLastError();
  });
}

cudaError_t embedding_backward_scratch_bytes(std::int64_t n, std::int64_t vocab,
                                             std::size_t* bytes) {
  EmbeddingScratch s;
  const cudaError_t e = embedding_scratch_layout(n, vocab, &s);
  *bytes = s.total;
  return e;
}

cudaError_t launch_embedding_backward(const void* dout, int dout_dt, const std::int32_t* tokens,
                                      float* dwte, float* dwpe, std::int64_t b, std::int64_t t,
                                      std::int64_t c, std::int64_t vocab, void* scratch,
                                      std::size_t scratch_bytes, cudaStream_t stream) {
  const i64 n = b * t;
  if (n == 0 || c == 0) return cudaSuccess;
  if (n > INT32_MAX || vocab > INT32_MAX) return cudaErrorInvalidValue;  // int32 positions
  EmbeddingScratch s;
  cudaError_t e = embedding_scratch_layout(n, vocab, &s);
  if (e != cudaSuccess) return e;
  if (scratch_bytes < s.total) return cudaErrorInvalidValue;
  char* base = static_cast<char*>(scratch);
  auto* keys = reinterpret_cast<std::uint32_t*>(base + s.keys);
  auto* pos_in = reinterpret_cast<std::int32_t*>(base + s.pos_in);
  auto* pos_out = reinterpret_cast<std::int32_t*>(base + s.pos_out);

  embedding_prepare_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(tokens, pos_in, n,
                                                                           vocab);
  MEMFIT_RETURN_IF_LAUNCH_FAILED();
  // Stable: equal ids keep their positions' (b,t) order. Ids are checked above (a trap stops
  // the stream before the sort runs), so they are < 2^id_bits.
  std::size_t temp = s.temp_bytes;
  e = cub::DeviceRadixSort::SortPairs(base + s.temp, temp,
                                      reinterpret_cast<const std::uint32_t*>(tokens), keys, pos_in,
                                      pos_out, n, 0, id_bits(vocab), stream);
  if (e != cudaSuccess) return e;
  MEMFIT_RETURN_IF_LAUNCH_FAILED();
  const int threads = c >= kThreads ? kThreads : 128;
  const i64 col_tiles = (c + threads - 1) / threads;
  if (col_tiles > 65535) return cudaErrorInvalidValue;  // gridDim.y; C > 16M columns
  return dispatch({dout_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(grid_for(n, 1), static_cast<unsigned>(col_tiles));
    embedding_dwte_kernel<T>
        <<<grid, threads, 0, stream>>>(In<T>::make(dout, dout_dt), keys, pos_out, dwte, n, c);
    MEMFIT_RETURN_IF_LAUNCH_FAILED();
    if (dwpe == nullptr) return cudaSuccess;  // no position table
    embedding_dwpe_kernel<T><<<grid_for(t * c, kThreads), kThreads, 0, stream>>>(
        In<T>::make(dout, dout_dt), dwpe, b, t, c);
    return cudaGetLastError();
  });
}

cudaError_t launch_crossentropy_forward(const void* logits, int logits_dt,
                                        const std::int32_t* targets, std::int64_t vocab,
                                        float* losses, float* lse, std::int64_t n, std::int64_t vp,
                                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch({logits_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    crossentropy_forward_kernel<T><<<grid_for(n, 1), kCeThreads, 0, stream>>>(
        In<T>::make(logits, logits_dt), targets, vocab, losses, lse, n, vp);
    return cudaGetLastError();
  });
}

cudaError_t launch_crossentropy_backward(const void* logits, int logits_dt, const float* lse,
                                         const std::int32_t* targets, std::int64_t vocab,
                                         float dloss, const float* dlosses, void* dlogits,
                                         int dlogits_dt, std::int64_t n, std::int64_t vp,
                                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch({logits_dt, dlogits_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    crossentropy_backward_kernel<T><<<grid_for(n, 1), kCeThreads, 0, stream>>>(
        In<T>::make(logits, logits_dt), lse, targets, vocab, dloss, dlosses,
        Out<T>::make(dlogits, dlogits_dt), n, vp);
    return cudaGetLastError();
  });
}

cudaError_t launch_adamw(const AdamWConstants& k, float* param, const void* grad, int grad_dt,
                         float* exp_avg, float* exp_avg_sq, void* param_out, int out_dt,
                         std::int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      k, param, In<Dyn>::make(grad, grad_dt), exp_avg, exp_avg_sq, param_out, out_dt, n);
  return cudaGetLastError();
}

}  // namespace memfit::cuda
