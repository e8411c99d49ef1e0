#include "core/layers/attention.h"

#include <cmath>
#include <string>

#include "memory/check.h"
#include "memory/error.h"

namespace memfit {

using layers::mul;
using layers::nbytes;

namespace {

[[noreturn]] void bad(const std::string& name, const std::string& what) {
  throw InvalidArgument("CausalSelfAttention '" + name + "': " + what);
}

// shape with kv_heads and head_dim resolved, every rule of the constructor checked.
AttentionShape checked_shape(const std::string& name, std::int64_t hidden, AttentionShape s,
                             AttentionImpl impl) {
  layers::check_dim("CausalSelfAttention", name, "hidden", hidden);
  layers::check_dim("CausalSelfAttention", name, "heads", s.heads);
  if (s.heads > (std::int64_t{1} << 31)) {
    bad(name, "heads = " + std::to_string(s.heads) + "; valid: at most 2^31");
  }
  if (s.kv_heads == 0) s.kv_heads = s.heads;
  if (s.kv_heads < 1 || s.heads % s.kv_heads != 0) {
    bad(name, "kv_heads = " + std::to_string(s.kv_heads) + " with heads = " +
                  std::to_string(s.heads) + "; valid: a divisor of heads (0: heads)");
  }
  if (s.head_dim == 0) {
    if (hidden % s.heads != 0) {
      bad(name, "heads = " + std::to_string(s.heads) +
                    " does not divide hidden = " + std::to_string(hidden) +
                    "; valid: a divisor of hidden, or an explicit head_dim");
    }
    s.head_dim = hidden / s.heads;
  }
  if (s.head_dim < 1 ||
      (impl == AttentionImpl::kFlash && s.head_dim > Backend::kMaxAttentionHeadSize)) {
    bad(name,
        "head size " + std::to_string(s.head_dim) + "; valid" +
            (impl == AttentionImpl::kFlash
                 ? " with flash attention: 1 to " + std::to_string(Backend::kMaxAttentionHeadSize) +
                       " (more heads, or attention: materialized)"
                 : std::string(": >= 1")));
  }
  if (s.rope && s.head_dim > Backend::kMaxAttentionHeadSize) {
    bad(name, "rotary embedding with head size " + std::to_string(s.head_dim) +
                  "; valid: at most " + std::to_string(Backend::kMaxAttentionHeadSize));
  }
  if (s.rope && (s.head_dim % 2 != 0 || s.freqs.half != s.head_dim / 2)) {
    bad(name, "rotary embedding with head size " + std::to_string(s.head_dim) + " and " +
                  std::to_string(s.freqs.half) +
                  " frequencies; valid: an even head size and head size / 2 frequencies");
  }
  if (s.qk_norm && impl == AttentionImpl::kMaterialized) {
    bad(name, "qk_norm with materialized attention; valid: flash attention");
  }
  if (s.qk_norm && (!(s.qk_norm_eps > 0.0f) || !std::isfinite(s.qk_norm_eps))) {
    bad(name, "qk_norm_eps = " + std::to_string(s.qk_norm_eps) + "; valid: a finite value > 0");
  }
  if (impl == AttentionImpl::kMaterialized && s.kv_heads != s.heads) {
    bad(name, "materialized attention with kv_heads = " + std::to_string(s.kv_heads) +
                  " < heads = " + std::to_string(s.heads) +
                  "; valid: flash attention for grouped-query attention");
  }
  return s;
}

AttentionShape gpt_shape(std::int64_t heads) {
  AttentionShape s;
  s.heads = heads;
  return s;
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(std::string name, std::int64_t hidden, std::int64_t heads,
                                         float proj_std, AttentionImpl impl)
    : CausalSelfAttention(std::move(name), hidden, gpt_shape(heads), proj_std, impl) {}

CausalSelfAttention::CausalSelfAttention(std::string name, std::int64_t hidden,
                                         const AttentionShape& shape, float proj_std,
                                         AttentionImpl impl)
    : Layer(name),
      hidden_(hidden),
      shape_(checked_shape(name, hidden, shape, impl)),
      impl_(impl),
      qkv_(name + ".qkv", hidden, mul(shape_.heads + 2 * shape_.kv_heads, shape_.head_dim),
           shape_.qkv_bias, layers::kInitStd),
      proj_(name + ".proj", mul(shape_.heads, shape_.head_dim), hidden, shape_.proj_bias,
            proj_std) {
  if (shape_.qk_norm) {
    layers::init_param(q_norm_, this->name() + ".q_norm.weight", Shape{shape_.head_dim},
                       ParamInit::Kind::kOnes);
    layers::init_param(k_norm_, this->name() + ".k_norm.weight", Shape{shape_.head_dim},
                       ParamInit::Kind::kOnes);
  }
}

std::vector<Parameter*> CausalSelfAttention::parameters() {
  std::vector<Parameter*> ps{&qkv_.weight()};
  if (shape_.qkv_bias) ps.push_back(&qkv_.bias());
  if (shape_.qk_norm) {
    ps.push_back(&q_norm_);
    ps.push_back(&k_norm_);
  }
  ps.push_back(&proj_.weight());
  if (shape_.proj_bias) ps.push_back(&proj_.bias());
  return ps;
}

void CausalSelfAttention::release_saved() noexcept {
  qkv_.release_saved();
  proj_.release_saved();
  qkv_saved_.reset();
  softmax_.reset();
  merged_.reset();
  qk_in_.reset();
  qk_rstd_.reset();
}

Act CausalSelfAttention::forward(LayerContext& ctx, const Act& x, bool save) {
  MEMFIT_CHECK(!has_saved()) << "CausalSelfAttention '" << name()
                             << "': forward while holding saved state";
  layers::check_input("CausalSelfAttention", name(), x, hidden_, ctx);
  if (x->view().ndim() != 3) {
    throw InvalidArgument("CausalSelfAttention '" + name() + "': input shape " +
                          x->view().shape().str() + "; valid: (B, T, " + std::to_string(hidden_) +
                          ")");
  }
  try {
    Act qkv = qkv_.forward(ctx, x, save);  // (B,T,(H+2G)*hs)
    if (shape_.qk_norm) norm_qk(ctx, qkv, save);
    if (shape_.rope) {
      ctx.backend.rope(ctx.stream, qkv->view(), shape_.heads, shape_.kv_heads, shape_.freqs, false);
    }
    return impl_ == AttentionImpl::kFlash ? forward_flash(ctx, std::move(qkv), save)
                                          : forward_materialized(ctx, std::move(qkv), save);
  } catch (...) {
    release_saved();
    throw;
  }
}

void CausalSelfAttention::norm_qk(LayerContext& ctx, const Act& qkv, bool save) {
  const Tensor& v = qkv->view();
  const std::int64_t b = v.size(0), t = v.size(1), qk = shape_.heads + shape_.kv_heads;
  const Category kept = save ? Category::kActivation : Category::kTemporary;
  Act in = ctx.make(Shape{b, t, qk * shape_.head_dim}, ctx.dtype, kept, name());
  Act rstd = ctx.make(Shape{b, t, qk}, DType::kF32, kept, name());
  ctx.backend.qk_norm_forward(ctx.stream, v, shape_.heads, shape_.kv_heads, q_norm_.weight.view(),
                              k_norm_.weight.view(), shape_.qk_norm_eps, in->view(), rstd->view());
  if (save) {
    qk_in_ = std::move(in);
    qk_rstd_ = std::move(rstd);
  }
}

Act CausalSelfAttention::forward_flash(LayerContext& ctx, Act qkv, bool save) {
  const std::int64_t b = qkv->view().size(0), t = qkv->view().size(1), h = shape_.heads;
  const Category kept = save ? Category::kActivation : Category::kTemporary;
  Act merged = ctx.make(Shape{b, t, h * shape_.head_dim}, ctx.dtype, Category::kActivation, name());
  Act lse = ctx.make(Shape{b, h, t}, DType::kF32, kept, name());
  ctx.backend.flash_attention_forward(ctx.stream, qkv->view(), h, shape_.kv_heads, merged->view(),
                                      lse->view());
  if (!save) {
    qkv.reset();
    lse.reset();
  }
  Act y = proj_.forward(ctx, merged, save);
  if (save) {
    qkv_saved_ = std::move(qkv);
    softmax_ = std::move(lse);
    merged_ = std::move(merged);
  }
  return y;
}

Act CausalSelfAttention::forward_materialized(LayerContext& ctx, Act qkv, bool save) {
  const std::int64_t b = qkv->view().size(0), t = qkv->view().size(1);
  const std::int64_t h = shape_.heads, hs = shape_.head_dim;
  const Category kept = save ? Category::kActivation : Category::kTemporary;
  Act qkvr = ctx.make(Shape{3, b, h, t, hs}, ctx.dtype, kept, name());
  Act att = ctx.make(Shape{b, h, t, t}, ctx.dtype, kept, name());
  Act scratch = ctx.make(Shape{b, h, t, hs}, ctx.dtype, Category::kTemporary, name());
  Act merged = ctx.make(Shape{b, t, h * hs}, ctx.dtype, Category::kActivation, name());
  ctx.backend.attention_forward(ctx.stream, qkv->view(), h, qkvr->view(), att->view(),
                                scratch->view(), merged->view());
  qkv.reset();  // qkvr holds q, k, v for the backward
  scratch.reset();
  if (!save) {
    qkvr.reset();
    att.reset();
  }
  Act y = proj_.forward(ctx, merged, save);
  if (save) {
    qkv_saved_ = std::move(qkvr);
    softmax_ = std::move(att);
  }
  return y;
}

Act CausalSelfAttention::backward(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "CausalSelfAttention '" << name()
                            << "': backward without a saved forward";
  Act dmerged = proj_.backward(ctx, dy);  // (B,T,C); proj drops its handle on the merged heads
  Act dqkv;
  const std::int64_t h = shape_.heads;
  if (impl_ == AttentionImpl::kFlash) {
    const Tensor& qkv = qkv_saved_->view();  // (B,T,(H+2G)*hs)
    const std::int64_t b = qkv.size(0), t = qkv.size(1);
    dqkv = ctx.make(qkv.shape(), ctx.dtype, Category::kTemporary, name());
    Act delta = ctx.make(Shape{b, h, t}, DType::kF32, Category::kTemporary, name());
    ctx.backend.flash_attention_backward(ctx.stream, dmerged->view(), qkv, merged_->view(),
                                         softmax_->view(), h, shape_.kv_heads, delta->view(),
                                         dqkv->view());
  } else {
    const Tensor& q = qkv_saved_->view();  // (3,B,H,T,hs)
    const std::int64_t b = q.size(1), t = q.size(3), hs = q.size(4);
    dqkv = ctx.make(Shape{b, t, 3 * h * hs}, ctx.dtype, Category::kTemporary, name());
    Act datt = ctx.make(Shape{b, h, t, t}, ctx.dtype, Category::kTemporary, name());
    Act dqkvr = ctx.make(Shape{3, b, h, t, hs}, ctx.dtype, Category::kTemporary, name());
    ctx.backend.attention_backward(ctx.stream, dmerged->view(), q, softmax_->view(), h,
                                   datt->view(), dqkvr->view(), dqkv->view());
  }
  if (shape_.rope) {  // the gradient of the rotated q, k -> that of the normed (or raw) ones
    ctx.backend.rope(ctx.stream, dqkv->view(), h, shape_.kv_heads, shape_.freqs, true);
  }
  if (shape_.qk_norm) {  // -> that of qkv's output
    ctx.backend.qk_norm_backward(ctx.stream, dqkv->view(), qk_in_->view(), qk_rstd_->view(), h,
                                 shape_.kv_heads, q_norm_.weight.view(), k_norm_.weight.view(),
                                 q_norm_.grad.view(), k_norm_.grad.view());
  }
  dmerged.reset();
  qkv_saved_.reset();
  softmax_.reset();
  merged_.reset();
  qk_in_.reset();
  qk_rstd_.reset();
  return qkv_.backward(ctx, dqkv);
}

PeakExcess CausalSelfAttention::peaks(std::int64_t seq_len, DType dtype) const {
  const std::int64_t c = nbytes(mul(seq_len, hidden_), dtype);
  const std::int64_t mq = nbytes(mul(seq_len, mul(shape_.heads, shape_.head_dim)), dtype);
  const std::int64_t mk = nbytes(mul(seq_len, mul(shape_.kv_heads, shape_.head_dim)), dtype);
  PeakExcess p;
  if (impl_ == AttentionImpl::kFlash) {
    const std::int64_t s = nbytes(mul(shape_.heads, seq_len), DType::kF32);
    p.forward = 0;  // qkv, merged, lse, y: the saved state and the output
    // dmerged (mq) + dqkv (mq + 2mk) + delta beside the saved state, less dx (c)
    p.backward = 2 * mq + 2 * mk + s - c;
    return p;
  }
  const std::int64_t a = nbytes(mul(shape_.heads, mul(seq_len, seq_len)), dtype);
  // qkv (3mq) + scratch (mq) + qkvr (3mq) + att + merged (mq), less saved and y's slot
  p.forward = 4 * mq - c;
  // dmerged (mq) + dqkv (3mq) + dqkvr (3mq) + datt, merged gone, less dx
  p.backward = 6 * mq + a - c;
  return p;
}

LayerCost CausalSelfAttention::cost(std::int64_t seq_len, DType dtype) const {
  const std::int64_t qw = mul(shape_.heads, shape_.head_dim);
  const std::int64_t kw = mul(shape_.kv_heads, shape_.head_dim);
  const std::int64_t mq = nbytes(mul(seq_len, qw), dtype), mk = nbytes(mul(seq_len, kw), dtype);
  const std::int64_t tc = mul(seq_len, hidden_);
  const std::int64_t projections = mul(2, mul(tc, qw + 2 * kw)) + mul(2, mul(tc, qw));
  LayerCost k;
  k.saves_input = true;
  k.output_bytes = nbytes(tc, dtype);
  k.workspace_bytes = peaks(seq_len, dtype).workspace();
  if (impl_ == AttentionImpl::kFlash) {
    // qkv, merged, lse; with qk_norm the q, k heads before it and their rstd
    k.saved_bytes = mq + 2 * mk + mq + nbytes(mul(shape_.heads, seq_len), DType::kF32);
    if (shape_.qk_norm) {
      k.saved_bytes += mq + mk + nbytes(mul(shape_.heads + shape_.kv_heads, seq_len), DType::kF32);
    }
    const std::int64_t pairs_q = mul(mul(seq_len, seq_len + 1), qw);  // T(T+1)*q
    k.forward_flops = projections + mul(2, pairs_q);
    k.backward_flops = mul(2, projections) + mul(5, pairs_q);
    return k;
  }
  const std::int64_t a = nbytes(mul(shape_.heads, mul(seq_len, seq_len)), dtype);
  k.saved_bytes = 4 * mq + a;  // qkvr (3mq), att, merged heads (mq)
  k.forward_flops = projections + mul(4, mul(seq_len, mul(seq_len, qw)));
  k.backward_flops = mul(2, k.forward_flops);
  return k;
}

}  // namespace memfit
