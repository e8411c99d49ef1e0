// MetaBackend's neural-network ops: operand bytes and MetaFlops-rate flops, never memory.
#include <cstdint>

#include "core/meta/meta_backend.h"
#include "core/meta/saturating.h"

namespace memfit {
namespace {

using meta::bytes;
using meta::sat_add;
using meta::sat_mul;

std::int64_t bytes(const IndexTensor& t) { return sat_mul(t.numel(), 4); }

// Live (j <= i) entries of the causal score matrices in a (R,T,T) tensor.
std::int64_t live_scores(const Tensor& scores, std::int64_t t) {
  if (t == 0) return 0;
  const std::int64_t mats = scores.numel() / (t * t);
  return sat_mul(mats, t * (t + 1) / 2);
}

// Live (j <= i) query-key pairs of a causal attention: B*H*T(T+1)/2.
std::int64_t live_pairs(const AttentionDims& d) {
  return sat_mul(sat_mul(d.b, d.heads),
                 d.t % 2 == 0 ? sat_mul(d.t / 2, d.t + 1) : sat_mul(d.t, (d.t + 1) / 2));
}

}  // namespace

void MetaBackend::do_layernorm_forward(StreamId, const Tensor& inp, const Tensor& weight,
                                       const Tensor& bias, float, const Tensor& out,
                                       const Tensor& mean, const Tensor& rstd) {
  count(MetaOp::kLayerNormForward, inp.dtype(), bytes(inp, weight, bias), bytes(out, mean, rstd),
        sat_mul(MetaFlops::kLayerNormForward, inp.numel()));
}

void MetaBackend::do_layernorm_backward(StreamId, const Tensor& dout, const Tensor& inp,
                                        const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd, const Tensor& dinp,
                                        const Tensor& dweight, const Tensor& dbias) {
  // dinp, dweight and dbias accumulate: read and written.
  count(MetaOp::kLayerNormBackward, inp.dtype(), bytes(dout, inp, weight, mean, rstd, dinp, dweight, dbias),
        bytes(dinp, dweight, dbias), sat_mul(MetaFlops::kLayerNormBackward, inp.numel()));
}

void MetaBackend::do_gelu_forward(StreamId, const Tensor& inp, const Tensor& out) {
  count(MetaOp::kGeluForward, inp.dtype(), bytes(inp), bytes(out),
        sat_mul(MetaFlops::kGeluForward, inp.numel()));
}

void MetaBackend::do_gelu_backward(StreamId, const Tensor& dout, const Tensor& inp,
                                   const Tensor& dinp) {
  count(MetaOp::kGeluBackward, inp.dtype(), bytes(dout, inp), bytes(dinp),
        sat_mul(MetaFlops::kGeluBackward, inp.numel()));
}

void MetaBackend::do_add(StreamId, const Tensor& a, const Tensor& b, const Tensor& out) {
  count(MetaOp::kAdd, a.dtype(), bytes(a, b), bytes(out), a.numel());
}

void MetaBackend::do_add_bias(StreamId, const Tensor& bias, const Tensor& out) {
  count(MetaOp::kAddBias, out.dtype(), bytes(bias, out), bytes(out), out.numel());
}

void MetaBackend::do_bias_backward(StreamId, const Tensor& dout, const Tensor& dbias) {
  count(MetaOp::kBiasBackward, dout.dtype(), bytes(dout, dbias), bytes(dbias), dout.numel());
}

void MetaBackend::do_softmax_causal_forward(StreamId, const Tensor& preatt, float,
                                            const Tensor& att, std::int64_t t) {
  count(MetaOp::kSoftmaxCausalForward, att.dtype(), bytes(preatt), bytes(att),
        sat_mul(MetaFlops::kSoftmaxForward, live_scores(att, t)));
}

void MetaBackend::do_softmax_causal_backward(StreamId, const Tensor& datt, const Tensor& att, float,
                                             const Tensor& dpreatt, std::int64_t t) {
  count(MetaOp::kSoftmaxCausalBackward, att.dtype(), bytes(datt, att), bytes(dpreatt),
        sat_mul(MetaFlops::kSoftmaxBackward, live_scores(att, t)));
}

void MetaBackend::do_split_heads(StreamId, const Tensor& src, const Tensor& dst,
                                 const HeadDims& d) {
  // src may be larger than the permuted part (backward's dy lives in dqkv's memory).
  const std::int64_t n = sat_mul(sat_mul(d.b * d.t, d.parts), d.heads * d.hs);
  count(MetaOp::kSplitHeads, src.dtype(), sat_mul(n, dtype_size(src.dtype())),
        sat_mul(n, dtype_size(dst.dtype())));
}

void MetaBackend::do_merge_heads(StreamId, const Tensor& src, const Tensor& dst,
                                 const HeadDims& d) {
  const std::int64_t n = sat_mul(sat_mul(d.b * d.t, d.parts), d.heads * d.hs);
  count(MetaOp::kMergeHeads, src.dtype(), sat_mul(n, dtype_size(src.dtype())),
        sat_mul(n, dtype_size(dst.dtype())));
}

void MetaBackend::do_flash_attention_forward(StreamId, const Tensor& qkv, const AttentionDims& d,
                                             const Tensor& out, const Tensor& lse) {
  const std::int64_t pairs = live_pairs(d);
  // q.k and p.v: 2*hs flops each per live pair.
  count_matmul(MetaOp::kFlashAttentionForward, qkv.dtype(), bytes(qkv), bytes(out, lse),
               sat_mul(pairs, 4 * d.hs), sat_mul(pairs, MetaFlops::kSoftmaxForward));
}

void MetaBackend::do_flash_attention_backward(StreamId, const Tensor& dout, const Tensor& qkv,
                                              const Tensor& out, const Tensor& lse,
                                              const AttentionDims& d, const Tensor& delta,
                                              const Tensor& dqkv) {
  const std::int64_t pairs = live_pairs(d);
  // Recomputed q.k, then dp = do.v, dv += p do, dq += ds k, dk += ds q: five products; per
  // pair the exp of the recomputed probability and ds = p (dp - delta); delta is 2*hs per row.
  const std::int64_t elementwise =
      sat_add(sat_mul(pairs, MetaFlops::kSoftmaxForward + MetaFlops::kSoftmaxBackward),
              sat_mul(delta.numel(), 2 * d.hs));
  count_matmul(MetaOp::kFlashAttentionBackward, qkv.dtype(), bytes(dout, qkv, out, lse, delta),
               bytes(delta, dqkv), sat_mul(pairs, 10 * d.hs), elementwise);
}

void MetaBackend::do_rmsnorm_forward(StreamId, const Tensor& inp, const Tensor& weight, float,
                                     const Tensor& out, const Tensor& rstd) {
  count(MetaOp::kRmsNormForward, inp.dtype(), bytes(inp, weight), bytes(out, rstd),
        sat_mul(MetaFlops::kRmsNormForward, inp.numel()));
}

void MetaBackend::do_rmsnorm_backward(StreamId, const Tensor& dout, const Tensor& inp,
                                      const Tensor& weight, const Tensor& rstd, const Tensor& dinp,
                                      const Tensor& dweight) {
  // dinp and dweight accumulate: read and written.
  count(MetaOp::kRmsNormBackward, inp.dtype(), bytes(dout, inp, weight, rstd, dinp, dweight),
        bytes(dinp, dweight), sat_mul(MetaFlops::kRmsNormBackward, inp.numel()));
}

void MetaBackend::do_rope(StreamId, const Tensor& qkv, const AttentionDims& d, const RopeFreqs&,
                          bool) {
  // The q and k heads are read and written in place; v is not touched.
  const std::int64_t n = sat_mul(sat_mul(d.b, d.t), (d.heads + d.kv_heads) * d.hs);
  const std::int64_t b = sat_mul(n, dtype_size(qkv.dtype()));
  count(MetaOp::kRope, qkv.dtype(), b, b, sat_mul(MetaFlops::kRope, n));
}

// The q and k columns of qkv are read and written in place (v is not touched); qk_in and rstd
// written (forward) or read (backward); the weight gradients accumulate: read and written.
void MetaBackend::do_qk_norm_forward(StreamId, const Tensor& qkv, const AttentionDims& d,
                                     const Tensor& q_weight, const Tensor& k_weight, float,
                                     const Tensor& qk_in, const Tensor& rstd) {
  const std::int64_t n = sat_mul(sat_mul(d.b, d.t), (d.heads + d.kv_heads) * d.hs);
  const std::int64_t cols = sat_mul(n, dtype_size(qkv.dtype()));
  count(MetaOp::kQkNormForward, qkv.dtype(), sat_add(cols, bytes(q_weight, k_weight)),
        sat_add(cols, bytes(qk_in, rstd)), sat_mul(MetaFlops::kQkNormForward, n));
}

void MetaBackend::do_qk_norm_backward(StreamId, const Tensor& dqkv, const Tensor& qk_in,
                                      const Tensor& rstd, const AttentionDims& d,
                                      const Tensor& q_weight, const Tensor& k_weight,
                                      const Tensor& dq_weight, const Tensor& dk_weight) {
  const std::int64_t n = sat_mul(sat_mul(d.b, d.t), (d.heads + d.kv_heads) * d.hs);
  const std::int64_t cols = sat_mul(n, dtype_size(dqkv.dtype()));
  count(MetaOp::kQkNormBackward, dqkv.dtype(),
        sat_add(cols, bytes(qk_in, rstd, q_weight, k_weight, dq_weight, dk_weight)),
        sat_add(cols, bytes(dq_weight, dk_weight)), sat_mul(MetaFlops::kQkNormBackward, n));
}

void MetaBackend::do_swiglu_forward(StreamId, const Tensor& gate_up, const Tensor& out) {
  count(MetaOp::kSwiGluForward, out.dtype(), bytes(gate_up), bytes(out),
        sat_mul(MetaFlops::kSwiGluForward, out.numel()));
}

void MetaBackend::do_swiglu_backward(StreamId, const Tensor& dout, const Tensor& gate_up,
                                     const Tensor& dgate_up) {
  count(MetaOp::kSwiGluBackward, dout.dtype(), bytes(dout, gate_up), bytes(dgate_up),
        sat_mul(MetaFlops::kSwiGluBackward, dout.numel()));
}

void MetaBackend::do_embedding_forward(StreamId, const IndexTensor& tokens, const Tensor& wte,
                                       const Tensor* wpe, const Tensor& out) {
  // One row of wte (and one of wpe, when there is one) gathered per token.
  const std::int64_t n = out.numel();
  std::int64_t read = sat_add(bytes(tokens), sat_mul(n, dtype_size(wte.dtype())));
  if (wpe != nullptr) read = sat_add(read, sat_mul(n, dtype_size(wpe->dtype())));
  count(MetaOp::kEmbeddingForward, out.dtype(), read, bytes(out), wpe != nullptr ? n : 0);
}

void MetaBackend::do_embedding_backward(StreamId, const Tensor& dout, const IndexTensor& tokens,
                                        const Tensor&, const Tensor* dwpe) {
  // Per token, one f32 row of dwte (and of dwpe) read and written.
  const std::int64_t tables = dwpe != nullptr ? 2 : 1;
  const std::int64_t rows = sat_mul(dout.numel(), tables * 4);
  count(MetaOp::kEmbeddingBackward, dout.dtype(), sat_add(bytes(dout), sat_add(bytes(tokens), rows)), rows,
        sat_mul(tables, dout.numel()));
}

void MetaBackend::do_crossentropy_forward(StreamId, const Tensor& logits,
                                          const IndexTensor& targets, std::int64_t vocab,
                                          const Tensor& losses, const Tensor& lse) {
  const std::int64_t live = sat_mul(targets.numel(), vocab);
  count(MetaOp::kCrossEntropyForward, logits.dtype(),
        sat_add(sat_mul(live, dtype_size(logits.dtype())), bytes(targets)), bytes(losses, lse),
        sat_mul(MetaFlops::kCrossEntropyForward, live));
}

void MetaBackend::do_crossentropy_backward(StreamId, const Tensor& logits, const Tensor& lse,
                                           const IndexTensor& targets, std::int64_t vocab, float,
                                           const Tensor* dlosses, const Tensor& dlogits) {
  const std::int64_t live = sat_mul(targets.numel(), vocab);
  std::int64_t read =
      sat_add(sat_mul(live, dtype_size(logits.dtype())), sat_add(bytes(lse), bytes(targets)));
  if (dlosses != nullptr) read = sat_add(read, bytes(*dlosses));
  count(MetaOp::kCrossEntropyBackward, logits.dtype(), read, bytes(dlogits),
        sat_mul(MetaFlops::kCrossEntropyBackward, live));
}

void MetaBackend::do_adamw(StreamId, const AdamWConstants&, const Tensor& param, const Tensor& grad,
                           const Tensor& exp_avg, const Tensor& exp_avg_sq,
                           const Tensor* param_out) {
  const std::int64_t out = param_out != nullptr ? bytes(*param_out) : 0;
  count(MetaOp::kAdamW, grad.dtype(), bytes(param, grad, exp_avg, exp_avg_sq),
        sat_add(bytes(param, exp_avg, exp_avg_sq), out), sat_mul(MetaFlops::kAdamW, param.numel()));
}

}  // namespace memfit
