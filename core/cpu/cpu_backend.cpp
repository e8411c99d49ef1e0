// CPU elementwise ops: FP32 math over 4096-element chunks, widened from and rounded back to
// each tensor's dtype with memfit::convert; OpenMP across chunks once a tensor is large
// enough for threads to pay off. At the end: every op's dispatch, inline or to the stream's
// worker (cpu/worker_streams.h).
#include "core/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "core/cpu/sumsq.h"
#include "memory/caching_allocator.h"
#include "memory/size.h"

namespace memfit {
namespace {

constexpr std::int64_t kChunk = 4096;             // 16 KiB of f32: stays in L1/L2
constexpr std::int64_t kParallelMin = 64 * 1024;  // below this a thread team costs more

char* element(const Tensor& t, std::int64_t offset) {
  return static_cast<char*>(t.raw()) + static_cast<std::size_t>(offset) * dtype_size(t.dtype());
}

// Runs f(offset, count) over [0, n) in chunks; in parallel when n is large. f must not throw.
template <typename F>
void for_chunks(std::int64_t n, F&& f) {
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < chunks; ++i) {
    const std::int64_t off = i * kChunk;
    f(off, std::min(kChunk, n - off));
  }
}

// f32 pointer to `count` elements of t from `off`: t's memory when it is f32, else `buf`
// holding them widened. Writes through it reach t only after store().
float* load(const Tensor& t, std::int64_t off, std::int64_t count, float* buf) {
  if (t.dtype() == DType::kF32) return reinterpret_cast<float*>(element(t, off));
  convert(element(t, off), t.dtype(), buf, DType::kF32, static_cast<std::size_t>(count));
  return buf;
}

void store(const float* v, const Tensor& t, std::int64_t off, std::int64_t count) {
  if (t.dtype() == DType::kF32) return;  // v was t's own memory
  convert(v, DType::kF32, element(t, off), t.dtype(), static_cast<std::size_t>(count));
}

}  // namespace

void CpuBackend::run_fill(StreamId, const Tensor& x, float value) {
  if (x.dtype() == DType::kF32) {
    float* p = static_cast<float*>(x.raw());
    for_chunks(x.numel(),
               [&](std::int64_t off, std::int64_t n) { std::fill_n(p + off, n, value); });
    return;
  }
  std::uint16_t bits = 0;
  convert(&value, DType::kF32, &bits, x.dtype(), 1);
  std::uint16_t* p = static_cast<std::uint16_t*>(x.raw());
  for_chunks(x.numel(), [&](std::int64_t off, std::int64_t n) { std::fill_n(p + off, n, bits); });
}

void CpuBackend::run_copy(StreamId, const Tensor& src, const Tensor& dst) {
  if (src.nbytes() > 0) std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

void CpuBackend::run_cast(StreamId, const Tensor& src, const Tensor& dst) {
  for_chunks(src.numel(), [&](std::int64_t off, std::int64_t n) {
    convert(element(src, off), src.dtype(), element(dst, off), dst.dtype(),
            static_cast<std::size_t>(n));
  });
}

void CpuBackend::run_axpy(StreamId, float a, const Tensor& x, const Tensor& y) {
  for_chunks(x.numel(), [&](std::int64_t off, std::int64_t n) {
    float bx[kChunk];
    float by[kChunk];
    const float* xv = load(x, off, n, bx);
    float* yv = load(y, off, n, by);
    for (std::int64_t i = 0; i < n; ++i) yv[i] += a * xv[i];
    store(yv, y, off, n);
  });
}

void CpuBackend::run_scale(StreamId, float a, const Tensor& x) {
  for_chunks(x.numel(), [&](std::int64_t off, std::int64_t n) {
    float bx[kChunk];
    float* xv = load(x, off, n, bx);
    for (std::int64_t i = 0; i < n; ++i) xv[i] *= a;
    store(xv, x, off, n);
  });
}

void CpuBackend::run_sumsq(StreamId, const Tensor& x, const Tensor& out) {
  const std::int64_t n = x.numel();
  const std::int64_t blocks = (n + kSumSqBlock - 1) / kSumSqBlock;
  // One partial per fixed-size block, added in block order: the same bits for any number
  // of threads.
  std::vector<double> sums(static_cast<std::size_t>(blocks), 0.0);
  std::vector<std::int64_t> bad(static_cast<std::size_t>(blocks), 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    float buf[kChunk];
    double s = 0.0;
    std::int64_t nf = 0;
    const std::int64_t end = std::min(n, (blk + 1) * kSumSqBlock);
    for (std::int64_t off = blk * kSumSqBlock; off < end; off += kChunk) {
      const std::int64_t m = std::min(kChunk, end - off);
      sumsq_block(load(x, off, m, buf), m, s, nf);
    }
    sums[static_cast<std::size_t>(blk)] = s;
    bad[static_cast<std::size_t>(blk)] = nf;
  }
  double total = 0.0;
  std::int64_t nonfinite = 0;
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    total += sums[static_cast<std::size_t>(blk)];
    nonfinite += bad[static_cast<std::size_t>(blk)];
  }
  float* o = static_cast<float*>(out.raw());
  o[0] = static_cast<float>(static_cast<double>(o[0]) + total);
  o[1] = static_cast<float>(static_cast<double>(o[1]) + static_cast<double>(nonfinite));
}

}  // namespace memfit

// ---- dispatch: inline, or queued on the stream's worker --------------------------------------
// Every operand is a view (or plain data) captured by value, so the queued op does not depend
// on the caller's arguments outliving the call; the memory behind the views must live on, as
// on a GPU.

namespace memfit {

CpuBackend::CpuBackend(CpuBackendOptions options)
    : options_(options), streams_(options.worker_streams) {}

CpuBackend::~CpuBackend() = default;  // streams_ goes first: it drains and joins the workers

void CpuBackend::set_workspace_allocator(CachingAllocator* alloc) {
  streams_.drain_all();
  workspace_ = alloc;
}

template <typename F>
void CpuBackend::submit(StreamId stream, F&& op) {
  if (streams_.runs_inline(stream)) {
    op();
  } else {
    streams_.enqueue(stream, std::forward<F>(op));
  }
}

void CpuBackend::do_gemm(StreamId s, const GemmDesc& d, const Tensor& a, const Tensor& b,
                         const Tensor& c) {
  const std::size_t floats =
      streams_.runs_inline(s) || workspace_ == nullptr ? 0 : cpu::gemm_scratch_floats(d, a, b, c);
  if (floats == 0) {
    submit(s, [this, s, d, a, b, c] { run_gemm(s, d, a, b, c); });
    return;
  }
  // Workspace scratch for a worker is taken here, on the caller's thread, PyTorch's way for
  // memory used on another stream: allocated on the default stream, recorded on s, freed at
  // once. The allocator then reuses or releases it only after s has passed the GEMM, and the
  // worker never calls into the allocator: a caller holding the allocator's lock while it
  // waits for s (empty_cache, an OOM retry) cannot deadlock against it.
  Block ws = workspace_->allocate(checked_mul(floats, sizeof(float), "CPU GEMM scratch"),
                                  Category::kWorkspace, kDefaultStream, "cpu.gemm.scratch");
  float* scratch = ws.as<float>();
  streams_.enqueue(s, [d, a, b, c, scratch] { cpu::gemm(d, a, b, c, scratch); });
  ws.record_stream(s);
}
void CpuBackend::do_fill(StreamId s, const Tensor& x, float value) {
  submit(s, [this, s, x, value] { run_fill(s, x, value); });
}
void CpuBackend::do_copy(StreamId s, const Tensor& src, const Tensor& dst) {
  submit(s, [this, s, src, dst] { run_copy(s, src, dst); });
}
void CpuBackend::do_cast(StreamId s, const Tensor& src, const Tensor& dst) {
  submit(s, [this, s, src, dst] { run_cast(s, src, dst); });
}
void CpuBackend::do_axpy(StreamId s, float a, const Tensor& x, const Tensor& y) {
  submit(s, [this, s, a, x, y] { run_axpy(s, a, x, y); });
}
void CpuBackend::do_scale(StreamId s, float a, const Tensor& x) {
  submit(s, [this, s, a, x] { run_scale(s, a, x); });
}
void CpuBackend::do_sumsq(StreamId s, const Tensor& x, const Tensor& out) {
  submit(s, [this, s, x, out] { run_sumsq(s, x, out); });
}

void CpuBackend::do_layernorm_forward(StreamId s, const Tensor& inp, const Tensor& weight,
                                      const Tensor& bias, float eps, const Tensor& out,
                                      const Tensor& mean, const Tensor& rstd) {
  submit(s, [this, s, inp, weight, bias, eps, out, mean, rstd] {
    run_layernorm_forward(s, inp, weight, bias, eps, out, mean, rstd);
  });
}
void CpuBackend::do_layernorm_backward(StreamId s, const Tensor& dout, const Tensor& inp,
                                       const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                       const Tensor& dinp, const Tensor& dweight,
                                       const Tensor& dbias) {
  submit(s, [this, s, dout, inp, weight, mean, rstd, dinp, dweight, dbias] {
    run_layernorm_backward(s, dout, inp, weight, mean, rstd, dinp, dweight, dbias);
  });
}
void CpuBackend::do_gelu_forward(StreamId s, const Tensor& inp, const Tensor& out) {
  submit(s, [this, s, inp, out] { run_gelu_forward(s, inp, out); });
}
void CpuBackend::do_gelu_backward(StreamId s, const Tensor& dout, const Tensor& inp,
                                  const Tensor& dinp) {
  submit(s, [this, s, dout, inp, dinp] { run_gelu_backward(s, dout, inp, dinp); });
}
void CpuBackend::do_add(StreamId s, const Tensor& a, const Tensor& b, const Tensor& out) {
  submit(s, [this, s, a, b, out] { run_add(s, a, b, out); });
}
void CpuBackend::do_add_bias(StreamId s, const Tensor& bias, const Tensor& out) {
  submit(s, [this, s, bias, out] { run_add_bias(s, bias, out); });
}
void CpuBackend::do_bias_backward(StreamId s, const Tensor& dout, const Tensor& dbias) {
  submit(s, [this, s, dout, dbias] { run_bias_backward(s, dout, dbias); });
}
void CpuBackend::do_softmax_causal_forward(StreamId s, const Tensor& preatt, float scale,
                                           const Tensor& att, std::int64_t t) {
  submit(s, [this, s, preatt, scale, att, t] {
    run_softmax_causal_forward(s, preatt, scale, att, t);
  });
}
void CpuBackend::do_softmax_causal_backward(StreamId s, const Tensor& datt, const Tensor& att,
                                            float scale, const Tensor& dpreatt, std::int64_t t) {
  submit(s, [this, s, datt, att, scale, dpreatt, t] {
    run_softmax_causal_backward(s, datt, att, scale, dpreatt, t);
  });
}
void CpuBackend::do_split_heads(StreamId s, const Tensor& src, const Tensor& dst,
                                const HeadDims& d) {
  submit(s, [this, s, src, dst, d] { run_split_heads(s, src, dst, d); });
}
void CpuBackend::do_merge_heads(StreamId s, const Tensor& src, const Tensor& dst,
                                const HeadDims& d) {
  submit(s, [this, s, src, dst, d] { run_merge_heads(s, src, dst, d); });
}
void CpuBackend::do_flash_attention_forward(StreamId s, const Tensor& qkv, const AttentionDims& d,
                                            const Tensor& out, const Tensor& lse) {
  submit(s, [this, qkv, d, out, lse] { run_flash_attention_forward(qkv, d, out, lse); });
}
void CpuBackend::do_flash_attention_backward(StreamId s, const Tensor& dout, const Tensor& qkv,
                                             const Tensor& out, const Tensor& lse,
                                             const AttentionDims& d, const Tensor& delta,
                                             const Tensor& dqkv) {
  submit(s, [this, dout, qkv, out, lse, d, delta, dqkv] {
    run_flash_attention_backward(dout, qkv, out, lse, d, delta, dqkv);
  });
}
void CpuBackend::do_rmsnorm_forward(StreamId s, const Tensor& inp, const Tensor& weight, float eps,
                                    const Tensor& out, const Tensor& rstd) {
  submit(s,
         [this, inp, weight, eps, out, rstd] { run_rmsnorm_forward(inp, weight, eps, out, rstd); });
}
void CpuBackend::do_rmsnorm_backward(StreamId s, const Tensor& dout, const Tensor& inp,
                                     const Tensor& weight, const Tensor& rstd, const Tensor& dinp,
                                     const Tensor& dweight) {
  submit(s, [this, dout, inp, weight, rstd, dinp, dweight] {
    run_rmsnorm_backward(dout, inp, weight, rstd, dinp, dweight);
  });
}
void CpuBackend::do_rope(StreamId s, const Tensor& qkv, const AttentionDims& d, const RopeFreqs& f,
                         bool inverse) {
  submit(s, [this, qkv, d, f, inverse] { run_rope(qkv, d, f, inverse); });
}
void CpuBackend::do_qk_norm_forward(StreamId s, const Tensor& qkv, const AttentionDims& d,
                                    const Tensor& q_weight, const Tensor& k_weight, float eps,
                                    const Tensor& qk_in, const Tensor& rstd) {
  submit(s, [this, qkv, d, q_weight, k_weight, eps, qk_in, rstd] {
    run_qk_norm_forward(qkv, d, q_weight, k_weight, eps, qk_in, rstd);
  });
}
void CpuBackend::do_qk_norm_backward(StreamId s, const Tensor& dqkv, const Tensor& qk_in,
                                     const Tensor& rstd, const AttentionDims& d,
                                     const Tensor& q_weight, const Tensor& k_weight,
                                     const Tensor& dq_weight, const Tensor& dk_weight) {
  submit(s, [this, dqkv, qk_in, rstd, d, q_weight, k_weight, dq_weight, dk_weight] {
    run_qk_norm_backward(dqkv, qk_in, rstd, d, q_weight, k_weight, dq_weight, dk_weight);
  });
}
void CpuBackend::do_swiglu_forward(StreamId s, const Tensor& gate_up, const Tensor& out) {
  submit(s, [this, gate_up, out] { run_swiglu_forward(gate_up, out); });
}
void CpuBackend::do_swiglu_backward(StreamId s, const Tensor& dout, const Tensor& gate_up,
                                    const Tensor& dgate_up) {
  submit(s, [this, dout, gate_up, dgate_up] { run_swiglu_backward(dout, gate_up, dgate_up); });
}
// The optional position table travels by value (the caller's Tensor may be gone when a worker
// stream runs the op), with `has` saying whether there is one.
void CpuBackend::do_embedding_forward(StreamId s, const IndexTensor& tokens, const Tensor& wte,
                                      const Tensor* wpe, const Tensor& out) {
  const bool has = wpe != nullptr;
  const Tensor p = has ? *wpe : wte;
  submit(s, [this, s, tokens, wte, has, p, out] {
    run_embedding_forward(s, tokens, wte, has ? &p : nullptr, out);
  });
}
void CpuBackend::do_embedding_backward(StreamId s, const Tensor& dout, const IndexTensor& tokens,
                                       const Tensor& dwte, const Tensor* dwpe) {
  const bool has = dwpe != nullptr;
  const Tensor p = has ? *dwpe : dwte;
  submit(s, [this, s, dout, tokens, dwte, has, p] {
    run_embedding_backward(s, dout, tokens, dwte, has ? &p : nullptr);
  });
}
void CpuBackend::do_crossentropy_forward(StreamId s, const Tensor& logits,
                                         const IndexTensor& targets, std::int64_t vocab,
                                         const Tensor& losses, const Tensor& lse) {
  submit(s, [this, s, logits, targets, vocab, losses, lse] {
    run_crossentropy_forward(s, logits, targets, vocab, losses, lse);
  });
}
void CpuBackend::do_crossentropy_backward(StreamId s, const Tensor& logits, const Tensor& lse,
                                          const IndexTensor& targets, std::int64_t vocab,
                                          float dloss, const Tensor* dlosses,
                                          const Tensor& dlogits) {
  // The optional operand travels as a value too (a null view stands for "none").
  const bool has = dlosses != nullptr;
  const Tensor dl = has ? *dlosses : Tensor();
  submit(s, [this, s, logits, lse, targets, vocab, dloss, has, dl, dlogits] {
    run_crossentropy_backward(s, logits, lse, targets, vocab, dloss, has ? &dl : nullptr, dlogits);
  });
}
void CpuBackend::do_adamw(StreamId s, const AdamWConstants& k, const Tensor& param,
                          const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                          const Tensor* param_out) {
  const bool has = param_out != nullptr;
  const Tensor out = has ? *param_out : Tensor();
  submit(s, [this, s, k, param, grad, exp_avg, exp_avg_sq, has, out] {
    run_adamw(s, k, param, grad, exp_avg, exp_avg_sq, has ? &out : nullptr);
  });
}

}  // namespace memfit
