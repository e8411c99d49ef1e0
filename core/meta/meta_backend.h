// MetaBackend: the dry-run backend. It accepts and rejects exactly the calls every backend
// does (the checks live in Backend), then does no arithmetic and touches no memory: its
// tensors (Device::kMeta) hold NullProvider addresses that must never be dereferenced. What it
// records instead is the work it was asked for, so a planner can turn a dry-run step into an
// estimated time (flops over a device's rate, bytes over its bandwidth).
//
//   NullProvider null;
//   MetaBackend meta;
//   CachingAllocator alloc(null, {}, &meta.stream_sync());
//   ... run the real executor with `meta` ...
//   MetaStats s = meta.stats();   // s.gemm_flops, s.bytes_moved(), s.calls(MetaOp::kGemm)
//
// Bytes: each op counts the operand bytes it must read and write once (an accumulated output,
// +=, is read and written; an in-place output is read as the input and written once).
//
// Streams and events behave as on the CPU backend (inline: events complete when recorded).
// Thread-safe: stats are updated under a mutex.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/backend.h"
#include "core/cpu/inline_streams.h"

namespace memfit {

// One entry per do_* primitive. attention_forward/backward are composed in Backend, so they
// count as their parts: kSplitHeads, kGemm (two or four), kSoftmaxCausal*, kMergeHeads.
// flash_attention_forward/backward are one primitive each: their products (q.k, p.v and, in
// the backward, the five of FlashAttention-2) run at matrix-unit rates and count in
// gemm_flops over the live (j <= i) pairs only; the softmax arithmetic counts in other_flops.
enum class MetaOp : std::uint8_t {
  kGemm,
  kFill,
  kCopy,
  kCast,
  kAxpy,
  kScale,
  kSumSq,
  kLayerNormForward,
  kLayerNormBackward,
  kGeluForward,
  kGeluBackward,
  kAdd,
  kAddBias,
  kBiasBackward,
  kSoftmaxCausalForward,
  kSoftmaxCausalBackward,
  kSplitHeads,
  kMergeHeads,
  kFlashAttentionForward,
  kFlashAttentionBackward,
  kRmsNormForward,
  kRmsNormBackward,
  kRope,
  kQkNormForward,
  kQkNormBackward,
  kSwiGluForward,
  kSwiGluBackward,
  kEmbeddingForward,
  kEmbeddingBackward,
  kCrossEntropyForward,
  kCrossEntropyBackward,
  kAdamW,
  // ---- conv2d (conv helper's section: meta_conv.cpp) ----
  kConv2dForward,
  kConv2dBackward,
  // ---- end conv2d ----
  kCount
};
inline constexpr std::size_t kMetaOps = static_cast<std::size_t>(MetaOp::kCount);
const char* meta_op_name(MetaOp op);  // "gemm", "fill", ..., "layernorm_forward", ...

// Flops the non-GEMM ops are counted at, per element they compute (a transcendental counts
// as one flop; llm.c-style estimates for a time model, not instruction counts). Causal
// softmax counts only the T(T+1)/2 live entries of each matrix; cross-entropy the V
// (unpadded) columns; embeddings one add per output (forward) or two (backward).
struct MetaFlops {
  static constexpr std::int64_t kLayerNormForward = 8;    // per inp element
  static constexpr std::int64_t kLayerNormBackward = 14;  // per inp element
  static constexpr std::int64_t kGeluForward = 10;
  static constexpr std::int64_t kGeluBackward = 18;
  static constexpr std::int64_t kSoftmaxForward = 4;        // per live score
  static constexpr std::int64_t kSoftmaxBackward = 5;       // per live score
  static constexpr std::int64_t kCrossEntropyForward = 3;   // per (row, j < V)
  static constexpr std::int64_t kCrossEntropyBackward = 4;  // per (row, j < V)
  static constexpr std::int64_t kAdamW = 16;                // per parameter (adamw.h's step)
  static constexpr std::int64_t kRmsNormForward = 4;        // per inp element
  static constexpr std::int64_t kRmsNormBackward = 8;       // per inp element
  static constexpr std::int64_t kRope = 3;                  // per rotated element (q and k)
  static constexpr std::int64_t kQkNormForward = 4;         // per normed element (q and k)
  static constexpr std::int64_t kQkNormBackward = 8;        // per normed element (q and k)
  static constexpr std::int64_t kSwiGluForward = 6;         // per out element
  static constexpr std::int64_t kSwiGluBackward = 12;       // per out element
};

struct OpRates;  // core/meta/op_rates.h

struct MetaStats {
  std::array<std::int64_t, static_cast<std::size_t>(MetaOp::kCount)> op_calls{};
  std::int64_t gemm_flops = 0;       // sum of GemmDesc::flops() (2*m*n*k*batch); saturates
  std::int64_t other_flops = 0;      // every other op, at MetaFlops' rates; saturates
  std::int64_t bytes_read = 0;       // operand bytes an op must read (C only when beta != 0)
  std::int64_t bytes_written = 0;    // operand bytes an op writes
  std::int64_t host_copy_bytes = 0;  // copy() bytes with one side on the host (transfers)
  double seconds = 0;                // with set_rates(): the ops' predicted seconds, summed
  std::array<double, static_cast<std::size_t>(MetaOp::kCount)> op_seconds{};  // ... by op

  std::int64_t calls(MetaOp op) const { return op_calls[static_cast<std::size_t>(op)]; }
  std::int64_t total_calls() const;
  std::int64_t bytes_moved() const { return bytes_read + bytes_written; }
  std::int64_t flops() const;  // gemm_flops + other_flops, saturating
};

class MetaBackend final : public cpu::InlineBackend {
 public:
  MetaBackend() = default;
  Device device() const override { return Device::kMeta; }
  const char* name() const override { return "meta"; }

  MetaStats stats() const;
  void reset_stats();

  // Rates to price each op at (op_rates.h): stats().seconds then adds up the step's predicted
  // compute time. nullptr (the default): seconds stays 0. `rates` must outlive the backend's
  // use of it.
  void set_rates(const OpRates* rates);

  // Mirrors CpuBackend::set_workspace_allocator: each GEMM then allocates (and frees on
  // return) the f32 scratch the CPU backend would take for it (cpu::gemm_scratch_floats,
  // Category::kWorkspace, tag "cpu.gemm.scratch"), so a dry run of a CPU run whose scratch
  // counts against the budget sees the same allocation sequence. nullptr (the default): no
  // scratch, as a CPU backend using its own pool. A CUDA plan models cuBLASLt's workspace
  // instead (its own allocation sequence).
  void set_workspace_allocator(CachingAllocator* alloc) override { workspace_ = alloc; }

  // ---- GPU GEMM workspace (gpuinteg) ----
  // bytes > 0: each GEMM with work allocates exactly `bytes` from the workspace allocator
  // instead of the CPU scratch (Category::kWorkspace, tag "cuda.gemm.workspace", on the op's
  // stream, freed on return): CudaBackend's cuBLASLt workspace, which is what the chosen
  // algorithm asks for and at most CudaBackendOptions::gemm_workspace_bytes, so with that cap
  // here a dry run for a GPU holds an upper bound of it. 0 (the default): the CPU scratch
  // above. Needs set_workspace_allocator() to take effect.
  void set_gemm_workspace_bytes(std::size_t bytes) { gemm_workspace_bytes_ = bytes; }
  std::size_t gemm_workspace_bytes() const { return gemm_workspace_bytes_; }
  // ---- end GPU GEMM workspace ----

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

  // ---- conv2d (conv helper's section: meta_conv.cpp) ----
  // A convolution is a GEMM in im2col form and runs at matrix-unit rates (cuDNN's implicit
  // GEMM), so its flops count in gemm_flops: forward Conv2dDesc::flops(), backward that once
  // for dweight and once more for dinp when asked. Bytes: inp and weight read, out written;
  // backward reads dout, inp, weight (and dweight, which accumulates) and writes dinp and
  // dweight. No scratch is modelled (the CPU kernels take none from the allocator).
  void do_conv2d_forward(StreamId stream, const Conv2dDesc& d, const Tensor& inp,
                         const Tensor& weight, const Tensor& out) override;
  void do_conv2d_backward(StreamId stream, const Conv2dDesc& d, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor* dinp,
                          const Tensor& dweight) override;
  // ---- end conv2d ----

  // Same limit as cuBLAS and CBLAS, so a plan that dry-runs here also runs there.
  std::int64_t max_gemm_dim() const override;

 private:
  // One call of `op` on tensors of dtype `dt` (its main operand's): bytes read and written,
  // flops (gemm_flops for kGemm, other_flops otherwise) and bytes of a host transfer.
  void count(MetaOp op, DType dt, std::int64_t read, std::int64_t written, std::int64_t flops = 0,
             std::int64_t host_bytes = 0);
  // As count(), with `matmul_flops` added to gemm_flops (matrix-unit work: conv2d, flash
  // attention) and `flops` to other_flops.
  void count_matmul(MetaOp op, DType dt, std::int64_t read, std::int64_t written,
                    std::int64_t matmul_flops, std::int64_t flops = 0);
  void record(MetaOp op, DType dt, std::int64_t read, std::int64_t written,
              std::int64_t matmul_flops, std::int64_t flops, std::int64_t host_bytes);

  mutable std::mutex mu_;
  MetaStats stats_;
  const OpRates* rates_ = nullptr;
  CachingAllocator* workspace_ = nullptr;
  std::size_t gemm_workspace_bytes_ = 0;  // gpuinteg: see set_gemm_workspace_bytes
};

}  // namespace memfit
