#include "core/layers/attention.h"

#include <string>

#include "memory/check.h"
#include "memory/error.h"

namespace memfit {

using layers::mul;
using layers::nbytes;

namespace {

std::int64_t checked_heads(const std::string& name, std::int64_t hidden, std::int64_t heads,
                           AttentionImpl impl) {
  layers::check_dim("CausalSelfAttention", name, "hidden", hidden);
  layers::check_dim("CausalSelfAttention", name, "heads", heads);
  if (hidden % heads != 0) {
    throw InvalidArgument("CausalSelfAttention '" + name + "': heads = " + std::to_string(heads) +
                          " does not divide hidden = " + std::to_string(hidden) +
                          "; valid: a divisor of hidden");
  }
  if (impl == AttentionImpl::kFlash && hidden / heads > Backend::kMaxAttentionHeadSize) {
    throw InvalidArgument("CausalSelfAttention '" + name +
                          "': head size hidden / heads = " + std::to_string(hidden / heads) +
                          "; valid with flash attention: at most " +
                          std::to_string(Backend::kMaxAttentionHeadSize) +
                          " (more heads, or attention: materialized)");
  }
  return heads;
}

}  // namespace

const char* attention_impl_name(AttentionImpl impl) {
  return impl == AttentionImpl::kFlash ? "flash" : "materialized";
}

CausalSelfAttention::CausalSelfAttention(std::string name, std::int64_t hidden, std::int64_t heads,
                                         float proj_std, AttentionImpl impl)
    : Layer(name),
      hidden_(hidden),
      heads_(checked_heads(name, hidden, heads, impl)),
      impl_(impl),
      qkv_(name + ".qkv", hidden, 3 * hidden, true, layers::kInitStd),
      proj_(name + ".proj", hidden, hidden, true, proj_std) {}

std::vector<Parameter*> CausalSelfAttention::parameters() {
  return {&qkv_.weight(), &qkv_.bias(), &proj_.weight(), &proj_.bias()};
}

void CausalSelfAttention::release_saved() noexcept {
  qkv_.release_saved();
  proj_.release_saved();
  qkv_saved_.reset();
  softmax_.reset();
  merged_.reset();
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
    Act qkv = qkv_.forward(ctx, x, save);  // (B,T,3C)
    return impl_ == AttentionImpl::kFlash ? forward_flash(ctx, std::move(qkv), save)
                                          : forward_materialized(ctx, std::move(qkv), save);
  } catch (...) {
    release_saved();
    throw;
  }
}

Act CausalSelfAttention::forward_flash(LayerContext& ctx, Act qkv, bool save) {
  const std::int64_t b = qkv->view().size(0), t = qkv->view().size(1);
  const Category kept = save ? Category::kActivation : Category::kTemporary;
  Act merged = ctx.make(Shape{b, t, hidden_}, ctx.dtype, Category::kActivation, name());
  Act lse = ctx.make(Shape{b, heads_, t}, DType::kF32, kept, name());
  ctx.backend.flash_attention_forward(ctx.stream, qkv->view(), heads_, heads_, merged->view(),
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
  const std::int64_t hs = hidden_ / heads_;
  const Category kept = save ? Category::kActivation : Category::kTemporary;
  Act qkvr = ctx.make(Shape{3, b, heads_, t, hs}, ctx.dtype, kept, name());
  Act att = ctx.make(Shape{b, heads_, t, t}, ctx.dtype, kept, name());
  Act scratch = ctx.make(Shape{b, heads_, t, hs}, ctx.dtype, Category::kTemporary, name());
  Act merged = ctx.make(Shape{b, t, hidden_}, ctx.dtype, Category::kActivation, name());
  ctx.backend.attention_forward(ctx.stream, qkv->view(), heads_, qkvr->view(), att->view(),
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
  if (impl_ == AttentionImpl::kFlash) {
    const Tensor& qkv = qkv_saved_->view();  // (B,T,3C)
    const std::int64_t b = qkv.size(0), t = qkv.size(1);
    dqkv = ctx.make(qkv.shape(), ctx.dtype, Category::kTemporary, name());
    Act delta = ctx.make(Shape{b, heads_, t}, DType::kF32, Category::kTemporary, name());
    ctx.backend.flash_attention_backward(ctx.stream, dmerged->view(), qkv, merged_->view(),
                                         softmax_->view(), heads_, heads_, delta->view(),
                                         dqkv->view());
  } else {
    const Tensor& q = qkv_saved_->view();  // (3,B,H,T,hs)
    const std::int64_t b = q.size(1), t = q.size(3), hs = q.size(4);
    dqkv = ctx.make(Shape{b, t, 3 * hidden_}, ctx.dtype, Category::kTemporary, name());
    Act datt = ctx.make(Shape{b, heads_, t, t}, ctx.dtype, Category::kTemporary, name());
    Act dqkvr = ctx.make(Shape{3, b, heads_, t, hs}, ctx.dtype, Category::kTemporary, name());
    ctx.backend.attention_backward(ctx.stream, dmerged->view(), q, softmax_->view(), heads_,
                                   datt->view(), dqkvr->view(), dqkv->view());
  }
  dmerged.reset();
  qkv_saved_.reset();
  softmax_.reset();
  merged_.reset();
  return qkv_.backward(ctx, dqkv);
}

PeakExcess CausalSelfAttention::peaks(std::int64_t seq_len, DType dtype) const {
  const std::int64_t c = nbytes(mul(seq_len, hidden_), dtype);
  PeakExcess p;
  if (impl_ == AttentionImpl::kFlash) {
    const std::int64_t s = nbytes(mul(heads_, seq_len), DType::kF32);
    p.forward = 0;           // qkv, merged, lse, y: the saved state and the output
    p.backward = 3 * c + s;  // dmerged (c) + dqkv (3c) + delta beside the saved state, less dx
    return p;
  }
  const std::int64_t a = nbytes(mul(heads_, mul(seq_len, seq_len)), dtype);
  p.forward = 3 * c;       // qkv (3c) + scratch (c) + qkvr (3c) + att + merged (c), less saved + y
  p.backward = 5 * c + a;  // dmerged (c) + dqkv (3c) + dqkvr (3c) + datt, merged gone, less dx
  return p;
}

LayerCost CausalSelfAttention::cost(std::int64_t seq_len, DType dtype) const {
  const std::int64_t c = nbytes(mul(seq_len, hidden_), dtype);
  const std::int64_t tc = mul(seq_len, hidden_);
  const std::int64_t projections = mul(2, mul(tc, 3 * hidden_)) + mul(2, mul(tc, hidden_));
  LayerCost k;
  k.saves_input = true;
  k.output_bytes = c;
  k.workspace_bytes = peaks(seq_len, dtype).workspace();
  if (impl_ == AttentionImpl::kFlash) {
    k.saved_bytes = 4 * c + nbytes(mul(heads_, seq_len), DType::kF32);     // qkv, merged, lse
    const std::int64_t pairs_c = mul(mul(seq_len, seq_len + 1), hidden_);  // T(T+1)*C
    k.forward_flops = projections + mul(2, pairs_c);
    k.backward_flops = mul(2, projections) + mul(5, pairs_c);
    return k;
  }
  const std::int64_t a = nbytes(mul(heads_, mul(seq_len, seq_len)), dtype);
  k.saved_bytes = 4 * c + a;  // qkvr (3c), att, merged heads (c)
  k.forward_flops = projections + mul(4, mul(seq_len, tc));
  k.backward_flops = mul(2, k.forward_flops);
  return k;
}

}  // namespace memfit
