// The CUDA backend's neural-network kernels (launchers declared in nn_kernels.h): this file
// has the row and elementwise ops; embeddings, cross-entropy and AdamW are in loss_kernels.cu,
// and the device helpers both use in nn_kernel_util.cuh.
//
// Layout of the work, op by op (shapes llm.c-style, N rows of C columns):
// - elementwise (GELU, add, AdamW): one thread per element, grid-stride.
// - row-wise (layernorm, RMSNorm, causal softmax): one warp per row; the row is read once per
//   pass (mean / variance / output; max / sum / output), so it stays in L1/L2 between passes.
// - RoPE: a block per token row; its cos / sin computed once into shared memory, then applied
//   to every q and k head. SwiGLU: a thread per (row, column) of the (N,F) output.
// - cross-entropy: one 256-thread block per row of the (padded) vocabulary, an online
//   max-and-sum per thread (Milakov & Gimelshein, "Online normalizer calculation for
//   softmax", 2018), combined in a fixed tree.
// - column sums (dweight, dbias): two stages, never float atomics: (1) a block per (32-column
//   tile, chunk of rows) writes the chunk's partial sums, (2) one thread per column adds the
//   partials in chunk order into the f32 gradient. The chunking depends on N only.
// - embedding gradient: the token ids are sorted (CUB's stable radix sort, positions as
//   values), so each vocabulary row's occurrences appear in (b,t) order; one thread per
//   (distinct token, column) adds them into dwte one by one, as the CPU loop does.
//
// Types. Every operand is f32, f16 or bf16, chosen at run time. Kernels are templated on one
// element type T used by every tensor operand when they all share it (the common case: the
// whole model in one activation dtype), and instantiated once more with T = Dyn, where each
// operand carries its dtype code and loads/stores switch on it. Four instantiations per kernel
// instead of 3^k for k operands keep nvcc's time and the binary small; the mixed-dtype path
// costs a uniform branch per access. f32 statistics and gradients are plain float*.
//
// In place: where core/backend.h allows out == in, every element is read and then written
// by the same thread, and nothing reads it afterwards, so no __restrict__ and no hazard.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/cuda/nn_kernel_util.cuh"
#include "core/cuda/nn_kernels.h"

namespace memfit::cuda {
namespace {

// ---- layernorm -----------------------------------------------------------------------------

// inp (N,C), weight (C), bias (C) -> out (N,C), mean (N), rstd (N); one warp per row.
template <typename T>
__global__ void layernorm_forward_kernel(In<T> inp, In<T> weight, In<T> bias, float eps, Out<T> out,
                                         float* mean, float* rstd, i64 n, i64 c) {
  const int lane = threadIdx.x % kWarp;
  const float fc = static_cast<float>(c);
  MEMFIT_FOR_WARP_ROWS(r, n) {
    const i64 base = r * c;
    float s = 0.0f;
    for (i64 j = lane; j < c; j += kWarp) s += inp(base + j);
    const float m = warp_sum(s) / fc;
    float ss = 0.0f;
    for (i64 j = lane; j < c; j += kWarp) {
      const float d = inp(base + j) - m;
      ss += d * d;
    }
    const float rs = 1.0f / sqrtf(warp_sum(ss) / fc + eps);  // biased variance
    for (i64 j = lane; j < c; j += kWarp) {
      out(base + j, (inp(base + j) - m) * rs * weight(j) + bias(j));
    }
    if (lane == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

// dinp (N,C) += rstd * (g - mean(g) - norm * mean(g * norm)), g = weight * dout,
// norm = (inp - mean) * rstd; one warp per row.
template <typename T>
__global__ void layernorm_dinp_kernel(In<T> dout, In<T> inp, In<T> weight, const float* mean,
                                      const float* rstd, Out<T> dinp, i64 n, i64 c) {
  const int lane = threadIdx.x % kWarp;
  const float fc = static_cast<float>(c);
  MEMFIT_FOR_WARP_ROWS(r, n) {
    const i64 base = r * c;
    const float mu = mean[r], rs = rstd[r];
    float sg = 0.0f, sgn = 0.0f;
    for (i64 j = lane; j < c; j += kWarp) {
      const float g = weight(j) * dout(base + j);
      sg += g;
      sgn += g * ((inp(base + j) - mu) * rs);
    }
    const float mg = warp_sum(sg) / fc;
    const float mgn = warp_sum(sgn) / fc;
    for (i64 j = lane; j < c; j += kWarp) {
      const float norm = (inp(base + j) - mu) * rs;
      const float g = weight(j) * dout(base + j);
      dinp(base + j, dinp.get(base + j) + rs * (g - mg - norm * mgn));
    }
  }
}

// ---- column sums: dbias, and dweight of layernorm --------------------------------------------

constexpr int kColTile = 32;       // columns per block (one per lane: coalesced row reads)
constexpr int kRowLanes = 8;       // rows a block reads at once
constexpr i64 kChunkRows = 256;    // rows per chunk, unless N needs more than kMaxChunks chunks
constexpr i64 kMaxChunks = 65535;  // gridDim.y's limit

struct ChunkPlan {
  i64 chunks = 0;
  i64 rows = 0;  // per chunk
};

// Depends on N only, so the summation order (and the bits) do not depend on anything else.
ChunkPlan chunk_plan(i64 n) {
  ChunkPlan p;
  if (n == 0) return p;
  p.chunks = (n + kChunkRows - 1) / kChunkRows;
  if (p.chunks > kMaxChunks) p.chunks = kMaxChunks;
  p.rows = (n + p.chunks - 1) / p.chunks;
  p.chunks = (n + p.rows - 1) / p.rows;
  return p;
}

// The end of a one-sum partials kernel: each of the block's kRowLanes rows of threads leaves
// its running sum `aw` in sw; row 0 adds the lanes in order and stores the column's chunk sum at
// *dst (valid: the thread has a column). Every thread of the block must call it.
__device__ void store_chunk_sum(float (&sw)[kRowLanes][kColTile + 1], float aw, bool valid,
                                float* dst) {
  sw[threadIdx.y][threadIdx.x] = aw;
  __syncthreads();
  if (threadIdx.y == 0 && valid) {
    float tw = 0.0f;
    for (int k = 0; k < kRowLanes; ++k) tw += sw[k][threadIdx.x];
    *dst = tw;
  }
}

// Stage 1. Block (x: column tile, y: chunk) of kColTile x kRowLanes threads:
//   part_b[chunk, col] = sum of dout[r, col] over the chunk's rows,
//   part_w[chunk, col] = sum of dout[r, col] * ((inp[r, col] - mean[r]) * rstd[r])  (kNorm).
// Each thread sums rows ty, ty + 8, ... of the chunk; the 8 lanes' sums are added in order.
template <typename T, bool kNorm>
__global__ void column_partials_kernel(In<T> dout, In<T> inp, const float* mean, const float* rstd,
                                       float* part_w, float* part_b, i64 n, i64 c,
                                       i64 rows_per_chunk) {
  __shared__ float sw[kRowLanes][kColTile + 1];
  __shared__ float sb[kRowLanes][kColTile + 1];
  const i64 col = static_cast<i64>(blockIdx.x) * kColTile + threadIdx.x;
  const i64 chunk = blockIdx.y;
  const i64 r0 = chunk * rows_per_chunk;
  const i64 r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
  float aw = 0.0f, ab = 0.0f;
  if (col < c) {
    for (i64 r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const float d = dout(r * c + col);
      ab += d;
      if (kNorm) aw += d * ((inp(r * c + col) - mean[r]) * rstd[r]);
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    float tw = 0.0f, tb = 0.0f;
    for (int k = 0; k < kRowLanes; ++k) {
      tw += sw[k][threadIdx.x];
      tb += sb[k][threadIdx.x];
    }
    part_b[chunk * c + col] = tb;
    if (kNorm) part_w[chunk * c + col] = tw;
  }
}

// Stage 2: dst[col] += sum over chunks of part[chunk, col], in chunk order. dst2/part2 may be
// null (bias only).
__global__ void column_finish_kernel(const float* part, float* dst, const float* part2, float* dst2,
                                     i64 chunks, i64 c) {
  for (i64 col = global_index(); col < c; col += global_stride()) {
    float s = 0.0f;
    for (i64 k = 0; k < chunks; ++k) s += part[k * c + col];
    dst[col] += s;
    if (part2 != nullptr) {
      float s2 = 0.0f;
      for (i64 k = 0; k < chunks; ++k) s2 += part2[k * c + col];
      dst2[col] += s2;
    }
  }
}

// ---- Llama-family ops: RMSNorm, rotary embeddings, SwiGLU -----------------------------------
// Each performs the CPU reference's operations in its order (core/cpu/nn_ops.cpp, run_rope in
// core/cpu/attention_ops.cpp); the results differ only by the reductions' order and precision
// (FP32 warp sums here, double there), nvcc's FMA contraction, and expf / cosf / sinf against
// the host's libm.

// inp (N,C), weight (C) -> out (N,C) = (inp * rstd) * weight, rstd (N); one warp per row.
template <typename T>
__global__ void rmsnorm_forward_kernel(In<T> inp, In<T> weight, float eps, Out<T> out, float* rstd,
                                       i64 n, i64 c) {
  const int lane = threadIdx.x % kWarp;
  const float fc = static_cast<float>(c);
  MEMFIT_FOR_WARP_ROWS(r, n) {
    const i64 base = r * c;
    float ss = 0.0f;
    for (i64 j = lane; j < c; j += kWarp) {
      const float x = inp(base + j);
      ss += x * x;
    }
    const float rs = 1.0f / sqrtf(warp_sum(ss) / fc + eps);
    for (i64 j = lane; j < c; j += kWarp) out(base + j, inp(base + j) * rs * weight(j));
    if (lane == 0) rstd[r] = rs;
  }
}

// dinp (N,C) += rstd * (g - norm * mean(g * norm)), g = weight * dout, norm = inp * rstd;
// one warp per row.
template <typename T>
__global__ void rmsnorm_dinp_kernel(In<T> dout, In<T> inp, In<T> weight, const float* rstd,
                                    Out<T> dinp, i64 n, i64 c) {
  const int lane = threadIdx.x % kWarp;
  const float fc = static_cast<float>(c);
  MEMFIT_FOR_WARP_ROWS(r, n) {
    const i64 base = r * c;
    const float rs = rstd[r];
    float sgn = 0.0f;
    for (i64 j = lane; j < c; j += kWarp) sgn += weight(j) * dout(base + j) * (inp(base + j) * rs);
    const float mgn = warp_sum(sgn) / fc;
    for (i64 j = lane; j < c; j += kWarp) {
      const float norm = inp(base + j) * rs;
      const float g = weight(j) * dout(base + j);
      dinp(base + j, dinp.get(base + j) + rs * (g - norm * mgn));
    }
  }
}

// Stage 1 of dweight (C) += sum over rows of dout * (inp * rstd): column_partials_kernel's
// blocks, chunks and summation order, without the bias sums:
//   part[chunk, col] = sum of dout[r, col] * (inp[r, col] * rstd[r]) over the chunk's rows.
// Stage 2 is column_finish_kernel.
template <typename T>
__global__ void rmsnorm_dweight_partials_kernel(In<T> dout, In<T> inp, const float* rstd,
                                                float* part, i64 n, i64 c, i64 rows_per_chunk) {
  __shared__ float sw[kRowLanes][kColTile + 1];
  const i64 col = static_cast<i64>(blockIdx.x) * kColTile + threadIdx.x;
  const i64 chunk = blockIdx.y;
  const i64 r0 = chunk * rows_per_chunk;
  const i64 r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
  float aw = 0.0f;
  if (col < c) {
    for (i64 r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      aw += dout(r * c + col) * (inp(r * c + col) * rstd[r]);
    }
  }
  store_chunk_sum(sw, aw, col < c, &part[chunk * c + col]);
}

// Per-head RMSNorm of the q and k heads (Qwen3's q_norm / k_norm): head r = token * qk + h,
// h < qk = H + G, at qkv[token * row_len + h * hs]; one warp per head, as rmsnorm_forward_kernel.
// Each lane reads then writes its own columns, so qkv is normed in place.
struct QkDims {
  i64 n;        // B * T * (H + G) heads to norm
  i64 qk;       // H + G
  i64 heads;    // H: heads below it use q_weight
  i64 hs;       // head size
  i64 row_len;  // (H + 2G) * hs
  __device__ i64 offset(i64 r) const { return (r / qk) * row_len + (r % qk) * hs; }
};

template <typename T>
__global__ void qk_norm_forward_kernel(Out<T> qkv, In<T> q_weight, In<T> k_weight, float eps,
                                       Out<T> qk_in, float* rstd, QkDims d) {
  const int lane = threadIdx.x % kWarp;
  const float fc = static_cast<float>(d.hs);
  MEMFIT_FOR_WARP_ROWS(r, d.n) {
    const i64 off = d.offset(r);
    const In<T> w = r % d.qk < d.heads ? q_weight : k_weight;
    float ss = 0.0f;
    for (i64 j = lane; j < d.hs; j += kWarp) {
      const float x = qkv.get(off + j);
      qk_in(r * d.hs + j, x);
      ss += x * x;
    }
    const float rs = 1.0f / sqrtf(warp_sum(ss) / fc + eps);
    for (i64 j = lane; j < d.hs; j += kWarp) qkv(off + j, qkv.get(off + j) * rs * w(j));
    if (lane == 0) rstd[r] = rs;
  }
}

// dqkv's q and k heads in place: g = weight * dout, norm = qk_in * rstd,
// d = rstd * (g - norm * mean(g * norm)); one warp per head.
template <typename T>
__global__ void qk_norm_dinp_kernel(Out<T> dqkv, In<T> qk_in, In<T> q_weight, In<T> k_weight,
                                    const float* rstd, QkDims d) {
  const int lane = threadIdx.x % kWarp;
  const float fc = static_cast<float>(d.hs);
  MEMFIT_FOR_WARP_ROWS(r, d.n) {
    const i64 off = d.offset(r), in = r * d.hs;
    const In<T> w = r % d.qk < d.heads ? q_weight : k_weight;
    const float rs = rstd[r];
    float sgn = 0.0f;
    for (i64 j = lane; j < d.hs; j += kWarp) sgn += w(j) * dqkv.get(off + j) * (qk_in(in + j) * rs);
    const float mgn = warp_sum(sgn) / fc;
    for (i64 j = lane; j < d.hs; j += kWarp) {
      const float norm = qk_in(in + j) * rs;
      const float g = w(j) * dqkv.get(off + j);
      dqkv(off + j, rs * (g - norm * mgn));
    }
  }
}

// Stage 1 of one weight's gradient (hs) += sum of dout * (qk_in * rstd) over the `count` heads
// from `first` of every token, rows i = token * count + (h - first) in that order, chunked as
// rmsnorm_dweight_partials_kernel (part[chunk, col]). Stage 2 is column_finish_kernel.
template <typename T>
__global__ void qk_norm_dweight_partials_kernel(In<T> dqkv, In<T> qk_in, const float* rstd,
                                                float* part, QkDims d, i64 first, i64 count,
                                                i64 rows, i64 rows_per_chunk) {
  __shared__ float sw[kRowLanes][kColTile + 1];
  const i64 col = static_cast<i64>(blockIdx.x) * kColTile + threadIdx.x;
  const i64 chunk = blockIdx.y;
  const i64 r0 = chunk * rows_per_chunk;
  const i64 r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float aw = 0.0f;
  if (col < d.hs) {
    for (i64 i = r0 + threadIdx.y; i < r1; i += kRowLanes) {
      const i64 r = (i / count) * d.qk + first + i % count;
      aw += dqkv(d.offset(r) + col) * (qk_in(r * d.hs + col) * rstd[r]);
    }
  }
  store_chunk_sum(sw, aw, col < d.hs, &part[chunk * d.hs + col]);
}

// RopeFreqs (core/backend.h) as a by-value kernel parameter: 516 bytes of the 4 KB that kernel
// parameters may take, read from the constant bank, so no device buffer and no copy to queue.
struct RopeParams {
  int half;
  float inv_freq[kRopeMaxHalf];
};

// qkv (B*T rows of (H+2G)*hs) in place, the first H + G heads (q, then k) of each row.
// Block (x: pair i < half of a head, y: head slot) per row, grid-stride over rows: the y = 0
// threads put the row's cos a_i and (+-)sin a_i, a_i = f32(row % T) * inv_freq[i], in shared
// memory (one cosf / sinf per pair per row, not per head); then thread (i, y) rotates
// (e[i], e[i + half]) of heads y, y + blockDim.y, ...; each element is read, then written, by
// one thread.
template <typename T>
__global__ void rope_kernel(Out<T> qkv, RopeParams f, i64 rows, i64 t, i64 qk_heads, i64 row_len,
                            bool inverse) {
  __shared__ float cs[kRopeMaxHalf];
  __shared__ float sn[kRopeMaxHalf];
  const int i = static_cast<int>(threadIdx.x);
  const int half = f.half;
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    if (threadIdx.y == 0 && i < half) {
      const float a = static_cast<float>(r % t) * f.inv_freq[i];
      const float s = sinf(a);
      cs[i] = cosf(a);
      sn[i] = inverse ? -s : s;
    }
    __syncthreads();
    if (i < half) {
      for (i64 h = threadIdx.y; h < qk_heads; h += blockDim.y) {
        const i64 off = r * row_len + h * 2 * half + i;
        const float x = qkv.get(off), y = qkv.get(off + half);
        qkv(off, x * cs[i] - y * sn[i]);
        qkv(off + half, y * cs[i] + x * sn[i]);
      }
    }
    __syncthreads();  // every thread is done with this row's cs / sn before they change
  }
}

// gate_up (N,2F) -> out (N,F) = g / (1 + exp(-g)) * u; x over a row's F columns, y
// (grid-stride) over rows, as add_bias_kernel.
template <typename T>
__global__ void swiglu_forward_kernel(In<T> gate_up, Out<T> out, i64 n, i64 f) {
  const i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= f) return;
  for (i64 r = blockIdx.y; r < n; r += gridDim.y) {
    const float g = gate_up(r * 2 * f + j), u = gate_up(r * 2 * f + f + j);
    out(r * f + j, g / (1.0f + expf(-g)) * u);
  }
}

// dout (N,F), gate_up (N,2F) -> dgate_up (N,2F): s = sigmoid(g),
// dg = dout * u * s * (1 + g (1 - s)), du = dout * g * s.
template <typename T>
__global__ void swiglu_backward_kernel(In<T> dout, In<T> gate_up, Out<T> dgate_up, i64 n, i64 f) {
  const i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= f) return;
  for (i64 r = blockIdx.y; r < n; r += gridDim.y) {
    const i64 gi = r * 2 * f + j;
    const float g = gate_up(gi), u = gate_up(gi + f), d = dout(r * f + j);
    const float s = 1.0f / (1.0f + expf(-g));
    dgate_up(gi, d * u * s * (1.0f + g * (1.0f - s)));
    dgate_up(gi + f, d * g * s);
  }
}

// ---- elementwise ---------------------------------------------------------------------------

template <typename T>
__global__ void gelu_forward_kernel(In<T> inp, Out<T> out, i64 n) {
  for (i64 i = global_index(); i < n; i += global_stride()) {
    const float x = inp(i);
    out(i, 0.5f * x * (1.0f + tanhf(kGeluS * (x + kGeluA * x * x * x))));
  }
}

// gelu'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) s (1 + 3 a x^2), u = s (x + a x^3); the
// 1 - tanh^2 form (not sech^2) stays finite for large |x|, as the CPU reference.
template <typename T>
__global__ void gelu_backward_kernel(In<T> dout, In<T> inp, Out<T> dinp, i64 n) {
  for (i64 i = global_index(); i < n; i += global_stride()) {
    const float x = inp(i);
    const float th = tanhf(kGeluS * (x + kGeluA * x * x * x));
    const float local =
        0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluS * (1.0f + 3.0f * kGeluA * x * x);
    dinp(i, dout(i) * local);
  }
}

template <typename T>
__global__ void add_kernel(In<T> a, In<T> b, Out<T> out, i64 n) {
  for (i64 i = global_index(); i < n; i += global_stride()) out(i, a(i) + b(i));
}

// out (N,OC) += bias (OC): x over columns, y (grid-stride) over rows; no division per element.
template <typename T>
__global__ void add_bias_kernel(In<T> bias, Out<T> out, i64 n, i64 oc) {
  const i64 col = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= oc) return;
  const float b = bias(col);
  for (i64 r = blockIdx.y; r < n; r += gridDim.y) out(r * oc + col, out.get(r * oc + col) + b);
}

// ---- causal softmax ------------------------------------------------------------------------

// preatt (R*T rows of T) -> att; row r is row i = r % T of its matrix: columns [0, i] live.
template <typename T>
__global__ void softmax_causal_forward_kernel(In<T> preatt, float scale, Out<T> att, i64 rows,
                                              i64 t) {
  const int lane = threadIdx.x % kWarp;
  MEMFIT_FOR_WARP_ROWS(r, rows) {
    const i64 base = r * t, live = r % t + 1;
    float mx = -INFINITY;
    for (i64 j = lane; j < live; j += kWarp) mx = fmaxf(mx, scale * preatt(base + j));
    mx = warp_max(mx);
    float s = 0.0f;
    for (i64 j = lane; j < live; j += kWarp) s += expf(scale * preatt(base + j) - mx);
    const float inv = 1.0f / warp_sum(s);
    for (i64 j = lane; j < t; j += kWarp) {
      att(base + j, j < live ? expf(scale * preatt(base + j) - mx) * inv : 0.0f);
    }
  }
}

// dpreatt[j] = scale * att[j] * (datt[j] - sum_{k<=i} att[k] datt[k]) for j <= i, else 0.
template <typename T>
__global__ void softmax_causal_backward_kernel(In<T> datt, In<T> att, float scale, Out<T> dpreatt,
                                               i64 rows, i64 t) {
  const int lane = threadIdx.x % kWarp;
  MEMFIT_FOR_WARP_ROWS(r, rows) {
    const i64 base = r * t, live = r % t + 1;
    float dot = 0.0f;
    for (i64 j = lane; j < live; j += kWarp) dot += att(base + j) * datt(base + j);
    dot = warp_sum(dot);
    for (i64 j = lane; j < t; j += kWarp) {
      dpreatt(base + j, j < live ? scale * att(base + j) * (datt(base + j) - dot) : 0.0f);
    }
  }
}

// ---- head permutes -------------------------------------------------------------------------

// One block per row (b,t,p) of the packed (B,T,P,H,hs) layout; its H*hs elements map to
// (p,b,h,t,:) of the heads-first (P,B,H,T,hs) layout. split: packed -> heads-first.
template <typename T>
__global__ void permute_heads_kernel(In<T> src, Out<T> dst, i64 b, i64 t, i64 parts, i64 heads,
                                     i64 hs, bool split, bool narrow_div) {
  const i64 rows = b * t * parts, row_len = heads * hs;
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const i64 p = row % parts, tt = row / parts % t, bb = row / (parts * t);
    const i64 packed0 = row * row_len;
    const i64 hf0 = ((p * b + bb) * heads * t + tt) * hs;  // (p, bb, h=0, tt, 0)
    for (i64 k = threadIdx.x; k < row_len; k += blockDim.x) {
      // h = k / hs: 32-bit division when H*hs fits (the host checks), else 64-bit.
      const i64 h =
          narrow_div
              ? static_cast<i64>(static_cast<std::uint32_t>(k) / static_cast<std::uint32_t>(hs))
              : k / hs;
      const i64 hf = hf0 + h * t * hs + (k - h * hs);
      if (split) {
        dst(hf, src(packed0 + k));
      } else {
        dst(packed0 + k, src(hf));
      }
    }
  }
}

}  // namespace

// ---- launchers -----------------------------------------------------------------------------

cudaError_t launch_layernorm_forward(const void* inp, int inp_dt, const void* weight, int w_dt,
                                     const void* bias, int b_dt, float eps, void* out, int out_dt,
                                     float* mean, float* rstd, std::int64_t n, std::int64_t c,
                                     cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch({inp_dt, w_dt, b_dt, out_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    layernorm_forward_kernel<T><<<grid_for(n, kThreads / kWarp), kThreads, 0, stream>>>(
        In<T>::make(inp, inp_dt), In<T>::make(weight, w_dt), In<T>::make(bias, b_dt), eps,
        Out<T>::make(out, out_dt), mean, rstd, n, c);
    return cudaGetLastError();
  });
}

std::size_t layernorm_backward_scratch_bytes(std::int64_t n, std::int64_t c) {
  const ChunkPlan p = chunk_plan(n);
  return 2 * align_up(static_cast<std::size_t>(p.chunks * c) * sizeof(float));
}

cudaError_t launch_layernorm_backward(const void* dout, int dout_dt, const void* inp, int inp_dt,
                                      const void* weight, int w_dt, const float* mean,
                                      const float* rstd, void* dinp, int dinp_dt, float* dweight,
                                      float* dbias, std::int64_t n, std::int64_t c, void* scratch,
                                      cudaStream_t stream) {
  if (n == 0 || c == 0) return cudaSuccess;
  const ChunkPlan p = chunk_plan(n);
  float* part_w = static_cast<float*>(scratch);
  float* part_b = reinterpret_cast<float*>(static_cast<char*>(scratch) +
                                           align_up(static_cast<std::size_t>(p.chunks * c) * 4));
  const cudaError_t e = dispatch({dout_dt, inp_dt, w_dt, dinp_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    layernorm_dinp_kernel<T><<<grid_for(n, kThreads / kWarp), kThreads, 0, stream>>>(
        In<T>::make(dout, dout_dt), In<T>::make(inp, inp_dt), In<T>::make(weight, w_dt), mean, rstd,
        Out<T>::make(dinp, dinp_dt), n, c);
    MEMFIT_RETURN_IF_LAUNCH_FAILED();
    const dim3 grid(static_cast<unsigned>((c + kColTile - 1) / kColTile),
                    static_cast<unsigned>(p.chunks));
    column_partials_kernel<T, true><<<grid, dim3(kColTile, kRowLanes), 0, stream>>>(
        In<T>::make(dout, dout_dt), In<T>::make(inp, inp_dt), mean, rstd, part_w, part_b, n, c,
        p.rows);
    return cudaGetLastError();
  });
  if (e != cudaSuccess) return e;
  column_finish_kernel<<<grid_for(c, kThreads), kThreads, 0, stream>>>(part_w, dweight, part_b,
                                                                       dbias, p.chunks, c);
  return cudaGetLastError();
}

// ---- Llama-family launchers ----

cudaError_t launch_rmsnorm_forward(const void* inp, int inp_dt, const void* weight, int w_dt,
                                   float eps, void* out, int out_dt, float* rstd, std::int64_t n,
                                   std::int64_t c, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch({inp_dt, w_dt, out_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    rmsnorm_forward_kernel<T><<<grid_for(n, kThreads / kWarp), kThreads, 0, stream>>>(
        In<T>::make(inp, inp_dt), In<T>::make(weight, w_dt), eps, Out<T>::make(out, out_dt), rstd,
        n, c);
    return cudaGetLastError();
  });
}

std::size_t rmsnorm_backward_scratch_bytes(std::int64_t n, std::int64_t c) {
  const ChunkPlan p = chunk_plan(n);
  return align_up(static_cast<std::size_t>(p.chunks * c) * sizeof(float));
}

cudaError_t launch_rmsnorm_backward(const void* dout, int dout_dt, const void* inp, int inp_dt,
                                    const void* weight, int w_dt, const float* rstd, void* dinp,
                                    int dinp_dt, float* dweight, std::int64_t n, std::int64_t c,
                                    void* scratch, cudaStream_t stream) {
  if (n == 0 || c == 0) return cudaSuccess;
  const ChunkPlan p = chunk_plan(n);
  float* part = static_cast<float*>(scratch);
  const cudaError_t e = dispatch({dout_dt, inp_dt, w_dt, dinp_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    rmsnorm_dinp_kernel<T><<<grid_for(n, kThreads / kWarp), kThreads, 0, stream>>>(
        In<T>::make(dout, dout_dt), In<T>::make(inp, inp_dt), In<T>::make(weight, w_dt), rstd,
        Out<T>::make(dinp, dinp_dt), n, c);
    MEMFIT_RETURN_IF_LAUNCH_FAILED();
    const dim3 grid(static_cast<unsigned>((c + kColTile - 1) / kColTile),
                    static_cast<unsigned>(p.chunks));
    rmsnorm_dweight_partials_kernel<T><<<grid, dim3(kColTile, kRowLanes), 0, stream>>>(
        In<T>::make(dout, dout_dt), In<T>::make(inp, inp_dt), rstd, part, n, c, p.rows);
    return cudaGetLastError();
  });
  if (e != cudaSuccess) return e;
  column_finish_kernel<<<grid_for(c, kThreads), kThreads, 0, stream>>>(part, dweight, nullptr,
                                                                       nullptr, p.chunks, c);
  return cudaGetLastError();
}

namespace {
QkDims qk_dims(i64 b, i64 t, i64 heads, i64 kv_heads, i64 hs) {
  return QkDims{b * t * (heads + kv_heads), heads + kv_heads, heads, hs,
                (heads + 2 * kv_heads) * hs};
}
}  // namespace

cudaError_t launch_qk_norm_forward(void* qkv, int qkv_dt, const void* q_weight,
                                   const void* k_weight, int w_dt, float eps, void* qk_in,
                                   int qk_in_dt, float* rstd, std::int64_t b, std::int64_t t,
                                   std::int64_t heads, std::int64_t kv_heads, std::int64_t hs,
                                   cudaStream_t stream) {
  const QkDims d = qk_dims(b, t, heads, kv_heads, hs);
  if (d.n == 0) return cudaSuccess;
  return dispatch({qkv_dt, w_dt, qk_in_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    qk_norm_forward_kernel<T><<<grid_for(d.n, kThreads / kWarp), kThreads, 0, stream>>>(
        Out<T>::make(qkv, qkv_dt), In<T>::make(q_weight, w_dt), In<T>::make(k_weight, w_dt), eps,
        Out<T>::make(qk_in, qk_in_dt), rstd, d);
    return cudaGetLastError();
  });
}

std::size_t qk_norm_backward_scratch_bytes(std::int64_t b, std::int64_t t, std::int64_t heads,
                                           std::int64_t kv_heads, std::int64_t hs) {
  const ChunkPlan pq = chunk_plan(b * t * heads), pk = chunk_plan(b * t * kv_heads);
  return align_up(static_cast<std::size_t>(pq.chunks * hs) * sizeof(float)) +
         align_up(static_cast<std::size_t>(pk.chunks * hs) * sizeof(float));
}

cudaError_t launch_qk_norm_backward(void* dqkv, int dqkv_dt, const void* qk_in, int qk_in_dt,
                                    const float* rstd, const void* q_weight, const void* k_weight,
                                    int w_dt, float* dq_weight, float* dk_weight, std::int64_t b,
                                    std::int64_t t, std::int64_t heads, std::int64_t kv_heads,
                                    std::int64_t hs, void* scratch, cudaStream_t stream) {
  const QkDims d = qk_dims(b, t, heads, kv_heads, hs);
  if (d.n == 0) return cudaSuccess;
  const i64 tokens = b * t;
  const ChunkPlan pq = chunk_plan(tokens * heads), pk = chunk_plan(tokens * kv_heads);
  float* part_q = static_cast<float*>(scratch);
  float* part_k = reinterpret_cast<float*>(static_cast<char*>(scratch) +
                                           align_up(static_cast<std::size_t>(pq.chunks * hs) * 4));
  const unsigned tiles = static_cast<unsigned>((hs + kColTile - 1) / kColTile);
  const cudaError_t e = dispatch({dqkv_dt, qk_in_dt, w_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // The weight gradients read dqkv before the input gradient overwrites it (one stream).
    qk_norm_dweight_partials_kernel<T>
        <<<dim3(tiles, static_cast<unsigned>(pq.chunks)), dim3(kColTile, kRowLanes), 0, stream>>>(
            In<T>::make(dqkv, dqkv_dt), In<T>::make(qk_in, qk_in_dt), rstd, part_q, d, 0, heads,
            tokens * heads, pq.rows);
    MEMFIT_RETURN_IF_LAUNCH_FAILED();
    qk_norm_dweight_partials_kernel<T>
        <<<dim3(tiles, static_cast<unsigned>(pk.chunks)), dim3(kColTile, kRowLanes), 0, stream>>>(
            In<T>::make(dqkv, dqkv_dt), In<T>::make(qk_in, qk_in_dt), rstd, part_k, d, heads,
            kv_heads, tokens * kv_heads, pk.rows);
    MEMFIT_RETURN_IF_LAUNCH_FAILED();
    qk_norm_dinp_kernel<T><<<grid_for(d.n, kThreads / kWarp), kThreads, 0, stream>>>(
        Out<T>::make(dqkv, dqkv_dt), In<T>::make(qk_in, qk_in_dt), In<T>::make(q_weight, w_dt),
        In<T>::make(k_weight, w_dt), rstd, d);
    return cudaGetLastError();
  });
  if (e != cudaSuccess) return e;
  column_finish_kernel<<<grid_for(hs, kThreads), kThreads, 0, stream>>>(part_q, dq_weight, nullptr,
                                                                        nullptr, pq.chunks, hs);
  MEMFIT_RETURN_IF_LAUNCH_FAILED();
  column_finish_kernel<<<grid_for(hs, kThreads), kThreads, 0, stream>>>(part_k, dk_weight, nullptr,
                                                                        nullptr, pk.chunks, hs);
  return cudaGetLastError();
}

cudaError_t launch_rope(void* qkv, int qkv_dt, const float* inv_freq, std::int64_t half,
                        std::int64_t b, std::int64_t t, std::int64_t heads, std::int64_t kv_heads,
                        bool inverse, cudaStream_t stream) {
  const i64 rows = b * t;
  if (rows == 0) return cudaSuccess;
  if (half < 1 || half > kRopeMaxHalf) return cudaErrorInvalidValue;
  RopeParams f{};
  f.half = static_cast<int>(half);
  for (i64 i = 0; i < half; ++i) f.inv_freq[i] = inv_freq[i];
  const i64 qk_heads = heads + kv_heads, row_len = (heads + 2 * kv_heads) * 2 * half;
  // x: the pairs, rounded up to whole warps (at most 128); y: heads, up to kThreads in all.
  const int tx = static_cast<int>((half + kWarp - 1) / kWarp * kWarp);
  const i64 per_row = kThreads / tx;
  const dim3 block(static_cast<unsigned>(tx),
                   static_cast<unsigned>(qk_heads < per_row ? qk_heads : per_row));
  return dispatch({qkv_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    rope_kernel<T><<<grid_for(rows, 1), block, 0, stream>>>(Out<T>::make(qkv, qkv_dt), f, rows, t,
                                                            qk_heads, row_len, inverse);
    return cudaGetLastError();
  });
}

namespace {

// SwiGLU's launch shape: x over F (whole warps, at most kThreads), y over rows (gridDim.y's
// limit, grid-stride beyond).
struct ColRowGrid {
  dim3 grid, block;
};
ColRowGrid col_row_grid(i64 n, i64 f) {
  const i64 tx = f >= kThreads ? kThreads : (f + kWarp - 1) / kWarp * kWarp;
  const i64 rows = n < 65535 ? n : 65535;
  return {dim3(static_cast<unsigned>((f + tx - 1) / tx), static_cast<unsigned>(rows)),
          dim3(static_cast<unsigned>(tx))};
}

}  // namespace

cudaError_t launch_swiglu_forward(const void* gate_up, int gu_dt, void* out, int out_dt,
                                  std::int64_t n, std::int64_t f, cudaStream_t stream) {
  if (n == 0 || f == 0) return cudaSuccess;
  const ColRowGrid g = col_row_grid(n, f);
  return dispatch({gu_dt, out_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_forward_kernel<T><<<g.grid, g.block, 0, stream>>>(In<T>::make(gate_up, gu_dt),
                                                             Out<T>::make(out, out_dt), n, f);
    return cudaGetLastError();
  });
}

cudaError_t launch_swiglu_backward(const void* dout, int dout_dt, const void* gate_up, int gu_dt,
                                   void* dgate_up, int dgu_dt, std::int64_t n, std::int64_t f,
                                   cudaStream_t stream) {
  if (n == 0 || f == 0) return cudaSuccess;
  const ColRowGrid g = col_row_grid(n, f);
  return dispatch({dout_dt, gu_dt, dgu_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_backward_kernel<T><<<g.grid, g.block, 0, stream>>>(In<T>::make(dout, dout_dt),
                                                              In<T>::make(gate_up, gu_dt),
                                                              Out<T>::make(dgate_up, dgu_dt), n, f);
    return cudaGetLastError();
  });
}

cudaError_t launch_gelu_forward(const void* inp, int inp_dt, void* out, int out_dt, std::int64_t n,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch({inp_dt, out_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gelu_forward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        In<T>::make(inp, inp_dt), Out<T>::make(out, out_dt), n);
    return cudaGetLastError();
  });
}

cudaError_t launch_gelu_backward(const void* dout, int dout_dt, const void* inp, int inp_dt,
                                 void* dinp, int dinp_dt, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch({dout_dt, inp_dt, dinp_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gelu_backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        In<T>::make(dout, dout_dt), In<T>::make(inp, inp_dt), Out<T>::make(dinp, dinp_dt), n);
    return cudaGetLastError();
  });
}

cudaError_t launch_add(const void* a, int a_dt, const void* b, int b_dt, void* out, int out_dt,
                       std::int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch({a_dt, b_dt, out_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    add_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        In<T>::make(a, a_dt), In<T>::make(b, b_dt), Out<T>::make(out, out_dt), n);
    return cudaGetLastError();
  });
}

cudaError_t launch_add_bias(const void* bias, int bias_dt, void* out, int out_dt, std::int64_t n,
                            std::int64_t oc, cudaStream_t stream) {
  if (n == 0 || oc == 0) return cudaSuccess;
  // y: rows, at most 65535 blocks (gridDim.y's limit), grid-stride beyond.
  const unsigned rows = static_cast<unsigned>(n < 65535 ? n : 65535);
  const dim3 grid(static_cast<unsigned>((oc + kThreads - 1) / kThreads), rows);
  return dispatch({bias_dt, out_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    add_bias_kernel<T><<<grid, kThreads, 0, stream>>>(In<T>::make(bias, bias_dt),
                                                      Out<T>::make(out, out_dt), n, oc);
    return cudaGetLastError();
  });
}

std::size_t bias_backward_scratch_bytes(std::int64_t n, std::int64_t oc) {
  const ChunkPlan p = chunk_plan(n);
  return align_up(static_cast<std::size_t>(p.chunks * oc) * sizeof(float));
}

cudaError_t launch_bias_backward(const void* dout, int dout_dt, float* dbias, std::int64_t n,
                                 std::int64_t oc, void* scratch, cudaStream_t stream) {
  if (n == 0 || oc == 0) return cudaSuccess;
  const ChunkPlan p = chunk_plan(n);
  float* part = static_cast<float*>(scratch);
  const cudaError_t e = dispatch({dout_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>((oc + kColTile - 1) / kColTile),
                    static_cast<unsigned>(p.chunks));
    column_partials_kernel<T, false><<<grid, dim3(kColTile, kRowLanes), 0, stream>>>(
        In<T>::make(dout, dout_dt), In<T>::make(dout, dout_dt), nullptr, nullptr, nullptr, part, n,
        oc, p.rows);
    return cudaGetLastError();
  });
  if (e != cudaSuccess) return e;
  column_finish_kernel<<<grid_for(oc, kThreads), kThreads, 0, stream>>>(part, dbias, nullptr,
                                                                        nullptr, p.chunks, oc);
  return cudaGetLastError();
}

cudaError_t launch_softmax_causal_forward(const void* preatt, int in_dt, float scale, void* att,
                                          int att_dt, std::int64_t r, std::int64_t t,
                                          cudaStream_t stream) {
  const i64 rows = r * t;
  if (rows == 0) return cudaSuccess;
  return dispatch({in_dt, att_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_causal_forward_kernel<T><<<grid_for(rows, kThreads / kWarp), kThreads, 0, stream>>>(
        In<T>::make(preatt, in_dt), scale, Out<T>::make(att, att_dt), rows, t);
    return cudaGetLastError();
  });
}

cudaError_t launch_softmax_causal_backward(const void* datt, int datt_dt, const void* att,
                                           int att_dt, float scale, void* dpreatt, int out_dt,
                                           std::int64_t r, std::int64_t t, cudaStream_t stream) {
  const i64 rows = r * t;
  if (rows == 0) return cudaSuccess;
  return dispatch({datt_dt, att_dt, out_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_causal_backward_kernel<T><<<grid_for(rows, kThreads / kWarp), kThreads, 0, stream>>>(
        In<T>::make(datt, datt_dt), In<T>::make(att, att_dt), scale, Out<T>::make(dpreatt, out_dt),
        rows, t);
    return cudaGetLastError();
  });
}

cudaError_t launch_permute_heads(const void* src, int src_dt, void* dst, int dst_dt, std::int64_t b,
                                 std::int64_t t, std::int64_t parts, std::int64_t heads,
                                 std::int64_t hs, bool split, cudaStream_t stream) {
  const i64 rows = b * t * parts, row_len = heads * hs;
  if (rows == 0 || row_len == 0) return cudaSuccess;
  const bool narrow_div = row_len <= static_cast<i64>(UINT32_MAX);
  const int threads = row_len >= kThreads ? kThreads : 128;
  return dispatch({src_dt, dst_dt}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    permute_heads_kernel<T><<<grid_for(rows, 1), threads, 0, stream>>>(
        In<T>::make(src, src_dt), Out<T>::make(dst, dst_dt), b, t, parts, heads, hs, split,
        narrow_div);
    return cudaGetLastError();
  });
}

}  // namespace memfit::cuda
