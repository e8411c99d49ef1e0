// CpuBackend: the numerical reference backend, on host memory (tensors with Device::kCpu).
// By default every op runs inline on the calling thread, so streams are always idle and
// events complete when recorded; stream ids and event handles are still checked as on CUDA.
// With worker_streams, each stream from create_stream() runs its ops on a thread of its own
// (cpu/worker_streams.h: FIFO, CUDA's event rules, an op's exception rethrown at the next
// synchronize of its stream), so an offload copy stream overlaps compute for real;
// kDefaultStream stays inline.
//
//   CpuBackend be;                            // or CpuBackend be({.worker_streams = true});
//   HostProvider host;
//   CachingAllocator alloc(host, {}, &be.stream_sync());
//   be.gemm(kDefaultStream, d, a, b, c);      // done when it returns
//   StreamId copy = be.create_stream();
//   be.copy(copy, grad, grad_host);           // queued on the worker; views captured by value
//   EventHandle e = be.record_event(copy);
//   be.wait_event(kDefaultStream, e);         // the caller blocks until the copy is done
//
// On a worker stream the tensors' memory must stay alive (and unwritten by the host) until the
// op has run, as on a GPU. One difference from CUDA: a caching allocator returning a free
// segment to its provider (empty_cache, release_before_growth) does not wait for workers as
// cudaFree waits for the device, so memory freed while a worker may still use it must be
// marked with Block::record_stream(worker stream), which makes the allocator wait for it. A
// token or target id outside the vocabulary on a worker stream surfaces as InvalidArgument at
// that stream's next synchronize. Kernels run with OpenMP from whichever thread runs the
// stream, so two busy streams share the cores.
// GEMM accumulates in FP32 through one of two engines (cpu/gemm_engine.h, MEMFIT_CPU_GEMM):
// oneDNN's matmul on the operands as stored, where the CPU has the instructions (bf16 with
// AVX512-BF16, f32 with AVX-512), or OpenBLAS's cblas_sgemm with f16/bf16 operands widened
// (exactly) to f32 in scratch and a non-f32 C computed in f32 scratch (holding the widened old
// C when beta != 0) and rounded once to its dtype. Scratch per call is oneDNN's scratchpad, or
// at most one A, one B and one C matrix of f32 (none when all three are f32). It comes from
//   - the caching allocator given to set_workspace_allocator(), as Category::kWorkspace blocks
//     on the op's stream, tagged "cpu.gemm.scratch", so it counts against the budget like a
//     device's workspace would (for a worker stream: taken by the calling thread on the default
//     stream, recorded on the worker's stream and freed at once, so workers never call into
//     the allocator); or, when none is set (the default),
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
// Thread safety: as Backend (backend.h); the GEMM scratch pool hands concurrent GEMMs (two
// streams) distinct buffers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/backend.h"
#include "core/cpu/scratch_pool.h"
#include "core/cpu/worker_streams.h"

namespace memfit {

struct CpuBackendOptions {
  // Streams from create_stream() each run their ops on a worker thread of their own (a FIFO
  // queue), so a copy stream overlaps the caller's compute for real; kDefaultStream stays
  // inline. Off: every stream runs inline (the reference behaviour, no threads).
  bool worker_streams = false;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(CpuBackendOptions options = {});
  ~CpuBackend() override;  // drains every worker stream first
  Device device() const override { return Device::kCpu; }
  const char* name() const override { return "cpu"; }
  const CpuBackendOptions& options() const { return options_; }

  // GEMM scratch from `alloc` from now on (nullptr: the backend's own pool). `alloc` must
  // outlive its use here; it may itself be built on stream_sync(). Drains the worker streams
  // first, so no queued GEMM sees the switch half-way.
  void set_workspace_allocator(CachingAllocator* alloc) override;
  std::size_t scratch_bytes() const { return scratch_.held_bytes(); }  // pool only
  void release_scratch() { scratch_.release_idle(); }
  std::size_t live_events() const { return streams_.live_events(); }  // for leak tests

 protected:
  StreamId do_create_stream() override { return streams_.create(); }
  void do_destroy_stream(StreamId stream) override { streams_.destroy(stream); }
  bool do_has_stream(StreamId stream) const override { return streams_.has(stream); }
  void do_synchronize(StreamId stream) override { streams_.synchronize(stream); }
  EventHandle do_record_event(StreamId stream) override { return streams_.record(stream); }
  bool do_has_event(EventHandle event) const override { return streams_.has_event(event); }
  bool do_query_event(EventHandle event) override { return streams_.query(event); }
  void do_synchronize_event(EventHandle event) override { streams_.synchronize_event(event); }
  void do_wait_event(StreamId stream, EventHandle event) override { streams_.wait(stream, event); }
  void do_release_event(EventHandle event) override { streams_.release(event); }

  // Each op runs run_<op> inline, or queues it on the stream's worker with its views copied
  // (cpu_backend.cpp).
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

  // ---- conv2d (conv helper's section: conv_ops.cpp) ----
  void do_conv2d_forward(StreamId stream, const Conv2dDesc& d, const Tensor& inp,
                         const Tensor& weight, const Tensor& out) override;
  void do_conv2d_backward(StreamId stream, const Conv2dDesc& d, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor* dinp,
                          const Tensor& dweight) override;
  // ---- end conv2d ----

  // cblas_sgemm takes 32-bit sizes (the oneDNN path would not need the limit).
  std::int64_t max_gemm_dim() const override;

 private:
  // The kernels, on whichever thread runs the stream (gemm.cpp, cpu_backend.cpp, nn_ops.cpp,
  // attention_ops.cpp). They read scratch_ (thread-safe) and workspace_ (fixed while work is
  // queued: set_workspace_allocator drains first).
  void run_gemm(StreamId stream, const GemmDesc& d, const Tensor& a, const Tensor& b,
                const Tensor& c);
  void run_fill(StreamId stream, const Tensor& x, float value);
  void run_copy(StreamId stream, const Tensor& src, const Tensor& dst);
  void run_cast(StreamId stream, const Tensor& src, const Tensor& dst);
  void run_axpy(StreamId stream, float a, const Tensor& x, const Tensor& y);
  void run_scale(StreamId stream, float a, const Tensor& x);
  void run_sumsq(StreamId stream, const Tensor& x, const Tensor& out);

  void run_layernorm_forward(StreamId stream, const Tensor& inp, const Tensor& weight,
                             const Tensor& bias, float eps, const Tensor& out, const Tensor& mean,
                             const Tensor& rstd);
  void run_layernorm_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                              const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                              const Tensor& dinp, const Tensor& dweight, const Tensor& dbias);
  void run_gelu_forward(StreamId stream, const Tensor& inp, const Tensor& out);
  void run_gelu_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                         const Tensor& dinp);
  void run_add(StreamId stream, const Tensor& a, const Tensor& b, const Tensor& out);
  void run_add_bias(StreamId stream, const Tensor& bias, const Tensor& out);
  void run_bias_backward(StreamId stream, const Tensor& dout, const Tensor& dbias);
  void run_softmax_causal_forward(StreamId stream, const Tensor& preatt, float scale,
                                  const Tensor& att, std::int64_t t);
  void run_softmax_causal_backward(StreamId stream, const Tensor& datt, const Tensor& att,
                                   float scale, const Tensor& dpreatt, std::int64_t t);
  void run_split_heads(StreamId stream, const Tensor& src, const Tensor& dst, const HeadDims& d);
  void run_merge_heads(StreamId stream, const Tensor& src, const Tensor& dst, const HeadDims& d);
  void run_flash_attention_forward(const Tensor& qkv, const AttentionDims& d, const Tensor& out,
                                   const Tensor& lse);
  void run_flash_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, const AttentionDims& d, const Tensor& delta,
                                    const Tensor& dqkv);
  void run_rmsnorm_forward(const Tensor& inp, const Tensor& weight, float eps, const Tensor& out,
                           const Tensor& rstd);
  void run_rmsnorm_backward(const Tensor& dout, const Tensor& inp, const Tensor& weight,
                            const Tensor& rstd, const Tensor& dinp, const Tensor& dweight);
  void run_rope(const Tensor& qkv, const AttentionDims& d, const RopeFreqs& f, bool inverse);
  void run_qk_norm_forward(const Tensor& qkv, const AttentionDims& d, const Tensor& q_weight,
                           const Tensor& k_weight, float eps, const Tensor& qk_in,
                           const Tensor& rstd);
  void run_qk_norm_backward(const Tensor& dqkv, const Tensor& qk_in, const Tensor& rstd,
                            const AttentionDims& d, const Tensor& q_weight, const Tensor& k_weight,
                            const Tensor& dq_weight, const Tensor& dk_weight);
  void run_swiglu_forward(const Tensor& gate_up, const Tensor& out);
  void run_swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up);
  void run_embedding_forward(StreamId stream, const IndexTensor& tokens, const Tensor& wte,
                             const Tensor* wpe, const Tensor& out);
  void run_embedding_backward(StreamId stream, const Tensor& dout, const IndexTensor& tokens,
                              const Tensor& dwte, const Tensor* dwpe);
  void run_crossentropy_forward(StreamId stream, const Tensor& logits, const IndexTensor& targets,
                                std::int64_t vocab, const Tensor& losses, const Tensor& lse);
  void run_crossentropy_backward(StreamId stream, const Tensor& logits, const Tensor& lse,
                                 const IndexTensor& targets, std::int64_t vocab, float dloss,
                                 const Tensor* dlosses, const Tensor& dlogits);
  void run_adamw(StreamId stream, const AdamWConstants& k, const Tensor& param, const Tensor& grad,
                 const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* param_out);

  // ---- conv2d (conv helper's section: conv_ops.cpp) ----
  // Direct loops, channels-last, FP32 accumulation; OpenMP over output rows (forward), input
  // rows (dinp) and filter blocks (dweight), so every element is summed by one thread in a
  // fixed order and the bits do not depend on the thread count. Scratch is heap memory outside
  // any budget: the f32 weights when they are not f32 (K*R*S*C floats, small) and a few f32
  // image rows per thread.
  void run_conv2d_forward(const Conv2dDesc& d, const Tensor& inp, const Tensor& weight,
                          const Tensor& out);
  void run_conv2d_backward(const Conv2dDesc& d, const Tensor& dout, const Tensor& inp,
                           const Tensor& weight, const Tensor* dinp, const Tensor& dweight);
  // ---- end conv2d ----

  template <typename F>
  void submit(StreamId stream, F&& op);

  CpuBackendOptions options_;
  cpu::ScratchPool scratch_;
  CachingAllocator* workspace_ = nullptr;
  // Last member: destroyed first, so workers stop before the state their ops use goes.
  cpu::WorkerStreams streams_;
};

namespace cpu {

// Floats of scratch gemm() needs (gemm_engine.h's plan_gemm under MEMFIT_CPU_GEMM): oneDNN's
// scratchpad, or on the BLAS path m*k if A is not f32, k*n if B is not, m*n if C is not.
// MetaBackend calls it too, so a dry run takes the same scratch.
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
