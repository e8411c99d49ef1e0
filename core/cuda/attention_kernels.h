// Launchers of the CUDA backend's flash attention kernels (attention_kernels.cu), called by
// cuda_nn.cpp. Plain C++17 declarations (raw pointers, sizes, dtype codes, cudaStream_t),
// as nn_kernels.h, whose dtype codes (kCodeF32, kCodeF16, kCodeBF16) they take.
//
//   MEMFIT_CUDA_CHECK(cuda::launch_flash_attention_forward(
//       qkv.raw(), code(qkv), out.raw(), code(out), f32(lse), d.b, d.t, d.heads, d.kv_heads,
//       d.hs, stream));
//
// Contract: Backend::flash_attention_forward/backward (core/backend.h) after its checks
// (core/backend_nn.cpp): B, T >= 0; H, G >= 1 with G dividing H; 1 <= hs <= 256; every operand
// of the element count its layout needs, aligned to its element size, the outputs disjoint
// from the inputs and from each other. Layouts (row-major):
//   qkv, dqkv (B,T,(H+2G)*hs): each token's row is q (H heads of hs), k (G heads), v (G heads)
//   out, dout (B,T,H*hs);  lse, delta (B,H,T) f32
// scale = 1/sqrt(hs); query head h reads kv head h / (H/G). Each operand has its own dtype.
// The launchers queue their kernels on `stream` and return cudaGetLastError() after the last
// launch (cudaSuccess when B*T is 0). No scratch memory: delta is the caller's.
// Deterministic: fixed loop orders, no atomics; the same inputs give the same bits every run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace memfit::cuda {

// qkv -> out (B,T,H*hs) rounded once from FP32, lse (B,H,T) f32 = log sum_{j<=i} exp(s_ij),
// s_ij = scale * q_i . k_j.
cudaError_t launch_flash_attention_forward(const void* qkv, int qkv_dt, void* out, int out_dt,
                                           float* lse, std::int64_t b, std::int64_t t,
                                           std::int64_t heads, std::int64_t kv_heads,
                                           std::int64_t hs, cudaStream_t stream);

// dout, and qkv, out, lse as the forward left them -> delta (B,H,T) f32 = dout . out per row
// (written first, then read), dqkv (B,T,(H+2G)*hs) written: dq in the q columns, dk and dv
// (summed over each kv head's group of query heads) in the k and v columns.
cudaError_t launch_flash_attention_backward(const void* dout, int dout_dt, const void* qkv,
                                            int qkv_dt, const void* out, int out_dt,
                                            const float* lse, float* delta, void* dqkv, int dqkv_dt,
                                            std::int64_t b, std::int64_t t, std::int64_t heads,
                                            std::int64_t kv_heads, std::int64_t hs,
                                            cudaStream_t stream);

}  // namespace memfit::cuda
