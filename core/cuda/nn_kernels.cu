// The CUDA backend's neural-network kernels (launchers declared in nn_kernels.h).
//
// Layout of the work, op by op (shapes llm.c-style, N rows of C columns):
// - elementwise (GELU, add, AdamW): one thread per element, grid-stride.
// - row-wise (layernorm, causal softmax): one warp per row; the row is read once per pass
//   (mean / variance / output; max / sum / output), so it stays in L1/L2 between passes.
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
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <initializer_list>

#include "core/cuda/nn_kernels.h"

namespace memfit::cuda {
namespace {

using i64 = std::int64_t;

constexpr int kThreads = 256;  // threads per block for elementwise and row-per-warp kernels
constexpr int kWarp = 32;
constexpr i64 kMaxGrid = i64{1} << 20;  // grid-stride beyond this many blocks
constexpr unsigned kFull = 0xffffffffu;

// GPT-2's GELU constants, as the CPU reference (core/cpu/nn_ops.cpp).
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

// ---- element access ------------------------------------------------------------------------

struct Dyn {};  // "each operand's dtype is in its code"

__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T narrow(float v);
template <>
__device__ __forceinline__ float narrow<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half narrow<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float load_code(const void* p, int dt, i64 i) {
  if (dt == kCodeF32) return static_cast<const float*>(p)[i];
  if (dt == kCodeF16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

__device__ __forceinline__ void store_code(void* p, int dt, i64 i, float v) {
  if (dt == kCodeF32) {
    static_cast<float*>(p)[i] = v;
  } else if (dt == kCodeF16) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  } else {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  }
}

// In<T>: a read-only operand, In<T>(i) is element i widened to float. Out<T>: a written one.
template <typename T>
struct In {
  const T* p;
  __device__ __forceinline__ float operator()(i64 i) const { return widen(p[i]); }
  static In make(const void* q, int) { return {static_cast<const T*>(q)}; }
};
template <>
struct In<Dyn> {
  const void* p;
  int dt;
  __device__ __forceinline__ float operator()(i64 i) const { return load_code(p, dt, i); }
  static In make(const void* q, int code) { return {q, code}; }
};

template <typename T>
struct Out {
  T* p;
  __device__ __forceinline__ float get(i64 i) const { return widen(p[i]); }
  __device__ __forceinline__ void operator()(i64 i, float v) const { p[i] = narrow<T>(v); }
  static Out make(void* q, int) { return {static_cast<T*>(q)}; }
};
template <>
struct Out<Dyn> {
  void* p;
  int dt;
  __device__ __forceinline__ float get(i64 i) const { return load_code(p, dt, i); }
  __device__ __forceinline__ void operator()(i64 i, float v) const { store_code(p, dt, i, v); }
  static Out make(void* q, int code) { return {q, code}; }
};

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) with T the element type every code in `codes` names, or Dyn when they
// differ. f returns cudaError_t.
template <typename F>
cudaError_t dispatch(std::initializer_list<int> codes, F&& f) {
  const int first = *codes.begin();
  for (int c : codes) {
    if (c != first) return f(Tag<Dyn>{});
  }
  if (first == kCodeF32) return f(Tag<float>{});
  if (first == kCodeF16) return f(Tag<__half>{});
  return f(Tag<__nv_bfloat16>{});
}

unsigned grid_for(i64 work, i64 per_block) {
  const i64 blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

__device__ __forceinline__ i64 global_index() {
  return static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ i64 global_stride() { return static_cast<i64>(gridDim.x) * blockDim.x; }

// Butterfly sums: every lane ends with the same bits (a + b == b + a exactly in IEEE).
__device__ __forceinline__ float warp_sum(float v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(kFull, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

// The warp-per-row loop: r runs over [0, rows), the same r in every lane of a warp.
#define MEMFIT_FOR_WARP_ROWS(r, rows)                                                     \
  for (i64 r = static_cast<i64>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp; \
       r < (rows); r += static_cast<i64>(gridDim.x) * (blockDim.x / kWarp))

#define MEMFIT_RETURN_IF_LAUNCH_FAILED()       \
  do {                                         \
    const cudaError_t e_ = cudaGetLastError(); \
    if (e_ != cudaSuccess) return e_;          \
  } while (0)

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

constexpr std::size_t kScratchAlign = 256;
std::size_t align_up(std::size_t b) {
  return (b + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
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

// ---- embeddings ----------------------------------------------------------------------------

// One block per position i of (B,T): out[i,:] = wte[tokens[i],:] + wpe[i % T,:].
template <typename T>
__global__ void embedding_forward_kernel(const std::int32_t* tokens, In<T> wte, In<T> wpe,
                                         Out<T> out, i64 bt, i64 t, i64 c, i64 vocab) {
  for (i64 i = blockIdx.x; i < bt; i += gridDim.x) {
    const std::int32_t tok = tokens[i];
    if (tok < 0 || tok >= vocab) __trap();  // ids are data: see core/backend.h
    const i64 we = static_cast<i64>(tok) * c, pe = (i % t) * c;
    for (i64 j = threadIdx.x; j < c; j += blockDim.x) out(i * c + j, wte(we + j) + wpe(pe + j));
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
