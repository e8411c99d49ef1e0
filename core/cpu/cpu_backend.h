// CpuBackend: the numerical reference backend. Runs every op inline on the calling thread, on
// host memory (tensors with Device::kCpu), so its streams are always idle and its events are
// complete when recorded; stream ids and event handles are still checked as on CUDA.
//
//   CpuBackend be;
//   HostProvider host;
//   CachingAllocator alloc(host, {}, &be.stream_sync());
//   be.gemm(kDefaultStream, d, a, b, c);   // done when it returns
//
// GEMM goes through OpenBLAS's cblas_sgemm with FP32 accumulation. f16/bf16 operands are
// widened (exactly) to f32 in scratch, and a non-f32 C is computed in f32 scratch (holding
// the widened old C when beta != 0) and rounded once to its dtype. Scratch per call is at most
// one A, one B and one C matrix of f32 (none when all three are f32). It comes from
//   - the caching allocator given to set_workspace_allocator(), as Category::kWorkspace blocks
//     on the op's stream, tagged "cpu.gemm.scratch", so it counts against the budget like a
//     device's workspace would; or, when none is set (the default),
//   - a pool of host buffers the backend keeps for reuse (cpu/scratch_pool.h), outside any
//     budget; scratch_bytes() reports it and release_scratch() frees the idle part.
// Elementwise ops work in 4096-element f32 chunks on the stack, with OpenMP across chunks
// from 64K elements. sumsq() keeps one double partial per 64K-element block (a heap array of
// n/64K entries) and adds them in block order, so its result does not depend on the thread
// count.
// The neural-network ops (nn_ops.cpp, attention_ops.cpp) widen rows to f32, sum in double
// and round once; OpenMP runs over rows, or over 256-column blocks where rows are reduced
// (dweight, dbias, dwte, dwpe), so every gradient is summed in row order by one thread and
// the bits do not depend on the thread count. AdamW calls core/cpu/adamw.h's adamw_step.
// Token and target ids are checked against the vocabulary before anything is written.
// Thread safety: as Backend (backend.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/backend.h"
#include "core/cpu/inline_streams.h"
#include "core/cpu/scratch_pool.h"

namespace memfit {

class CpuBackend final : public cpu::InlineBackend {
 public:
  CpuBackend() = default;
  Device device() const override { return Device::kCpu; }
  const char* name() const override { return "cpu"; }

  // GEMM scratch from `alloc` from now on (nullptr: the backend's own pool). `alloc` must
  // outlive its use here; it may itself be built on stream_sync().
  void set_workspace_allocator(CachingAllocator* alloc) { workspace_ = alloc; }
  std::size_t scratch_bytes() const { return scratch_.held_bytes(); }  // pool only
  void release_scratch() { scratch_.release_idle(); }

 protected:
  void do_gemm(StreamId stream, const GemmDesc& d, const Tensor& a, const Tensor& b,
               const Tensor& c) override;
  void do_fill(StreamId stream, const Tensor& x, float value) override;
  void do_copy(StreamId stream, const Tensor& src, const Tensor& dst) override;
  void do_cast(StreamId stream, const Tensor& src, const Tensor& dst) override;
  void do_axpy(StreamId stream, float a, const Tensor& x, const Tensor& y) override;
  void do_scale(StreamId stream, float a, const Tensor& x) override;
  void do_sumsq(StreamId stream, const Tensor& x, const Tensor& out) override;

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
  void do_embedding_forward(StreamId stream, const IndexTensor& tokens, const Tensor& wte,
                            const Tensor& wpe, const Tensor& out) override;
  void do_embedding_backward(StreamId stream, const Tensor& dout, const IndexTensor& tokens,
                             const Tensor& dwte, const Tensor& dwpe) override;
  void do_crossentropy_forward(StreamId stream, const Tensor& logits, const IndexTensor& targets,
                               std::int64_t vocab, const Tensor& losses,
                               const Tensor& lse) override;
  void do_crossentropy_backward(StreamId stream, const Tensor& logits, const Tensor& lse,
                                const IndexTensor& targets, std::int64_t vocab, float dloss,
                                const Tensor* dlosses, const Tensor& dlogits) override;
  void do_adamw(StreamId stream, const AdamWConstants& k, const Tensor& param, const Tensor& grad,
                const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* param_out) override;

  // cblas_sgemm takes 32-bit sizes.
  std::int64_t max_gemm_dim() const override;

 private:
  cpu::ScratchPool scratch_;
  CachingAllocator* workspace_ = nullptr;
};

namespace cpu {

// Floats of scratch gemm() needs: m*k if A is not f32, k*n if B is not, m*n if C is not.
std::size_t gemm_scratch_floats(const GemmDesc& d, const Tensor& a, const Tensor& b,
                                const Tensor& c);

// The batched GEMM of backend.h on host memory; `d` has its strides resolved (no kPacked);
// `scratch` holds gemm_scratch_floats() floats.
void gemm(const GemmDesc& d, const Tensor& a, const Tensor& b, const Tensor& c, float* scratch);

// One plain row-major cblas_sgemm call, C = alpha * op(A) @ op(B) + beta * C with dense
// leading dimensions. Exposed so benchmarks can time OpenBLAS itself as their anchor in the
// same binary (libopenblas is a private dependency of libmemfit).
void blas_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                const float* b, float beta, float* c);

}  // namespace cpu
}  // namespace memfit
