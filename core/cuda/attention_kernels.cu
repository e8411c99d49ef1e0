// The CUDA backend's causal flash attention (launchers declared in attention_kernels.h): the
// FlashAttention-2 algorithm (Dao, "FlashAttention-2: Faster Attention with Better Parallelism
// and Work Partitioning", 2023) in plain FP32 CUDA-core arithmetic.
//
// Forward, one block per (query tile, batch * query head), grid-stride over them in x (B*H
// can pass gridDim.y's 65535), the tiles with the most keys first. Per query row a running
// max m and sum l (online softmax): for each tile of staged keys, s = scale * q.k (-inf where
// j > i), m' = max(m, max s), p = exp(s - m'), l = l * exp(m - m') + sum p,
// o = o * exp(m - m') + p @ v; at the end out = o / l, lse = m + log l. Key 0 is in every
// row's first tile, so m is finite after it and no row ever divides by 0.
// Backward, three kernels, none with atomics:
//   (1) delta[b,h,i] = dout . out, one warp per row;
//   (2) dK, dV: one block per (key tile, batch * kv head), looping over the group's query heads
//       and, for each, over the query tiles that see the key tile, in that fixed order;
//   (3) dQ: one block per (query tile, batch * query head), looping over key tiles j <= i.
// Both recompute p = exp(s - lse) from q, k and lse, and ds = scale * p * (dp - delta) with
// dp = dout . v; dv += p * dout, dk += ds * q, dq += ds * k.
//
// Threads and tiles, for head sizes up to kMaxHs (32, 64, 128 or 256: the kernels' template
// parameter, the smallest that holds hs; dimensions past hs are zeros in registers and shared
// memory). A block is 256 threads; kLanes consecutive threads (8, or 16 for kMaxHs = 256) share
// one row (a query row in the forward and dQ, a key row in dK/dV), each holding kMaxHs / kLanes
// of its head dimensions in registers (q and o; q, dout and dq; k, v, dk and dv), in float4
// chunks interleaved across the lanes so that one 16-byte shared-memory load serves each chunk
// without bank conflicts. A block owns 256 / kLanes rows (32 or 16) and stages the other side
// (K and V, or Q and dout) in shared memory kTile rows at a time (64, 64, 32, 16 rows for
// kMaxHs 32, 64, 128, 256), widened to FP32: 32 KiB of static shared memory per block
// (16 KiB for kMaxHs 32). Dot products are each lane's FMAs then a butterfly over the row's
// lanes (__shfl_xor_sync), which leaves the same bits in every lane.
//
// Numerics: FP32 FMAs on widened inputs, expf/logf (not the fast intrinsics); each output is
// rounded once to its dtype (round to nearest even). Padded query rows and key columns of
// partial tiles are zeros in shared memory and masked with a select (never a multiply, so an
// inf from exp of a masked score cannot become NaN); nothing of them is stored.
// Deterministic: every sum runs in a fixed order that depends on the shapes only.
//
// Not done (future work): tensor cores (WMMA / mma.sync / wgmma); the two score products and
// the two accumulations of each tile run on the FP32 CUDA cores. Also not done: splitting long
// rows across blocks, register tiling of the score products (every FMA here reads its operand
// from shared memory), and head-size instantiations between the powers of two (hs 80 or 96
// runs the 128 kernel on zero padding).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/cuda/attention_kernels.h"
#include "core/cuda/nn_kernel_util.cuh"

namespace memfit::cuda {
namespace {

constexpr int kBlock = 256;  // threads per block of the tiled kernels

// The tile geometry for head sizes up to kMaxHs.
template <int kMaxHs>
struct Geom {
  static constexpr int kLanes = kMaxHs <= 128 ? 8 : 16;  // threads sharing one row
  static constexpr int kPer = kMaxHs / kLanes;           // head dimensions per thread
  static constexpr int kChunks = kPer / 4;               // ... as float4 chunks
  static constexpr int kRows = kBlock / kLanes;          // rows a block owns
  static constexpr int kTile = 4096 / kMaxHs < 64 ? 4096 / kMaxHs : 64;  // rows staged at once
  static_assert(kPer % 4 == 0 && kRows * kLanes == kBlock);
};

// The sizes every kernel needs. row: qkv's (and dqkv's) row length; orow: out's.
struct Dims {
  i64 b, t, heads, kv_heads, hs, group, row, orow;
  float scale;
};

Dims dims_of(i64 b, i64 t, i64 heads, i64 kv_heads, i64 hs) {
  const i64 row = (heads + 2 * kv_heads) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  return {b, t, heads, kv_heads, hs, heads / kv_heads, row, heads * hs, scale};
}

// Head dimension of a lane's element e: chunk e / 4 of the lane sits at float4 index
// (e / 4) * kLanes + lane of the row.
template <int kMaxHs>
__device__ __forceinline__ i64 dim_of(int e, int lane) {
  return ((e / 4) * Geom<kMaxHs>::kLanes + lane) * 4 + e % 4;
}

// x = this lane's elements of the row at `p + base` (widened; 0 past hs, or all 0 when !live).
template <int kMaxHs>
__device__ __forceinline__ void load_slice(float (&x)[Geom<kMaxHs>::kPer], const void* p, int dt,
                                           i64 base, i64 hs, int lane, bool live) {
#pragma unroll
  for (int e = 0; e < Geom<kMaxHs>::kPer; ++e) {
    const i64 d = dim_of<kMaxHs>(e, lane);
    x[e] = live && d < hs ? load_code(p, dt, base + d) : 0.0f;
  }
}

template <int kMaxHs>
__device__ __forceinline__ void store_slice(const float (&x)[Geom<kMaxHs>::kPer], float mul,
                                            void* p, int dt, i64 base, i64 hs, int lane) {
#pragma unroll
  for (int e = 0; e < Geom<kMaxHs>::kPer; ++e) {
    const i64 d = dim_of<kMaxHs>(e, lane);
    if (d < hs) store_code(p, dt, base + d, x[e] * mul);
  }
}

// This lane's part of x . row, row a staged (shared-memory) row of kMaxHs floats.
template <int kMaxHs>
__device__ __forceinline__ float dot_part(const float (&x)[Geom<kMaxHs>::kPer], const float* row,
                                          int lane) {
  using G = Geom<kMaxHs>;
  const float4* r4 = reinterpret_cast<const float4*>(row);
  float acc = 0.0f;
#pragma unroll
  for (int c = 0; c < G::kChunks; ++c) {
    const float4 y = r4[c * G::kLanes + lane];
    acc = fmaf(x[4 * c], y.x, acc);
    acc = fmaf(x[4 * c + 1], y.y, acc);
    acc = fmaf(x[4 * c + 2], y.z, acc);
    acc = fmaf(x[4 * c + 3], y.w, acc);
  }
  return acc;
}

// acc += a * row on this lane's elements.
template <int kMaxHs>
__device__ __forceinline__ void axpy_part(float (&acc)[Geom<kMaxHs>::kPer], float a,
                                          const float* row, int lane) {
  using G = Geom<kMaxHs>;
  const float4* r4 = reinterpret_cast<const float4*>(row);
#pragma unroll
  for (int c = 0; c < G::kChunks; ++c) {
    const float4 y = r4[c * G::kLanes + lane];
    acc[4 * c] = fmaf(a, y.x, acc[4 * c]);
    acc[4 * c + 1] = fmaf(a, y.y, acc[4 * c + 1]);
    acc[4 * c + 2] = fmaf(a, y.z, acc[4 * c + 2]);
    acc[4 * c + 3] = fmaf(a, y.w, acc[4 * c + 3]);
  }
}

// Sum over the kLanes aligned lanes of a row; every one of them gets the same bits.
template <int kLanes>
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// dst[r][d] = element d of token row r0 + r of a (B*T, stride) matrix from column col of the
// batch starting at token tok0, widened; 0 for r0 + r >= T and for d >= hs, so padded rows and
// columns hold exact zeros. All threads of the block take part.
template <int kMaxHs, int kN>
__device__ __forceinline__ void stage(float (*dst)[kMaxHs], const void* src, int dt, i64 tok0,
                                      i64 r0, i64 t, i64 stride, i64 col, i64 hs) {
#pragma unroll 4
  for (int idx = threadIdx.x; idx < kN * kMaxHs; idx += kBlock) {
    const int r = idx / kMaxHs, d = idx % kMaxHs;
    const i64 j = r0 + r;
    dst[r][d] = j < t && d < hs ? load_code(src, dt, (tok0 + j) * stride + col + d) : 0.0f;
  }
}

// ---- forward ---------------------------------------------------------------------------------

// qkv (B,T,(H+2G)*hs) -> out (B,T,H*hs), lse (B,H,T). Work item w: batch*head w % (B*H),
// query tile (tiles - 1 - w / (B*H)).
template <int kMaxHs>
__global__ void __launch_bounds__(kBlock)
    flash_forward_kernel(const void* qkv, int qkv_dt, void* out, int out_dt, float* lse, Dims d) {
  using G = Geom<kMaxHs>;
  __shared__ __align__(16) float ks[G::kTile][kMaxHs];
  __shared__ __align__(16) float vs[G::kTile][kMaxHs];
  const int lane = threadIdx.x % G::kLanes, r = threadIdx.x / G::kLanes;
  const i64 bh_n = d.b * d.heads, tiles = (d.t + G::kRows - 1) / G::kRows;
  for (i64 w = blockIdx.x; w < bh_n * tiles; w += gridDim.x) {
    const i64 qt = tiles - 1 - w / bh_n;  // the tiles with the most keys first
    const i64 bh = w % bh_n, bi = bh / d.heads, h = bh % d.heads, g = h / d.group;
    const i64 tok0 = bi * d.t, i = qt * G::kRows + r;
    const bool live = i < d.t;  // padded rows compute along (the shuffles need every lane)
    float q[G::kPer], o[G::kPer];
    load_slice<kMaxHs>(q, qkv, qkv_dt, (tok0 + i) * d.row + h * d.hs, d.hs, lane, live);
#pragma unroll
    for (int e = 0; e < G::kPer; ++e) o[e] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const i64 keys = d.t < (qt + 1) * G::kRows ? d.t : (qt + 1) * G::kRows;  // seen by the tile
    for (i64 k0 = 0; k0 < keys; k0 += G::kTile) {
      __syncthreads();  // every thread is done with the previous tile
      stage<kMaxHs, G::kTile>(ks, qkv, qkv_dt, tok0, k0, d.t, d.row, (d.heads + g) * d.hs, d.hs);
      stage<kMaxHs, G::kTile>(vs, qkv, qkv_dt, tok0, k0, d.t, d.row,
                              (d.heads + d.kv_heads + g) * d.hs, d.hs);
      __syncthreads();
      float s[G::kTile];
      float mt = -INFINITY;
#pragma unroll
      for (int c = 0; c < G::kTile; ++c) {
        const float dot = row_sum<G::kLanes>(dot_part<kMaxHs>(q, ks[c], lane));
        const i64 j = k0 + c;
        s[c] = j <= i && j < d.t ? d.scale * dot : -INFINITY;
        mt = fmaxf(mt, s[c]);
      }
      const float m_new = fmaxf(m, mt);    // finite: key 0 is in every row's first tile
      const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
      l *= corr;
#pragma unroll
      for (int e = 0; e < G::kPer; ++e) o[e] *= corr;
#pragma unroll
      for (int c = 0; c < G::kTile; ++c) {
        const float p = expf(s[c] - m_new);  // exactly 0 where masked
        l += p;
        axpy_part<kMaxHs>(o, p, vs[c], lane);
      }
      m = m_new;
    }
    if (live) {
      store_slice<kMaxHs>(o, 1.0f / l, out, out_dt, (tok0 + i) * d.orow + h * d.hs, d.hs, lane);
      if (lane == 0) lse[bh * d.t + i] = m + logf(l);
    }
  }
}

// ---- backward --------------------------------------------------------------------------------

// delta[b,h,i] = dout[b,i,h,:] . out[b,i,h,:]; row r = (b*T + i)*H + h of dout's and out's
// (B*T*H, hs) view; one warp per row, lanes in column order, then the butterfly.
__global__ void flash_delta_kernel(const void* dout, int dout_dt, const void* out, int out_dt,
                                   float* delta, i64 rows, i64 t, i64 heads, i64 hs) {
  const int lane = threadIdx.x % kWarp;
  MEMFIT_FOR_WARP_ROWS(r, rows) {
    float acc = 0.0f;
    for (i64 x = lane; x < hs; x += kWarp) {
      acc = fmaf(load_code(dout, dout_dt, r * hs + x), load_code(out, out_dt, r * hs + x), acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      const i64 h = r % heads, bt = r / heads;
      delta[(bt / t * heads + h) * t + bt % t] = acc;
    }
  }
}

// dK, dV of a key tile: work item w is batch*kv head w % (B*G), key tile w / (B*G) (the first
// tiles, seen by the most queries, first). Each key row j accumulates over the group's query
// heads in order, and for each over the query rows i >= j in order.
template <int kMaxHs>
__global__ void __launch_bounds__(kBlock)
    flash_dkdv_kernel(const void* dout, int dout_dt, const void* qkv, int qkv_dt, const float* lse,
                      const float* delta, void* dqkv, int dqkv_dt, Dims d) {
  using G = Geom<kMaxHs>;
  __shared__ __align__(16) float qs[G::kTile][kMaxHs];
  __shared__ __align__(16) float dos[G::kTile][kMaxHs];
  __shared__ float lse_s[G::kTile], delta_s[G::kTile];
  const int lane = threadIdx.x % G::kLanes, r = threadIdx.x / G::kLanes;
  const i64 bg_n = d.b * d.kv_heads, tiles = (d.t + G::kRows - 1) / G::kRows;
  for (i64 w = blockIdx.x; w < bg_n * tiles; w += gridDim.x) {
    const i64 kt = w / bg_n, bg = w % bg_n, bi = bg / d.kv_heads, g = bg % d.kv_heads;
    const i64 tok0 = bi * d.t, j = kt * G::kRows + r;
    const bool live = j < d.t;
    const i64 k_col = (d.heads + g) * d.hs, v_col = (d.heads + d.kv_heads + g) * d.hs;
    float k[G::kPer], v[G::kPer], dk[G::kPer], dv[G::kPer];
    load_slice<kMaxHs>(k, qkv, qkv_dt, (tok0 + j) * d.row + k_col, d.hs, lane, live);
    load_slice<kMaxHs>(v, qkv, qkv_dt, (tok0 + j) * d.row + v_col, d.hs, lane, live);
#pragma unroll
    for (int e = 0; e < G::kPer; ++e) dk[e] = dv[e] = 0.0f;
    const i64 first = kt * G::kRows / G::kTile * G::kTile;  // first query tile seeing the keys
    for (i64 h = g * d.group; h < (g + 1) * d.group; ++h) {
      const i64 stat0 = (bi * d.heads + h) * d.t;
      for (i64 i0 = first; i0 < d.t; i0 += G::kTile) {
        __syncthreads();  // every thread is done with the previous tile
        stage<kMaxHs, G::kTile>(qs, qkv, qkv_dt, tok0, i0, d.t, d.row, h * d.hs, d.hs);
        stage<kMaxHs, G::kTile>(dos, dout, dout_dt, tok0, i0, d.t, d.orow, h * d.hs, d.hs);
        for (int x = threadIdx.x; x < G::kTile; x += kBlock) {
          const bool in = i0 + x < d.t;
          lse_s[x] = in ? lse[stat0 + i0 + x] : 0.0f;
          delta_s[x] = in ? delta[stat0 + i0 + x] : 0.0f;
        }
        __syncthreads();
#pragma unroll 4
        for (int c = 0; c < G::kTile; ++c) {
          const i64 i = i0 + c;
          const float s = d.scale * row_sum<G::kLanes>(dot_part<kMaxHs>(k, qs[c], lane));
          const float dp = row_sum<G::kLanes>(dot_part<kMaxHs>(v, dos[c], lane));
          const float p = i < d.t && j <= i ? expf(s - lse_s[c]) : 0.0f;
          const float ds = p * (dp - delta_s[c]) * d.scale;
          axpy_part<kMaxHs>(dv, p, dos[c], lane);
          axpy_part<kMaxHs>(dk, ds, qs[c], lane);
        }
      }
    }
    if (live) {
      store_slice<kMaxHs>(dk, 1.0f, dqkv, dqkv_dt, (tok0 + j) * d.row + k_col, d.hs, lane);
      store_slice<kMaxHs>(dv, 1.0f, dqkv, dqkv_dt, (tok0 + j) * d.row + v_col, d.hs, lane);
    }
  }
}

// dQ of a query tile: work items as the forward's; each query row i accumulates over the keys
// j <= i in order.
template <int kMaxHs>
__global__ void __launch_bounds__(kBlock)
    flash_dq_kernel(const void* dout, int dout_dt, const void* qkv, int qkv_dt, const float* lse,
                    const float* delta, void* dqkv, int dqkv_dt, Dims d) {
  using G = Geom<kMaxHs>;
  __shared__ __align__(16) float ks[G::kTile][kMaxHs];
  __shared__ __align__(16) float vs[G::kTile][kMaxHs];
  const int lane = threadIdx.x % G::kLanes, r = threadIdx.x / G::kLanes;
  const i64 bh_n = d.b * d.heads, tiles = (d.t + G::kRows - 1) / G::kRows;
  for (i64 w = blockIdx.x; w < bh_n * tiles; w += gridDim.x) {
    const i64 qt = tiles - 1 - w / bh_n;  // the tiles with the most keys first
    const i64 bh = w % bh_n, bi = bh / d.heads, h = bh % d.heads, g = h / d.group;
    const i64 tok0 = bi * d.t, i = qt * G::kRows + r;
    const bool live = i < d.t;
    float q[G::kPer], dO[G::kPer], dq[G::kPer];
    load_slice<kMaxHs>(q, qkv, qkv_dt, (tok0 + i) * d.row + h * d.hs, d.hs, lane, live);
    load_slice<kMaxHs>(dO, dout, dout_dt, (tok0 + i) * d.orow + h * d.hs, d.hs, lane, live);
#pragma unroll
    for (int e = 0; e < G::kPer; ++e) dq[e] = 0.0f;
    const float lse_i = live ? lse[bh * d.t + i] : 0.0f;
    const float delta_i = live ? delta[bh * d.t + i] : 0.0f;
    const i64 keys = d.t < (qt + 1) * G::kRows ? d.t : (qt + 1) * G::kRows;
    for (i64 k0 = 0; k0 < keys; k0 += G::kTile) {
      __syncthreads();
      stage<kMaxHs, G::kTile>(ks, qkv, qkv_dt, tok0, k0, d.t, d.row, (d.heads + g) * d.hs, d.hs);
      stage<kMaxHs, G::kTile>(vs, qkv, qkv_dt, tok0, k0, d.t, d.row,
                              (d.heads + d.kv_heads + g) * d.hs, d.hs);
      __syncthreads();
#pragma unroll 4
      for (int c = 0; c < G::kTile; ++c) {
        const i64 j = k0 + c;
        const float s = d.scale * row_sum<G::kLanes>(dot_part<kMaxHs>(q, ks[c], lane));
        const float dp = row_sum<G::kLanes>(dot_part<kMaxHs>(dO, vs[c], lane));
        const float p = live && j <= i ? expf(s - lse_i) : 0.0f;
        const float ds = p * (dp - delta_i) * d.scale;
        axpy_part<kMaxHs>(dq, ds, ks[c], lane);
      }
    }
    if (live) {
      store_slice<kMaxHs>(dq, 1.0f, dqkv, dqkv_dt, (tok0 + i) * d.row + h * d.hs, d.hs, lane);
    }
  }
}

// Calls f(std::integral_constant<int, kMaxHs>{}) with the smallest kMaxHs that holds hs.
template <typename F>
cudaError_t by_head_size(i64 hs, F&& f) {
  if (hs <= 32) return f(std::integral_constant<int, 32>{});
  if (hs <= 64) return f(std::integral_constant<int, 64>{});
  if (hs <= 128) return f(std::integral_constant<int, 128>{});
  return f(std::integral_constant<int, 256>{});
}

// Blocks for `outer` (batch, head) pairs of T rows in tiles of kRows: one per work item, up to
// kMaxGrid (the kernels grid-stride past it).
template <int kMaxHs>
unsigned tile_grid(i64 outer, i64 t) {
  return grid_for(outer * ((t + Geom<kMaxHs>::kRows - 1) / Geom<kMaxHs>::kRows), 1);
}

}  // namespace

cudaError_t launch_flash_attention_forward(const void* qkv, int qkv_dt, void* out, int out_dt,
                                           float* lse, std::int64_t b, std::int64_t t,
                                           std::int64_t heads, std::int64_t kv_heads,
                                           std::int64_t hs, cudaStream_t stream) {
  if (b * t == 0) return cudaSuccess;
  const Dims d = dims_of(b, t, heads, kv_heads, hs);
  return by_head_size(hs, [&](auto size) {
    constexpr int kMaxHs = decltype(size)::value;
    flash_forward_kernel<kMaxHs>
        <<<tile_grid<kMaxHs>(b * heads, t), kBlock, 0, stream>>>(qkv, qkv_dt, out, out_dt, lse, d);
    return cudaGetLastError();
  });
}

cudaError_t launch_flash_attention_backward(const void* dout, int dout_dt, const void* qkv,
                                            int qkv_dt, const void* out, int out_dt,
                                            const float* lse, float* delta, void* dqkv, int dqkv_dt,
                                            std::int64_t b, std::int64_t t, std::int64_t heads,
                                            std::int64_t kv_heads, std::int64_t hs,
                                            cudaStream_t stream) {
  if (b * t == 0) return cudaSuccess;
  const Dims d = dims_of(b, t, heads, kv_heads, hs);
  const i64 rows = b * t * heads;
  flash_delta_kernel<<<grid_for(rows, kThreads / kWarp), kThreads, 0, stream>>>(
      dout, dout_dt, out, out_dt, delta, rows, t, heads, hs);
  MEMFIT_RETURN_IF_LAUNCH_FAILED();
  return by_head_size(hs, [&](auto size) {
    constexpr int kMaxHs = decltype(size)::value;
    flash_dkdv_kernel<kMaxHs><<<tile_grid<kMaxHs>(b * kv_heads, t), kBlock, 0, stream>>>(
        dout, dout_dt, qkv, qkv_dt, lse, delta, dqkv, dqkv_dt, d);
    MEMFIT_RETURN_IF_LAUNCH_FAILED();
    flash_dq_kernel<kMaxHs><<<tile_grid<kMaxHs>(b * heads, t), kBlock, 0, stream>>>(
        dout, dout_dt, qkv, qkv_dt, lse, delta, dqkv, dqkv_dt, d);
    return cudaGetLastError();
  });
}

}  // namespace memfit::cuda
