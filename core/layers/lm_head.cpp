#include "core/layers/lm_head.h"

#include <cmath>
#include <string>

#include "core/layers/layer_util.h"
#include "memory/check.h"
#include "memory/error.h"

namespace memfit {

// Everything backward needs, all kActivation tagged with the head's name except the input.
struct LmHead::Saved {
  Act x;       // the input (B,T,C), the final LayerNorm's input
  Act xn;      // lnf(x) (B,T,C), the projection's input
  Act mean;    // (B*T) f32
  Act rstd;    // (B*T) f32
  Act logits;  // (B*T, V), overwritten by dlogits in backward
  Act lse;     // (B*T) f32
};

LmHead::LmHead(std::string name, std::int64_t vocab, std::int64_t hidden, Parameter* tied_wte,
               float ln_eps)
    : name_(std::move(name)), vocab_(vocab), hidden_(hidden), eps_(ln_eps), tied_(tied_wte) {
  layers::check_dim("LmHead", name_, "vocab", vocab);
  layers::check_dim("LmHead", name_, "hidden", hidden);
  if (!(ln_eps > 0.0f) || !std::isfinite(ln_eps)) {
    throw InvalidArgument("LmHead '" + name_ + "': ln_eps = " + std::to_string(ln_eps) +
                          "; valid: a finite value > 0");
  }
  if (tied_ != nullptr && tied_->shape != Shape{vocab, hidden}) {
    throw InvalidArgument("LmHead '" + name_ + "': tied parameter '" + tied_->name +
                          "' has shape " + tied_->shape.str() +
                          "; valid: (vocab, hidden) = " + Shape{vocab, hidden}.str());
  }
  layers::init_param(ln_w_, "lnf.weight", Shape{hidden}, ParamInit::Kind::kOnes);
  layers::init_param(ln_b_, "lnf.bias", Shape{hidden}, ParamInit::Kind::kZeros);
  if (tied_ == nullptr) {
    layers::init_param(proj_, "head.weight", Shape{vocab, hidden}, ParamInit::Kind::kNormal,
                       layers::kInitStd);
  }
}

// Out of line: Saved is incomplete in the header.
LmHead::~LmHead() = default;

std::vector<Parameter*> LmHead::parameters() {
  return {&ln_w_, &ln_b_, tied_ != nullptr ? tied_ : &proj_};
}

void LmHead::allocate(const ParamAlloc& a) {
  std::vector<Parameter*> own = {&ln_w_, &ln_b_};
  if (tied_ == nullptr) own.push_back(&proj_);
  for (Parameter* p : own) {
    if (!p->placed) allocate_parameter(*p, a);
  }
}

bool LmHead::has_saved() const { return saved_ != nullptr; }

void LmHead::release_saved() noexcept { saved_.reset(); }

const Tensor* LmHead::logits() const { return saved_ ? &saved_->logits->view() : nullptr; }

Act LmHead::forward(LayerContext& ctx, const Act& x, const IndexTensor& targets) {
  MEMFIT_CHECK(!has_saved()) << "LmHead '" << name_ << "': forward while holding saved state";
  layers::check_input("LmHead", name_, x, hidden_, ctx);
  const Shape& xs = x->view().shape();
  const std::int64_t n = layers::rows(xs);
  if (targets.numel() != n || targets.device != ctx.device()) {
    throw InvalidArgument("LmHead '" + name_ + "': targets of shape " + targets.shape.str() +
                          " on " + device_name(targets.device) + "; valid: " + std::to_string(n) +
                          " ids (one per input row) on " + device_name(ctx.device()));
  }
  Parameter& w = tied_ != nullptr ? *tied_ : proj_;
  auto s = std::make_unique<Saved>();
  s->x = x;
  s->xn = ctx.make(xs, ctx.dtype, Category::kActivation, name_);
  s->mean = ctx.make(Shape{n}, DType::kF32, Category::kActivation, name_);
  s->rstd = ctx.make(Shape{n}, DType::kF32, Category::kActivation, name_);
  ctx.backend.layernorm_forward(ctx.stream, x->view(), ln_w_.weight.view(), ln_b_.weight.view(),
                                eps_, s->xn->view(), s->mean->view(), s->rstd->view());
  s->logits = ctx.make(Shape{n, vocab_}, ctx.dtype, Category::kActivation, name_);
  GemmDesc d;  // logits (N,V) = xn (N,C) @ W^T, W stored (V,C)
  d.m = n;
  d.n = vocab_;
  d.k = hidden_;
  d.trans_b = true;
  ctx.backend.gemm(ctx.stream, d, s->xn->view(), w.weight.view(), s->logits->view());
  s->lse = ctx.make(Shape{n}, DType::kF32, Category::kActivation, name_);
  Act losses = ctx.make(Shape{n}, DType::kF32, Category::kActivation, name_);
  const IndexTensor flat{targets.data, Shape{n}, targets.device};
  ctx.backend.crossentropy_forward(ctx.stream, s->logits->view(), flat, vocab_, losses->view(),
                                   s->lse->view());
  saved_ = std::move(s);
  return losses;
}

Act LmHead::backward(LayerContext& ctx, const IndexTensor& targets, float dloss) {
  MEMFIT_CHECK(has_saved()) << "LmHead '" << name_ << "': backward without a saved forward";
  Saved& s = *saved_;
  const Shape& xs = s.x->view().shape();
  const std::int64_t n = layers::rows(xs);
  if (targets.numel() != n || targets.device != ctx.device()) {
    throw InvalidArgument("LmHead '" + name_ + "': backward targets of shape " +
                          targets.shape.str() + "; valid: the forward's " + std::to_string(n) +
                          " ids on " + device_name(ctx.device()));
  }
  if (!std::isfinite(dloss)) {
    throw InvalidArgument("LmHead '" + name_ + "': dloss = " + std::to_string(dloss) +
                          "; valid: a finite value (loss scale / rows)");
  }
  Parameter& w = tied_ != nullptr ? *tied_ : proj_;
  const IndexTensor flat{targets.data, Shape{n}, targets.device};
  // dlogits over the logits, in place: the head's largest tensor is not duplicated.
  ctx.backend.crossentropy_backward(ctx.stream, s.logits->view(), s.lse->view(), flat, vocab_,
                                    dloss, nullptr, s.logits->view());
  Act dxn = ctx.make(xs, ctx.dtype, Category::kTemporary, name_);
  GemmDesc dd;  // dxn (N,C) = dlogits (N,V) @ W (V,C)
  dd.m = n;
  dd.n = hidden_;
  dd.k = vocab_;
  ctx.backend.gemm(ctx.stream, dd, s.logits->view(), w.weight.view(), dxn->view());
  GemmDesc dw;  // dW (V,C) += dlogits^T (V,N) @ xn (N,C)
  dw.m = vocab_;
  dw.n = hidden_;
  dw.k = n;
  dw.trans_a = true;
  dw.beta = 1.0f;
  ctx.backend.gemm(ctx.stream, dw, s.logits->view(), s.xn->view(), w.grad.view());
  s.logits.reset();
  s.lse.reset();
  s.xn.reset();
  Act dx = ctx.make(xs, ctx.dtype, Category::kTemporary, name_);
  ctx.backend.fill(ctx.stream, dx->view(), 0.0f);  // layernorm_backward accumulates into dinp
  ctx.backend.layernorm_backward(ctx.stream, dxn->view(), s.x->view(), ln_w_.weight.view(),
                                 s.mean->view(), s.rstd->view(), dx->view(), ln_w_.grad.view(),
                                 ln_b_.grad.view());
  saved_.reset();
  return dx;
}

LayerCost LmHead::cost(std::int64_t seq_len, DType dtype) const {
  using layers::mul;
  using layers::nbytes;
  LayerCost c;
  c.saves_input = true;
  // xn and logits in the activation dtype; mean, rstd, lse f32.
  c.saved_bytes = nbytes(mul(seq_len, hidden_), dtype) + nbytes(mul(seq_len, vocab_), dtype) +
                  nbytes(mul(3, seq_len), DType::kF32);
  c.output_bytes = nbytes(seq_len, DType::kF32);  // the per-row losses
  // No workspace: backward's peak is dxn beside the saved tensors, the size of dx; xn, the
  // logits and lse go before dx comes.
  c.workspace_bytes = 0;
  c.forward_flops = mul(2, mul(seq_len, mul(hidden_, vocab_)));
  c.backward_flops = mul(2, c.forward_flops);
  return c;
}

}  // namespace memfit
