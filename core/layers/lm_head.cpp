#include "core/layers/lm_head.h"

#include <cmath>
#include <string>

#include "core/layers/layer_util.h"
#include "memory/check.h"
#include "memory/error.h"

namespace memfit {

const char* loss_mode_name(LossMode m) { return m == LossMode::kWhole ? "whole" : "chunked"; }

bool parse_loss_mode(std::string_view text, LossMode* out) {
  if (text == "whole") {
    *out = LossMode::kWhole;
  } else if (text == "chunked") {
    *out = LossMode::kChunked;
  } else {
    return false;
  }
  return true;
}

// Everything backward needs, all kActivation tagged with the head's name except the input.
struct LmHead::Saved {
  Act x;       // the input (B,T,C), the final norm's input
  Act xn;      // norm(x) (B,T,C), the projection's input
  Act mean;    // (B*T) f32; LayerNorm only
  Act rstd;    // (B*T) f32
  Act logits;  // (B*T, V), overwritten by dlogits in backward; kWhole only
  Act lse;     // (B*T) f32
  std::int64_t chunk = 0;  // rows per chunk (the row count for kWhole)
};

LmHead::LmHead(std::string name, std::int64_t vocab, std::int64_t hidden, Parameter* tied_wte,
               HeadNorm norm, float eps)
    : name_(std::move(name)),
      vocab_(vocab),
      hidden_(hidden),
      norm_(norm),
      eps_(eps),
      tied_(tied_wte) {
  layers::check_dim("LmHead", name_, "vocab", vocab);
  layers::check_dim("LmHead", name_, "hidden", hidden);
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    throw InvalidArgument("LmHead '" + name_ + "': eps = " + std::to_string(eps) +
                          "; valid: a finite value > 0");
  }
  if (tied_ != nullptr && tied_->shape != Shape{vocab, hidden}) {
    throw InvalidArgument("LmHead '" + name_ + "': tied parameter '" + tied_->name +
                          "' has shape " + tied_->shape.str() +
                          "; valid: (vocab, hidden) = " + Shape{vocab, hidden}.str());
  }
  if (norm_ == HeadNorm::kLayerNorm) {
    layers::init_param(ln_w_, "lnf.weight", Shape{hidden}, ParamInit::Kind::kOnes);
    layers::init_param(ln_b_, "lnf.bias", Shape{hidden}, ParamInit::Kind::kZeros);
  } else {
    layers::init_param(ln_w_, "norm.weight", Shape{hidden}, ParamInit::Kind::kOnes);
  }
  if (tied_ == nullptr) {
    layers::init_param(proj_, "head.weight", Shape{vocab, hidden}, ParamInit::Kind::kNormal,
                       layers::kInitStd);
  }
}

// Out of line: Saved is incomplete in the header.
LmHead::~LmHead() = default;

std::vector<Parameter*> LmHead::parameters() {
  std::vector<Parameter*> out = {&ln_w_};
  if (norm_ == HeadNorm::kLayerNorm) out.push_back(&ln_b_);
  out.push_back(tied_ != nullptr ? tied_ : &proj_);
  return out;
}

void LmHead::allocate(const ParamAlloc& a) {
  for (Parameter* p : parameters()) {
    if (p != tied_ && !p->placed) allocate_parameter(*p, a);
  }
}

bool LmHead::has_saved() const { return saved_ != nullptr; }

void LmHead::release_saved() noexcept { saved_.reset(); }

const Tensor* LmHead::logits() const {
  return saved_ && saved_->logits ? &saved_->logits->view() : nullptr;
}

void LmHead::set_loss(LossMode m) {
  if (has_saved()) {
    throw InvalidArgument("LmHead '" + name_ +
                          "': set_loss while holding a forward's state; valid: between steps");
  }
  loss_ = m;
}

std::int64_t LmHead::loss_chunk_rows(std::int64_t n) const {
  const std::int64_t k = std::min<std::int64_t>(kMaxLossChunks, (vocab_ + hidden_ - 1) / hidden_);
  if (loss_ == LossMode::kWhole || k <= 1 || n <= 1) return n;
  return std::max<std::int64_t>(1, (n + k - 1) / k);
}

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
  s->rstd = ctx.make(Shape{n}, DType::kF32, Category::kActivation, name_);
  if (norm_ == HeadNorm::kLayerNorm) {
    s->mean = ctx.make(Shape{n}, DType::kF32, Category::kActivation, name_);
    ctx.backend.layernorm_forward(ctx.stream, x->view(), ln_w_.weight.view(), ln_b_.weight.view(),
                                  eps_, s->xn->view(), s->mean->view(), s->rstd->view());
  } else {
    ctx.backend.rmsnorm_forward(ctx.stream, x->view().reshape(Shape{n, hidden_}),
                                ln_w_.weight.view(), eps_, s->xn->view().reshape(Shape{n, hidden_}),
                                s->rstd->view());
  }
  s->chunk = loss_chunk_rows(n);
  const Tensor xn = s->xn->view().reshape(Shape{n, hidden_});
  if (s->chunk == n) {
    s->logits = ctx.make(Shape{n, vocab_}, ctx.dtype, Category::kActivation, name_);
  }
  s->lse = ctx.make(Shape{n}, DType::kF32, Category::kActivation, name_);
  Act losses = ctx.make(Shape{n}, DType::kF32, Category::kActivation, name_);
  for (std::int64_t r0 = 0; r0 < n; r0 += s->chunk) {
    const std::int64_t r = std::min(s->chunk, n - r0);
    // A chunk's logits: the saved tensor (kWhole), else a temporary freed after its loss.
    Act tmp;
    if (!s->logits) tmp = ctx.make(Shape{r, vocab_}, ctx.dtype, Category::kTemporary, name_);
    const Tensor logits = s->logits ? s->logits->view() : tmp->view();
    GemmDesc d;  // logits (r,V) = xn (r,C) @ W^T, W stored (V,C)
    d.m = r;
    d.n = vocab_;
    d.k = hidden_;
    d.trans_b = true;
    ctx.backend.gemm(ctx.stream, d, xn.slice0(r0, r0 + r), w.weight.view(), logits);
    const IndexTensor t{targets.data + r0, Shape{r}, targets.device};
    ctx.backend.crossentropy_forward(ctx.stream, logits, t, vocab_,
                                     losses->view().slice0(r0, r0 + r),
                                     s->lse->view().slice0(r0, r0 + r));
  }
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
  const Tensor xn = s.xn->view().reshape(Shape{n, hidden_});
  Act dxn;
  if (!s.logits) dxn = ctx.make(xs, ctx.dtype, Category::kTemporary, name_);  // chunked: first
  for (std::int64_t r0 = 0; r0 < n; r0 += s.chunk) {
    const std::int64_t r = std::min(s.chunk, n - r0);
    Act tmp;
    if (!s.logits) {
      // Recompute the chunk's logits, exactly as forward did.
      tmp = ctx.make(Shape{r, vocab_}, ctx.dtype, Category::kTemporary, name_);
      GemmDesc d;
      d.m = r;
      d.n = vocab_;
      d.k = hidden_;
      d.trans_b = true;
      ctx.backend.gemm(ctx.stream, d, xn.slice0(r0, r0 + r), w.weight.view(), tmp->view());
    }
    const Tensor logits = s.logits ? s.logits->view() : tmp->view();
    const IndexTensor t{targets.data + r0, Shape{r}, targets.device};
    // dlogits over the logits, in place: the head's largest tensor is not duplicated.
    ctx.backend.crossentropy_backward(ctx.stream, logits, s.lse->view().slice0(r0, r0 + r), t,
                                      vocab_, dloss, nullptr, logits);
    if (!dxn) dxn = ctx.make(xs, ctx.dtype, Category::kTemporary, name_);  // kWhole: now
    GemmDesc dd;  // dxn (r,C) = dlogits (r,V) @ W (V,C)
    dd.m = r;
    dd.n = hidden_;
    dd.k = vocab_;
    ctx.backend.gemm(ctx.stream, dd, logits, w.weight.view(),
                     dxn->view().reshape(Shape{n, hidden_}).slice0(r0, r0 + r));
    GemmDesc dw;  // dW (V,C) += dlogits^T (V,r) @ xn (r,C)
    dw.m = vocab_;
    dw.n = hidden_;
    dw.k = r;
    dw.trans_a = true;
    dw.beta = 1.0f;
    ctx.backend.gemm(ctx.stream, dw, logits, xn.slice0(r0, r0 + r), w.grad.view());
  }
  s.logits.reset();
  s.lse.reset();
  s.xn.reset();
  Act dx = ctx.make(xs, ctx.dtype, Category::kTemporary, name_);
  ctx.backend.fill(ctx.stream, dx->view(), 0.0f);  // the norms' backward accumulates into dinp
  if (norm_ == HeadNorm::kLayerNorm) {
    ctx.backend.layernorm_backward(ctx.stream, dxn->view(), s.x->view(), ln_w_.weight.view(),
                                   s.mean->view(), s.rstd->view(), dx->view(), ln_w_.grad.view(),
                                   ln_b_.grad.view());
  } else {
    const Shape flat{n, hidden_};
    ctx.backend.rmsnorm_backward(ctx.stream, dxn->view().reshape(flat), s.x->view().reshape(flat),
                                 ln_w_.weight.view(), s.rstd->view(), dx->view().reshape(flat),
                                 ln_w_.grad.view());
  }
  saved_.reset();
  return dx;
}

LayerCost LmHead::cost(std::int64_t seq_len, DType dtype) const {
  using layers::mul;
  using layers::nbytes;
  LayerCost c;
  c.saves_input = true;
  const std::int64_t stats = norm_ == HeadNorm::kLayerNorm ? 3 : 2;  // mean?, rstd, lse
  const std::int64_t chunk = loss_chunk_rows(seq_len);
  const bool whole = chunk == seq_len;
  // xn (and kWhole's logits) in the activation dtype; the statistics and lse f32.
  c.saved_bytes = nbytes(mul(seq_len, hidden_), dtype) +
                  (whole ? nbytes(mul(seq_len, vocab_), dtype) : 0) +
                  nbytes(mul(stats, seq_len), DType::kF32);
  c.output_bytes = nbytes(seq_len, DType::kF32);  // the per-row losses
  // kWhole: no workspace (backward's peak is dxn beside the saved tensors, the size of dx; xn,
  // the logits and lse go before dx comes). Chunked: one chunk's logits beside dxn.
  c.workspace_bytes = whole ? 0 : nbytes(mul(chunk, vocab_), dtype);
  c.forward_flops = mul(2, mul(seq_len, mul(hidden_, vocab_)));
  c.backward_flops = mul(whole ? 2 : 3, c.forward_flops);  // chunked: the logits recomputed
  return c;
}

}  // namespace memfit
