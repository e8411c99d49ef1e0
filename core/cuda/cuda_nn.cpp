// CudaBackend's neural-network ops (core/backend.h, "neural-network ops"): each resolves the
// validated shapes into sizes, makes the backend's device current, takes scratch where a
// reduction needs it, and calls its launcher in nn_kernels.cu (attention_kernels.cu for flash
// attention). Every launcher's status (the
// cudaGetLastError after its launches, or CUB's status) becomes CudaError naming the call.
#include <cstdint>
#include <string>

#include "core/cuda/attention_kernels.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_backend_impl.h"
#include "core/cuda/nn_kernels.h"
#include "memory/cuda/cuda_check.h"
#include "memory/error.h"

namespace memfit {

static_assert(static_cast<int>(DType::kF32) == cuda::kCodeF32);
static_assert(static_cast<int>(DType::kF16) == cuda::kCodeF16);
static_assert(static_cast<int>(DType::kBF16) == cuda::kCodeBF16);

namespace {

int code(const Tensor& t) { return static_cast<int>(t.dtype()); }
std::int64_t last_dim(const Tensor& t) { return t.size(t.ndim() - 1); }
std::int64_t rows_of(const Tensor& t) {
  const std::int64_t c = last_dim(t);
  return c == 0 ? 0 : t.numel() / c;
}
float* f32(const Tensor& t) { return static_cast<float*>(t.raw()); }

}  // namespace

void CudaBackend::do_layernorm_forward(StreamId stream, const Tensor& inp, const Tensor& weight,
                                       const Tensor& bias, float eps, const Tensor& out,
                                       const Tensor& mean, const Tensor& rstd) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_layernorm_forward(
      inp.raw(), code(inp), weight.raw(), code(weight), bias.raw(), code(bias), eps, out.raw(),
      code(out), f32(mean), f32(rstd), rows_of(inp), last_dim(inp), cuda_stream(stream)));
}

void CudaBackend::do_layernorm_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                                        const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd, const Tensor& dinp,
                                        const Tensor& dweight, const Tensor& dbias) {
  cuda::DeviceGuard guard(options_.device);
  const std::int64_t n = rows_of(inp), c = last_dim(inp);
  CudaScratch partials(*this, stream, cuda::layernorm_backward_scratch_bytes(n, c),
                       "cuda.layernorm_backward.partials");
  MEMFIT_CUDA_CHECK(cuda::launch_layernorm_backward(
      dout.raw(), code(dout), inp.raw(), code(inp), weight.raw(), code(weight), f32(mean),
      f32(rstd), dinp.raw(), code(dinp), f32(dweight), f32(dbias), n, c, partials.data(),
      cuda_stream(stream)));
}

// Llama-family ops (nn_kernels.cu). RMSNorm's dweight is reduced as layernorm's: partials per
// chunk of rows in scratch, added in chunk order (deterministic).
void CudaBackend::do_rmsnorm_forward(StreamId stream, const Tensor& inp, const Tensor& weight,
                                     float eps, const Tensor& out, const Tensor& rstd) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_rmsnorm_forward(inp.raw(), code(inp), weight.raw(), code(weight),
                                                 eps, out.raw(), code(out), f32(rstd), rows_of(inp),
                                                 last_dim(inp), cuda_stream(stream)));
}

void CudaBackend::do_rmsnorm_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                                      const Tensor& weight, const Tensor& rstd, const Tensor& dinp,
                                      const Tensor& dweight) {
  cuda::DeviceGuard guard(options_.device);
  const std::int64_t n = rows_of(inp), c = last_dim(inp);
  CudaScratch partials(*this, stream, cuda::rmsnorm_backward_scratch_bytes(n, c),
                       "cuda.rmsnorm_backward.partials");
  MEMFIT_CUDA_CHECK(cuda::launch_rmsnorm_backward(
      dout.raw(), code(dout), inp.raw(), code(inp), weight.raw(), code(weight), f32(rstd),
      dinp.raw(), code(dinp), f32(dweight), n, c, partials.data(), cuda_stream(stream)));
}

// The launcher copies f's frequencies into the kernel's parameters: nothing on the device.
void CudaBackend::do_rope(StreamId stream, const Tensor& qkv, const AttentionDims& d,
                          const RopeFreqs& f, bool inverse) {
  static_assert(sizeof(f.inv_freq) / sizeof(f.inv_freq[0]) == cuda::kRopeMaxHalf);
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_rope(qkv.raw(), code(qkv), f.inv_freq, f.half, d.b, d.t, d.heads,
                                      d.kv_heads, inverse, cuda_stream(stream)));
}

// Qwen3's per-head q/k RMSNorm (nn_kernels.cu); the two weights share a dtype (backend.h).
void CudaBackend::do_qk_norm_forward(StreamId stream, const Tensor& qkv, const AttentionDims& d,
                                     const Tensor& q_weight, const Tensor& k_weight, float eps,
                                     const Tensor& qk_in, const Tensor& rstd) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_qk_norm_forward(
      qkv.raw(), code(qkv), q_weight.raw(), k_weight.raw(), code(q_weight), eps, qk_in.raw(),
      code(qk_in), f32(rstd), d.b, d.t, d.heads, d.kv_heads, d.hs, cuda_stream(stream)));
}

void CudaBackend::do_qk_norm_backward(StreamId stream, const Tensor& dqkv, const Tensor& qk_in,
                                      const Tensor& rstd, const AttentionDims& d,
                                      const Tensor& q_weight, const Tensor& k_weight,
                                      const Tensor& dq_weight, const Tensor& dk_weight) {
  cuda::DeviceGuard guard(options_.device);
  CudaScratch partials(*this, stream,
                       cuda::qk_norm_backward_scratch_bytes(d.b, d.t, d.heads, d.kv_heads, d.hs),
                       "cuda.qk_norm_backward.partials");
  MEMFIT_CUDA_CHECK(cuda::launch_qk_norm_backward(
      dqkv.raw(), code(dqkv), qk_in.raw(), code(qk_in), f32(rstd), q_weight.raw(), k_weight.raw(),
      code(q_weight), f32(dq_weight), f32(dk_weight), d.b, d.t, d.heads, d.kv_heads, d.hs,
      partials.data(), cuda_stream(stream)));
}

void CudaBackend::do_swiglu_forward(StreamId stream, const Tensor& gate_up, const Tensor& out) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_swiglu_forward(gate_up.raw(), code(gate_up), out.raw(), code(out),
                                                rows_of(gate_up), last_dim(gate_up) / 2,
                                                cuda_stream(stream)));
}

void CudaBackend::do_swiglu_backward(StreamId stream, const Tensor& dout, const Tensor& gate_up,
                                     const Tensor& dgate_up) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_swiglu_backward(
      dout.raw(), code(dout), gate_up.raw(), code(gate_up), dgate_up.raw(), code(dgate_up),
      rows_of(gate_up), last_dim(gate_up) / 2, cuda_stream(stream)));
}

void CudaBackend::do_gelu_forward(StreamId stream, const Tensor& inp, const Tensor& out) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_gelu_forward(inp.raw(), code(inp), out.raw(), code(out),
                                              inp.numel(), cuda_stream(stream)));
}

void CudaBackend::do_gelu_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                                   const Tensor& dinp) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_gelu_backward(dout.raw(), code(dout), inp.raw(), code(inp),
                                               dinp.raw(), code(dinp), inp.numel(),
                                               cuda_stream(stream)));
}

void CudaBackend::do_add(StreamId stream, const Tensor& a, const Tensor& b, const Tensor& out) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_add(a.raw(), code(a), b.raw(), code(b), out.raw(), code(out),
                                     a.numel(), cuda_stream(stream)));
}

void CudaBackend::do_add_bias(StreamId stream, const Tensor& bias, const Tensor& out) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_add_bias(bias.raw(), code(bias), out.raw(), code(out),
                                          rows_of(out), last_dim(out), cuda_stream(stream)));
}

void CudaBackend::do_bias_backward(StreamId stream, const Tensor& dout, const Tensor& dbias) {
  cuda::DeviceGuard guard(options_.device);
  const std::int64_t n = rows_of(dout), oc = last_dim(dout);
  CudaScratch partials(*this, stream, cuda::bias_backward_scratch_bytes(n, oc),
                       "cuda.bias_backward.partials");
  MEMFIT_CUDA_CHECK(cuda::launch_bias_backward(dout.raw(), code(dout), f32(dbias), n, oc,
                                               partials.data(), cuda_stream(stream)));
}

void CudaBackend::do_softmax_causal_forward(StreamId stream, const Tensor& preatt, float scale,
                                            const Tensor& att, std::int64_t t) {
  if (t == 0) return;
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(
      cuda::launch_softmax_causal_forward(preatt.raw(), code(preatt), scale, att.raw(), code(att),
                                          preatt.numel() / (t * t), t, cuda_stream(stream)));
}

void CudaBackend::do_softmax_causal_backward(StreamId stream, const Tensor& datt, const Tensor& att,
                                             float scale, const Tensor& dpreatt, std::int64_t t) {
  if (t == 0) return;
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_softmax_causal_backward(
      datt.raw(), code(datt), att.raw(), code(att), scale, dpreatt.raw(), code(dpreatt),
      att.numel() / (t * t), t, cuda_stream(stream)));
}

void CudaBackend::do_split_heads(StreamId stream, const Tensor& src, const Tensor& dst,
                                 const HeadDims& d) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_permute_heads(src.raw(), code(src), dst.raw(), code(dst), d.b, d.t,
                                               d.parts, d.heads, d.hs, true, cuda_stream(stream)));
}

void CudaBackend::do_merge_heads(StreamId stream, const Tensor& src, const Tensor& dst,
                                 const HeadDims& d) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_permute_heads(src.raw(), code(src), dst.raw(), code(dst), d.b, d.t,
                                               d.parts, d.heads, d.hs, false, cuda_stream(stream)));
}

// Flash attention: no scratch (the backward's delta is the caller's); attention_kernels.cu.
void CudaBackend::do_flash_attention_forward(StreamId stream, const Tensor& qkv,
                                             const AttentionDims& d, const Tensor& out,
                                             const Tensor& lse) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_flash_attention_forward(qkv.raw(), code(qkv), out.raw(), code(out),
                                                         f32(lse), d.b, d.t, d.heads, d.kv_heads,
                                                         d.hs, cuda_stream(stream)));
}

void CudaBackend::do_flash_attention_backward(StreamId stream, const Tensor& dout,
                                              const Tensor& qkv, const Tensor& out,
                                              const Tensor& lse, const AttentionDims& d,
                                              const Tensor& delta, const Tensor& dqkv) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_flash_attention_backward(
      dout.raw(), code(dout), qkv.raw(), code(qkv), out.raw(), code(out), f32(lse), f32(delta),
      dqkv.raw(), code(dqkv), d.b, d.t, d.heads, d.kv_heads, d.hs, cuda_stream(stream)));
}

void CudaBackend::do_embedding_forward(StreamId stream, const IndexTensor& tokens,
                                       const Tensor& wte, const Tensor* wpe, const Tensor& out) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_embedding_forward(
      tokens.data, wte.raw(), code(wte), wpe != nullptr ? wpe->raw() : nullptr,
      wpe != nullptr ? code(*wpe) : code(wte), out.raw(), code(out), tokens.shape[0],
      tokens.shape[1], wte.size(1), wte.size(0), cuda_stream(stream)));
}

void CudaBackend::do_embedding_backward(StreamId stream, const Tensor& dout,
                                        const IndexTensor& tokens, const Tensor& dwte,
                                        const Tensor* dwpe) {
  const std::int64_t b = tokens.shape[0], t = tokens.shape[1], c = dwte.size(1),
                     vocab = dwte.size(0);
  if (b * t == 0 || c == 0) return;
  // The gradient sorts (id, position) pairs with int32 positions (nn_kernels.cu).
  if (b * t > INT32_MAX || vocab > INT32_MAX) {
    throw InvalidArgument("Backend::embedding_backward (cuda): tokens is int32 " +
                          tokens.shape.str() + " with dwte " + dwte.shape().str() +
                          "; valid on this backend: B*T and V each < 2^31");
  }
  cuda::DeviceGuard guard(options_.device);
  std::size_t bytes = 0;
  MEMFIT_CUDA_CHECK(cuda::embedding_backward_scratch_bytes(b * t, vocab, &bytes));
  CudaScratch sort(*this, stream, bytes, "cuda.embedding_backward.sort");
  MEMFIT_CUDA_CHECK(cuda::launch_embedding_backward(
      dout.raw(), code(dout), tokens.data, f32(dwte), dwpe != nullptr ? f32(*dwpe) : nullptr, b, t,
      c, vocab, sort.data(), sort.size(), cuda_stream(stream)));
}

void CudaBackend::do_crossentropy_forward(StreamId stream, const Tensor& logits,
                                          const IndexTensor& targets, std::int64_t vocab,
                                          const Tensor& losses, const Tensor& lse) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_crossentropy_forward(logits.raw(), code(logits), targets.data,
                                                      vocab, f32(losses), f32(lse), targets.numel(),
                                                      last_dim(logits), cuda_stream(stream)));
}

void CudaBackend::do_crossentropy_backward(StreamId stream, const Tensor& logits, const Tensor& lse,
                                           const IndexTensor& targets, std::int64_t vocab,
                                           float dloss, const Tensor* dlosses,
                                           const Tensor& dlogits) {
  cuda::DeviceGuard guard(options_.device);
  MEMFIT_CUDA_CHECK(cuda::launch_crossentropy_backward(
      logits.raw(), code(logits), f32(lse), targets.data, vocab, dloss,
      dlosses != nullptr ? f32(*dlosses) : nullptr, dlogits.raw(), code(dlogits), targets.numel(),
      last_dim(logits), cuda_stream(stream)));
}

void CudaBackend::do_adamw(StreamId stream, const AdamWConstants& k, const Tensor& param,
                           const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                           const Tensor* param_out) {
  cuda::DeviceGuard guard(options_.device);
  const bool out = param_out != nullptr && param_out->numel() > 0;
  MEMFIT_CUDA_CHECK(cuda::launch_adamw(k, f32(param), grad.raw(), code(grad), f32(exp_avg),
                                       f32(exp_avg_sq), out ? param_out->raw() : nullptr,
                                       out ? code(*param_out) : cuda::kCodeF32, param.numel(),
                                       cuda_stream(stream)));
}

}  // namespace memfit
