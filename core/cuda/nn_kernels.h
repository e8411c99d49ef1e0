// Launchers of the CUDA backend's neural-network kernels (nn_kernels.cu), called by
// cuda_nn.cpp. Plain C++17 declarations (raw pointers, sizes, dtype codes, cudaStream_t) so the
// C++20 side and nvcc's C++17 side share nothing else.
//
//   MEMFIT_CUDA_CHECK(cuda::launch_gelu_forward(inp.raw(), code(inp), out.raw(), code(out),
//                                               n, stream));
//
// Contract: the caller (CudaBackend, after Backend's checks in backend_nn.cpp) passes valid
// arguments: device pointers aligned to their element size, sizes >= 0 whose products fit
// int64, outputs that overlap inputs only where core/backend.h allows it (then exactly). Every
// launcher queues its kernels on `stream` and returns cudaGetLastError() right after the last
// launch (cudaSuccess when there was nothing to do), so a bad launch configuration is caught
// where it happens; faults inside a kernel (a __trap on an id out of range) surface at the
// stream's next synchronize, as any asynchronous error.
// Arithmetic: FP32, inputs widened exactly, results rounded to nearest even into the output's
// dtype (__float2half_rn / __float2bfloat16_rn). Reductions run in a fixed order (warp
// shuffles, then shared memory, then a second kernel over per-chunk partials), never float
// atomics: the same inputs give the same bits run to run.
//
// Scratch: the reductions over rows (layernorm, RMSNorm and bias gradients) and the embedding
// gradient need device scratch of the size the *_scratch_bytes functions return; the caller
// provides it (CudaBackend takes it from its workspace allocator) with at least 256-byte
// alignment.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/adamw.h"  // AdamWConstants: plain data, C++17-safe

namespace memfit::cuda {

// Element type codes: the values of memfit::DType (core/dtype.h), which cuda_nn.cpp checks.
inline constexpr int kCodeF32 = 0;
inline constexpr int kCodeF16 = 1;
inline constexpr int kCodeBF16 = 2;

// inp (N,C) -> out (N,C), mean (N) f32, rstd (N) f32; weight (C), bias (C). C >= 1.
cudaError_t launch_layernorm_forward(const void* inp, int inp_dt, const void* weight, int w_dt,
                                     const void* bias, int b_dt, float eps, void* out, int out_dt,
                                     float* mean, float* rstd, std::int64_t n, std::int64_t c,
                                     cudaStream_t stream);

// Bytes of scratch launch_layernorm_backward needs for N rows of C columns.
std::size_t layernorm_backward_scratch_bytes(std::int64_t n, std::int64_t c);
// dout (N,C), inp (N,C), weight (C), mean/rstd (N) f32 -> dinp (N,C) +=, dweight/dbias (C) f32 +=
cudaError_t launch_layernorm_backward(const void* dout, int dout_dt, const void* inp, int inp_dt,
                                      const void* weight, int w_dt, const float* mean,
                                      const float* rstd, void* dinp, int dinp_dt, float* dweight,
                                      float* dbias, std::int64_t n, std::int64_t c, void* scratch,
                                      cudaStream_t stream);

// ---- Llama-family ops (core/backend.h's contracts; the CPU backend's arithmetic) ----------

// inp (N,C), weight (C) -> out (N,C) = inp * rstd * weight, rstd (N) f32 =
// 1 / sqrt(mean(inp^2) + eps). C >= 1.
cudaError_t launch_rmsnorm_forward(const void* inp, int inp_dt, const void* weight, int w_dt,
                                   float eps, void* out, int out_dt, float* rstd, std::int64_t n,
                                   std::int64_t c, cudaStream_t stream);

// Bytes of scratch launch_rmsnorm_backward needs for N rows of C columns.
std::size_t rmsnorm_backward_scratch_bytes(std::int64_t n, std::int64_t c);
// dout (N,C), inp (N,C), weight (C), rstd (N) f32 -> dinp (N,C) +=, dweight (C) f32 +=
cudaError_t launch_rmsnorm_backward(const void* dout, int dout_dt, const void* inp, int inp_dt,
                                    const void* weight, int w_dt, const float* rstd, void* dinp,
                                    int dinp_dt, float* dweight, std::int64_t n, std::int64_t c,
                                    void* scratch, cudaStream_t stream);

// Per-head RMSNorm of the q and k heads of qkv (B,T,(H+2G)*hs) in place (Qwen3's q_norm,
// k_norm): qk_in (B,T,(H+G)*hs) gets the q and k columns as they were, rstd (B,T,H+G) f32.
// q_weight, k_weight (hs) share one dtype.
cudaError_t launch_qk_norm_forward(void* qkv, int qkv_dt, const void* q_weight,
                                   const void* k_weight, int w_dt, float eps, void* qk_in,
                                   int qk_in_dt, float* rstd, std::int64_t b, std::int64_t t,
                                   std::int64_t heads, std::int64_t kv_heads, std::int64_t hs,
                                   cudaStream_t stream);
// Bytes of scratch launch_qk_norm_backward needs.
std::size_t qk_norm_backward_scratch_bytes(std::int64_t b, std::int64_t t, std::int64_t heads,
                                           std::int64_t kv_heads, std::int64_t hs);
// dqkv's q and k heads in place (the normed heads' gradient -> qk_in's), dq_weight and
// dk_weight (hs) f32 += (two-stage column sums, no atomics).
cudaError_t launch_qk_norm_backward(void* dqkv, int dqkv_dt, const void* qk_in, int qk_in_dt,
                                    const float* rstd, const void* q_weight, const void* k_weight,
                                    int w_dt, float* dq_weight, float* dk_weight, std::int64_t b,
                                    std::int64_t t, std::int64_t heads, std::int64_t kv_heads,
                                    std::int64_t hs, void* scratch, cudaStream_t stream);

// The most frequencies launch_rope takes: RopeFreqs::inv_freq's length (cuda_nn.cpp checks).
inline constexpr int kRopeMaxHalf = 128;
// Rotary embedding in place on the q and k heads of qkv (B,T,(H+2G)*hs), hs = 2 * half, half in
// [1, kRopeMaxHalf]; inv_freq: `half` floats in *host* memory, copied into the kernel's
// parameters at launch (so the caller's array may go away as soon as this returns). inverse:
// the transposed rotation (the backward). A half outside that range is cudaErrorInvalidValue.
cudaError_t launch_rope(void* qkv, int qkv_dt, const float* inv_freq, std::int64_t half,
                        std::int64_t b, std::int64_t t, std::int64_t heads, std::int64_t kv_heads,
                        bool inverse, cudaStream_t stream);

// gate_up (N,2F) -> out (N,F) = silu(gate) * up. F >= 1.
cudaError_t launch_swiglu_forward(const void* gate_up, int gu_dt, void* out, int out_dt,
                                  std::int64_t n, std::int64_t f, cudaStream_t stream);
// dout (N,F), gate_up (N,2F) -> dgate_up (N,2F), written (no accumulation). F >= 1.
// dgate_up may be gate_up (same dtype): each thread reads its g and u before writing them.
cudaError_t launch_swiglu_backward(const void* dout, int dout_dt, const void* gate_up, int gu_dt,
                                   void* dgate_up, int dgu_dt, std::int64_t n, std::int64_t f,
                                   cudaStream_t stream);

// inp (n) -> out (n), GPT-2's tanh GELU; out may be inp (same dtype).
cudaError_t launch_gelu_forward(const void* inp, int inp_dt, void* out, int out_dt, std::int64_t n,
                                cudaStream_t stream);
// dout (n), inp (n) -> dinp (n) = gelu'(inp) * dout; dinp may be dout.
cudaError_t launch_gelu_backward(const void* dout, int dout_dt, const void* inp, int inp_dt,
                                 void* dinp, int dinp_dt, std::int64_t n, cudaStream_t stream);

// a (n) + b (n) -> out (n); out may be a or b.
cudaError_t launch_add(const void* a, int a_dt, const void* b, int b_dt, void* out, int out_dt,
                       std::int64_t n, cudaStream_t stream);
// out (N,OC) += bias (OC) on every row.
cudaError_t launch_add_bias(const void* bias, int bias_dt, void* out, int out_dt, std::int64_t n,
                            std::int64_t oc, cudaStream_t stream);

// Bytes of scratch launch_bias_backward needs for N rows of OC columns.
std::size_t bias_backward_scratch_bytes(std::int64_t n, std::int64_t oc);
// dout (N,OC) -> dbias (OC) f32 += column sums.
cudaError_t launch_bias_backward(const void* dout, int dout_dt, float* dbias, std::int64_t n,
                                 std::int64_t oc, void* scratch, cudaStream_t stream);

// preatt (R,T,T) -> att (R,T,T), causal softmax of scale * preatt; att may be preatt.
cudaError_t launch_softmax_causal_forward(const void* preatt, int in_dt, float scale, void* att,
                                          int att_dt, std::int64_t r, std::int64_t t,
                                          cudaStream_t stream);
// datt, att (R,T,T) -> dpreatt (R,T,T); dpreatt may be datt.
cudaError_t launch_softmax_causal_backward(const void* datt, int datt_dt, const void* att,
                                           int att_dt, float scale, void* dpreatt, int out_dt,
                                           std::int64_t r, std::int64_t t, cudaStream_t stream);

// split: src (B,T,P,H,hs) -> dst (P,B,H,T,hs); merge: the inverse. src and dst are disjoint.
cudaError_t launch_permute_heads(const void* src, int src_dt, void* dst, int dst_dt, std::int64_t b,
                                 std::int64_t t, std::int64_t parts, std::int64_t heads,
                                 std::int64_t hs, bool split, cudaStream_t stream);

// tokens (B,T) int32 in [0, V) (else the kernel traps), wte (V,C), wpe (>=T,C) -> out (B,T,C);
// wpe null: no position term (wpe_dt then ignored).
cudaError_t launch_embedding_forward(const std::int32_t* tokens, const void* wte, int wte_dt,
                                     const void* wpe, int wpe_dt, void* out, int out_dt,
                                     std::int64_t b, std::int64_t t, std::int64_t c,
                                     std::int64_t vocab, cudaStream_t stream);

// Bytes of scratch launch_embedding_backward needs for N = B*T tokens below `vocab`; returns
// the error of CUB's size query (which launches nothing).
cudaError_t embedding_backward_scratch_bytes(std::int64_t n, std::int64_t vocab,
                                             std::size_t* bytes);
// dout (B,T,C), tokens (B,T) -> dwte (V,C) f32 +=, dwpe (>=T,C) f32 += (dwpe may be null), each
// element's terms added into it one by one in (b,t) order (bit-identical to the CPU backend's
// loop).
cudaError_t launch_embedding_backward(const void* dout, int dout_dt, const std::int32_t* tokens,
                                      float* dwte, float* dwpe, std::int64_t b, std::int64_t t,
                                      std::int64_t c, std::int64_t vocab, void* scratch,
                                      std::size_t scratch_bytes, cudaStream_t stream);

// logits (N,Vp), targets (N) in [0, V) (else trap) -> losses (N) f32, lse (N) f32.
cudaError_t launch_crossentropy_forward(const void* logits, int logits_dt,
                                        const std::int32_t* targets, std::int64_t vocab,
                                        float* losses, float* lse, std::int64_t n, std::int64_t vp,
                                        cudaStream_t stream);
// logits (N,Vp), lse (N), targets (N) -> dlogits (N,Vp), g_i = dloss * (dlosses ? dlosses[i] :
// 1); columns >= V get 0. dlogits may be logits.
cudaError_t launch_crossentropy_backward(const void* logits, int logits_dt, const float* lse,
                                         const std::int32_t* targets, std::int64_t vocab,
                                         float dloss, const float* dlosses, void* dlogits,
                                         int dlogits_dt, std::int64_t n, std::int64_t vp,
                                         cudaStream_t stream);

// One AdamW step over n elements, core/adamw.h's arithmetic bit for bit; param_out may be null.
cudaError_t launch_adamw(const AdamWConstants& k, float* param, const void* grad, int grad_dt,
                         float* exp_avg, float* exp_avg_sq, void* param_out, int out_dt,
                         std::int64_t n, cudaStream_t stream);

}  // namespace memfit::cuda
