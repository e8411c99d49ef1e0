// CudaBackend: the Backend (core/backend.h) on one NVIDIA GPU. CUDA builds only.
//
//   CudaBackend be({.device = 0});
//   CudaProvider gpu(0);
//   CachingAllocator alloc(gpu, alloc_conf_from_env(), &be.stream_sync());
//   be.set_workspace_allocator(&alloc);          // cuBLASLt/cuDNN workspace: Category::kWorkspace
//   LayerContext ctx{be, alloc, kDefaultStream, DType::kBF16};
//   Model model(ModelSpec::preset("gpt2"), ctx);  // every layer runs on the GPU unchanged
//   ContextInfo info = be.context_info();         // CUDA context + library handles, measured
//
// Contract: exactly Backend's. Tensors live on Device::kCuda (memory from a CachingAllocator
// over CudaProvider); copy() also takes host tensors (Device::kCpu), which should be pinned
// (PinnedHostProvider) for the copy to be asynchronous. Every op is queued on its stream and
// returns; nothing on the steady path synchronizes the device.
// - Streams: kDefaultStream is a non-blocking stream the backend creates (never the legacy
//   NULL stream, which would serialize against every other stream); create_stream() makes
//   more (cudaStreamNonBlocking). StreamIds are the backend's own small numbers.
// - Events: cudaEventDisableTiming, pooled and reused (cuda_backend.cpp).
// - GEMM (cuda_gemm.cpp): cuBLASLt matmul, FP32 compute (CUBLAS_COMPUTE_32F; f16/bf16 inputs
//   use tensor cores), TF32 off unless options.allow_tf32, any of f32/f16/bf16 for A, B and C
//   (mixed A/B dtypes are cast to the wider type first in workspace), transposes and strided
//   batches. Row-major memfit matrices are passed as column-major transposes (C^T = B^T A^T).
//   Its workspace (options.gemm_workspace_bytes) is allocated per call from the allocator given
//   to set_workspace_allocator() with Category::kWorkspace, tag "cuda.gemm.workspace", on the
//   op's stream; without one, cuBLASLt runs with no workspace.
// - Elementwise and reductions (cuda_elementwise.cpp, elementwise_kernels.cu) and the
//   neural-network ops (cuda_nn.cpp, nn_kernels.cu): one kernel per op, FP32 arithmetic, the
//   CPU backend's rounding (round to nearest even into the output dtype). Reductions
//   (sumsq, bias/layernorm/embedding gradients) combine partials in a fixed order, never with
//   float atomics, so results are deterministic run to run (not bit-equal to the CPU's
//   double-precision sums: the GPU tests compare with dtype-aware tolerances).
// - Every CUDA/cuBLAS/cuDNN status becomes CudaError naming the call and the code
//   (memory/cuda/cuda_check.h, core/cuda/cuda_lib_check.h); every kernel launch is checked
//   with cudaGetLastError right after it.
// - Token/target ids out of range: the kernels trap (__trap), which surfaces as CudaError at
//   the next synchronize; the context is then unusable (as any device-side fault).
// Thread safety: as Backend.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/backend.h"
#include "memory/caching_allocator.h"

namespace memfit {

struct CudaBackendOptions {
  int device = 0;
  bool allow_tf32 = false;  // f32 GEMMs may use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32)
  std::size_t gemm_workspace_bytes = std::size_t{32}
                                     << 20;  // cuBLASLt's recommended 32 MiB on Hopper
};

// What the CUDA context and the backend's library handles cost in device memory, measured with
// cudaMemGetInfo (see CudaProvider::measure_context_overhead for what "used" can include).
struct ContextInfo {
  int device = 0;
  std::size_t total_bytes = 0;          // the device's memory
  std::size_t used_before_handles = 0;  // total - free once the context exists
  std::size_t handle_bytes = 0;         // cuBLASLt/cuDNN handles and their state (delta)
  std::size_t free_bytes = 0;           // free after the backend is set up
};

class CudaBackend final : public Backend {
 public:
  // Throws InvalidArgument when the device does not exist (naming the count and the runtime's
  // reason), CudaError when a handle cannot be created.
  explicit CudaBackend(CudaBackendOptions options = {});
  ~CudaBackend() override;  // synchronizes every stream, then destroys streams, events, handles
  Device device() const override { return Device::kCuda; }
  const char* name() const override { return "cuda"; }
  const CudaBackendOptions& options() const { return options_; }
  const ContextInfo& context_info() const { return context_; }

  void set_workspace_allocator(CachingAllocator* alloc) override;
  CachingAllocator* workspace_allocator() const { return workspace_; }

  // The CUDA stream behind a StreamId (for kernels and libraries outside this class).
  cudaStream_t cuda_stream(StreamId stream) const;
  int sm_count() const { return sm_count_; }

 protected:
  StreamId do_create_stream() override;
  void do_destroy_stream(StreamId stream) override;
  bool do_has_stream(StreamId stream) const override;
  void do_synchronize(StreamId stream) override;
  EventHandle do_record_event(StreamId stream) override;
  bool do_has_event(EventHandle event) const override;
  bool do_query_event(EventHandle event) override;
  void do_synchronize_event(EventHandle event) override;
  void do_wait_event(StreamId stream, EventHandle event) override;
  void do_release_event(EventHandle event) override;

  // cuda_gemm.cpp
  void do_gemm(StreamId stream, const GemmDesc& d, const Tensor& a, const Tensor& b,
               const Tensor& c) override;
  // cuda_backend.cpp (copy), cuda_elementwise.cpp (the rest)
  void do_fill(StreamId stream, const Tensor& x, float value) override;
  void do_copy(StreamId stream, const Tensor& src, const Tensor& dst) override;
  void do_cast(StreamId stream, const Tensor& src, const Tensor& dst) override;
  void do_axpy(StreamId stream, float a, const Tensor& x, const Tensor& y) override;
  void do_scale(StreamId stream, float a, const Tensor& x) override;
  void do_sumsq(StreamId stream, const Tensor& x, const Tensor& out) override;

  // cuda_nn.cpp
  void do_layernorm_forward(StreamId stream, const Tensor& inp, const Tensor& weight,
                            const Tensor& bias, float eps, const Tensor& out, const Tensor& mean,
                            const Tensor& rstd) override;
  void do_layernorm_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                             const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                             const Tensor& dinp, const Tensor& dweight,
                             const Tensor& dbias) override;
  void do_gelu_forward(StreamId stream, const Tensor& inp, const Tensor& out) override;
  void do_gelu_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                        const Tensor& dinp) override;
  void do_add(StreamId stream, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void do_add_bias(StreamId stream, const Tensor& bias, const Tensor& out) override;
  void do_bias_backward(StreamId stream, const Tensor& dout, const Tensor& dbias) override;
  void do_softmax_causal_forward(StreamId stream, const Tensor& preatt, float scale,
                                 const Tensor& att, std::int64_t t) override;
  void do_softmax_causal_backward(StreamId stream, const Tensor& datt, const Tensor& att,
                                  float scale, const Tensor& dpreatt, std::int64_t t) override;
  void do_split_heads(StreamId stream, const Tensor& src, const Tensor& dst,
                      const HeadDims& d) override;
  void do_merge_heads(StreamId stream, const Tensor& src, const Tensor& dst,
                      const HeadDims& d) override;
  void do_flash_attention_forward(StreamId stream, const Tensor& qkv, const AttentionDims& d,
                                  const Tensor& out, const Tensor& lse) override;
  void do_flash_attention_backward(StreamId stream, const Tensor& dout, const Tensor& qkv,
                                   const Tensor& out, const Tensor& lse, const AttentionDims& d,
                                   const Tensor& delta, const Tensor& dqkv) override;
  void do_rmsnorm_forward(StreamId stream, const Tensor& inp, const Tensor& weight, float eps,
                          const Tensor& out, const Tensor& rstd) override;
  void do_rmsnorm_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                           const Tensor& weight, const Tensor& rstd, const Tensor& dinp,
                           const Tensor& dweight) override;
  void do_rope(StreamId stream, const Tensor& qkv, const AttentionDims& d, const RopeFreqs& f,
               bool inverse) override;
  void do_qk_norm_forward(StreamId stream, const Tensor& qkv, const AttentionDims& d,
                          const Tensor& q_weight, const Tensor& k_weight, float eps,
                          const Tensor& qk_in, const Tensor& rstd) override;
  void do_qk_norm_backward(StreamId stream, const Tensor& dqkv, const Tensor& qk_in,
                           const Tensor& rstd, const AttentionDims& d, const Tensor& q_weight,
                           const Tensor& k_weight, const Tensor& dq_weight,
                           const Tensor& dk_weight) override;
  void do_swiglu_forward(StreamId stream, const Tensor& gate_up, const Tensor& out) override;
  void do_swiglu_backward(StreamId stream, const Tensor& dout, const Tensor& gate_up,
                          const Tensor& dgate_up) override;
  void do_embedding_forward(StreamId stream, const IndexTensor& tokens, const Tensor& wte,
                            const Tensor* wpe, const Tensor& out) override;
  void do_embedding_backward(StreamId stream, const Tensor& dout, const IndexTensor& tokens,
                             const Tensor& dwte, const Tensor* dwpe) override;
  void do_crossentropy_forward(StreamId stream, const Tensor& logits, const IndexTensor& targets,
                               std::int64_t vocab, const Tensor& losses,
                               const Tensor& lse) override;
  void do_crossentropy_backward(StreamId stream, const Tensor& logits, const Tensor& lse,
                                const IndexTensor& targets, std::int64_t vocab, float dloss,
                                const Tensor* dlosses, const Tensor& dlogits) override;
  void do_adamw(StreamId stream, const AdamWConstants& k, const Tensor& param, const Tensor& grad,
                const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* param_out) override;

  // ---- conv2d (conv helper's section: cuda_conv.cpp, cuDNN) ----
  // cuDNN's legacy convolution API on NHWC tensor and filter descriptors, FP32 compute
  // (f16/bf16 data on tensor cores; f32 with TF32 only when options.allow_tf32), algorithms
  // from cudnnGet*Algorithm_v7 restricted to deterministic ones, workspace per call from the
  // workspace allocator (Category::kWorkspace, "cuda.conv.workspace"). dweight (f32 +=): f32
  // weights accumulate in place (beta = 1); f16/bf16 ones go through a temporary in their
  // dtype ("cuda.conv.dweight"), then an FP32 add. Without cuDNN: InvalidArgument.
  void do_conv2d_forward(StreamId stream, const Conv2dDesc& d, const Tensor& inp,
                         const Tensor& weight, const Tensor& out) override;
  void do_conv2d_backward(StreamId stream, const Conv2dDesc& d, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor* dinp,
                          const Tensor& dweight) override;
  // ---- end conv2d ----

  // cuBLASLt takes 32-bit m, n, k, leading dimensions and batch count.
  std::int64_t max_gemm_dim() const override;

 private:
  struct Impl;  // streams, event pool, cuBLASLt/cuDNN handles (cuda_backend.cpp)
  CudaBackendOptions options_;
  ContextInfo context_;
  int sm_count_ = 0;
  CachingAllocator* workspace_ = nullptr;
  std::unique_ptr<Impl> impl_;

 public:
  Impl& impl() { return *impl_; }  // for this backend's own translation units
};

}  // namespace memfit
