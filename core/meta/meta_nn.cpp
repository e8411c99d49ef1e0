// MetaBackend's neural-network ops: operand bytes and MetaFlops-rate flops, never memory.
#include <cstdint>
#include <limits>

#include "core/meta/meta_backend.h"

namespace memfit {
namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

std::int64_t sadd(std::int64_t a, std::int64_t b) { return a > kMax - b ? kMax : a + b; }
std::int64_t smul(std::int64_t a, std::int64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > kMax / b ? kMax : a * b;
}
std::int64_t bytes(const Tensor& t) { return static_cast<std::int64_t>(t.nbytes()); }
template <typename... Ts>
std::int64_t bytes(const Tensor& t, const Ts&... rest) {
  return sadd(bytes(t), bytes(rest...));
}
std::int64_t bytes(const IndexTensor& t) { return smul(t.numel(), 4); }

// Live (j <= i) entries of the causal score matrices in a (R,T,T) tensor.
std::int64_t live_scores(const Tensor& scores, std::int64_t t) {
  if (t == 0) return 0;
  const std::int64_t mats = scores.numel() / (t * t);
  return smul(mats, t * (t + 1) / 2);
}

}  // namespace

void MetaBackend::do_layernorm_forward(StreamId, const Tensor& inp, const Tensor& weight,
                                       const Tensor& bias, float, const Tensor& out,
                                       const Tensor& mean, const Tensor& rstd) {
  count(MetaOp::kLayerNormForward, bytes(inp, weight, bias), bytes(out, mean, rstd),
        smul(MetaFlops::kLayerNormForward, inp.numel()));
}

void MetaBackend::do_layernorm_backward(StreamId, const Tensor& dout, const Tensor& inp,
                                        const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd, const Tensor& dinp,
                                        const Tensor& dweight, const Tensor& dbias) {
  // dinp, dweight and dbias accumulate: read and written.
  count(MetaOp::kLayerNormBackward, bytes(dout, inp, weight, mean, rstd, dinp, dweight, dbias),
        bytes(dinp, dweight, dbias), smul(MetaFlops::kLayerNormBackward, inp.numel()));
}

void MetaBackend::do_gelu_forward(StreamId, const Tensor& inp, const Tensor& out) {
  count(MetaOp::kGeluForward, bytes(inp), bytes(out), smul(MetaFlops::kGeluForward, inp.numel()));
}

void MetaBackend::do_gelu_backward(StreamId, const Tensor& dout, const Tensor& inp,
                                   const Tensor& dinp) {
  count(MetaOp::kGeluBackward, bytes(dout, inp), bytes(dinp),
        smul(MetaFlops::kGeluBackward, inp.numel()));
}

void MetaBackend::do_add(StreamId, const Tensor& a, const Tensor& b, const Tensor& out) {
  count(MetaOp::kAdd, bytes(a, b), bytes(out), a.numel());
}

void MetaBackend::do_add_bias(StreamId, const Tensor& bias, const Tensor& out) {
  count(MetaOp::kAddBias, bytes(bias, out), bytes(out), out.numel());
}

void MetaBackend::do_bias_backward(StreamId, const Tensor& dout, const Tensor& dbias) {
  count(MetaOp::kBiasBackward, bytes(dout, dbias), bytes(dbias), dout.numel());
}

void MetaBackend::do_softmax_causal_forward(StreamId, const Tensor& preatt, float,
                                            const Tensor& att, std::int64_t t) {
  count(MetaOp::kSoftmaxCausalForward, bytes(preatt), bytes(att),
        smul(MetaFlops::kSoftmaxForward, live_scores(att, t)));
}

void MetaBackend::do_softmax_causal_backward(StreamId, const Tensor& datt, const Tensor& att, float,
                                             const Tensor& dpreatt, std::int64_t t) {
  count(MetaOp::kSoftmaxCausalBackward, bytes(datt, att), bytes(dpreatt),
        smul(MetaFlops::kSoftmaxBackward, live_scores(att, t)));
}

void MetaBackend::do_split_heads(StreamId, const Tensor& src, const Tensor& dst,
                                 const HeadDims& d) {
  // src may be larger than the permuted part (backward's dy lives in dqkv's memory).
  const std::int64_t n = smul(smul(d.b * d.t, d.parts), d.heads * d.hs);
  count(MetaOp::kSplitHeads, smul(n, dtype_size(src.dtype())), smul(n, dtype_size(dst.dtype())));
}

void MetaBackend::do_merge_heads(StreamId, const Tensor& src, const Tensor& dst,
                                 const HeadDims& d) {
  const std::int64_t n = smul(smul(d.b * d.t, d.parts), d.heads * d.hs);
  count(MetaOp::kMergeHeads, smul(n, dtype_size(src.dtype())), smul(n, dtype_size(dst.dtype())));
}

void MetaBackend::do_embedding_forward(StreamId, const IndexTensor& tokens, const Tensor& wte,
                                       const Tensor& wpe, const Tensor& out) {
  // One row of wte and one of wpe gathered per token.
  const std::int64_t n = out.numel();
  const std::int64_t read =
      sadd(bytes(tokens), sadd(smul(n, dtype_size(wte.dtype())), smul(n, dtype_size(wpe.dtype()))));
  count(MetaOp::kEmbeddingForward, read, bytes(out), n);
}

void MetaBackend::do_embedding_backward(StreamId, const Tensor& dout, const IndexTensor& tokens,
                                        const Tensor&, const Tensor&) {
  // Per token, one f32 row of dwte and one of dwpe read and written.
  const std::int64_t rows = smul(dout.numel(), 2 * 4);
  count(MetaOp::kEmbeddingBackward, sadd(bytes(dout), sadd(bytes(tokens), rows)), rows,
        smul(2, dout.numel()));
}

void MetaBackend::do_crossentropy_forward(StreamId, const Tensor& logits,
                                          const IndexTensor& targets, std::int64_t vocab,
                                          const Tensor& losses, const Tensor& lse) {
  const std::int64_t live = smul(targets.numel(), vocab);
  count(MetaOp::kCrossEntropyForward, sadd(smul(live, dtype_size(logits.dtype())), bytes(targets)),
        bytes(losses, lse), smul(MetaFlops::kCrossEntropyForward, live));
}

void MetaBackend::do_crossentropy_backward(StreamId, const Tensor& logits, const Tensor& lse,
                                           const IndexTensor& targets, std::int64_t vocab, float,
                                           const Tensor* dlosses, const Tensor& dlogits) {
  const std::int64_t live = smul(targets.numel(), vocab);
  std::int64_t read =
      sadd(smul(live, dtype_size(logits.dtype())), sadd(bytes(lse), bytes(targets)));
  if (dlosses != nullptr) read = sadd(read, bytes(*dlosses));
  count(MetaOp::kCrossEntropyBackward, read, bytes(dlogits),
        smul(MetaFlops::kCrossEntropyBackward, live));
}

void MetaBackend::do_adamw(StreamId, const AdamWConstants&, const Tensor& param, const Tensor& grad,
                           const Tensor& exp_avg, const Tensor& exp_avg_sq,
                           const Tensor* param_out) {
  const std::int64_t out = param_out != nullptr ? bytes(*param_out) : 0;
  count(MetaOp::kAdamW, bytes(param, grad, exp_avg, exp_avg_sq),
        sadd(bytes(param, exp_avg, exp_avg_sq), out), smul(MetaFlops::kAdamW, param.numel()));
}

}  // namespace memfit
