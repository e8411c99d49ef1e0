#include "core/layers/attention.h"

#include <string>

#include "memory/check.h"
#include "memory/error.h"

namespace memfit {

using layers::mul;
using layers::nbytes;

namespace {

std::int64_t checked_heads(const std::string& name, std::int64_t hidden, std::int64_t heads) {
  layers::check_dim("CausalSelfAttention", name, "hidden", hidden);
  layers::check_dim("CausalSelfAttention", name, "heads", heads);
  if (hidden % heads != 0) {
    throw InvalidArgument("CausalSelfAttention '" + name + "': heads = " +
                          std::to_string(heads) + " does not divide hidden = " +
                          std::to_string(hidden) + "; valid: a divisor of hidden");
  }
  return heads;
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(std::string name, std::int64_t hidden,
                                         std::int64_t heads, float proj_std)
    : Layer(name),
      hidden_(hidden),
      heads_(checked_heads(name, hidden, heads)),
      qkv_(name + ".qkv", hidden, 3 * hidden, true, layers::kInitStd),
      proj_(name + ".proj", hidden, hidden, true, proj_std) {}

std::vector<Parameter*> CausalSelfAttention::parameters() {
  return {&qkv_.weight(), &qkv_.bias(), &proj_.weight(), &proj_.bias()};
}

void CausalSelfAttention::release_saved() noexcept {
  qkv_.release_saved();
  proj_.release_saved();
  qkvr_.reset();
  att_.reset();
}

Act CausalSelfAttention::forward(LayerContext& ctx, const Act& x, bool save) {
  MEMFIT_CHECK(!has_saved()) << "CausalSelfAttention '" << name()
                             << "': forward while holding saved state";
  layers::check_input("CausalSelfAttention", name(), x, hidden_, ctx);
  if (x->view().ndim() != 3) {
    throw InvalidArgument("CausalSelfAttention '" + name() + "': input shape " +
                          x->view().shape().str() + "; valid: (B, T, " +
                          std::to_string(hidden_) + ")");
  }
  const std::int64_t b = x->view().size(0), t = x->view().size(1);
  const std::int64_t hs = hidden_ / heads_;
  try {
    Act qkv = qkv_.forward(ctx, x, save);  // (B,T,3C)
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
      qkvr_ = std::move(qkvr);
      att_ = std::move(att);
    }
    return y;
  } catch (...) {
    release_saved();
    throw;
  }
}

Act CausalSelfAttention::backward(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "CausalSelfAttention '" << name()
                            << "': backward without a saved forward";
  const Tensor& q = qkvr_->view();  // (3,B,H,T,hs)
  const std::int64_t b = q.size(1), t = q.size(3), hs = q.size(4);
  Act dmerged = proj_.backward(ctx, dy);  // (B,T,C); proj drops the merged heads
  Act dqkv = ctx.make(Shape{b, t, 3 * hidden_}, ctx.dtype, Category::kTemporary, name());
  {
    Act datt = ctx.make(Shape{b, heads_, t, t}, ctx.dtype, Category::kTemporary, name());
    Act dqkvr = ctx.make(Shape{3, b, heads_, t, hs}, ctx.dtype, Category::kTemporary, name());
    ctx.backend.attention_backward(ctx.stream, dmerged->view(), qkvr_->view(), att_->view(),
                                   heads_, datt->view(), dqkvr->view(), dqkv->view());
  }
  dmerged.reset();
  qkvr_.reset();
  att_.reset();
  return qkv_.backward(ctx, dqkv);
}

PeakExcess CausalSelfAttention::peaks(std::int64_t seq_len, DType dtype) const {
  const std::int64_t c = nbytes(mul(seq_len, hidden_), dtype);
  const std::int64_t a = nbytes(mul(heads_, mul(seq_len, seq_len)), dtype);
  PeakExcess p;
  p.forward = 3 * c;       // qkv (3c) + scratch (c) + qkvr (3c) + att + merged (c), less saved + y
  p.backward = 5 * c + a;  // dmerged (c) + dqkv (3c) + dqkvr (3c) + datt, merged gone, less dx
  return p;
}

LayerCost CausalSelfAttention::cost(std::int64_t seq_len, DType dtype) const {
  const std::int64_t c = nbytes(mul(seq_len, hidden_), dtype);
  const std::int64_t a = nbytes(mul(heads_, mul(seq_len, seq_len)), dtype);
  LayerCost k;
  k.saves_input = true;
  k.saved_bytes = 4 * c + a;  // qkvr (3c), att, merged heads (c)
  k.output_bytes = c;
  k.workspace_bytes = peaks(seq_len, dtype).workspace();
  const std::int64_t tc = mul(seq_len, hidden_);
  k.forward_flops = mul(2, mul(tc, 3 * hidden_)) + mul(4, mul(seq_len, tc)) +
                    mul(2, mul(tc, hidden_));
  k.backward_flops = mul(2, k.forward_flops);
  return k;
}

}  // namespace memfit
