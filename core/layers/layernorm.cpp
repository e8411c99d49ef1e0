#include "core/layers/layernorm.h"

#include <cmath>
#include <string>

#include "core/layers/layer_util.h"
#include "memory/check.h"
#include "memory/error.h"

namespace memfit {

LayerNorm::LayerNorm(std::string name, std::int64_t hidden, float eps)
    : Layer(std::move(name)), hidden_(hidden), eps_(eps) {
  layers::check_dim("LayerNorm", this->name(), "hidden", hidden);
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    throw InvalidArgument("LayerNorm '" + this->name() + "': eps = " + std::to_string(eps) +
                          "; valid: a finite value > 0");
  }
  layers::init_param(w_, this->name() + ".weight", Shape{hidden}, ParamInit::Kind::kOnes);
  layers::init_param(b_, this->name() + ".bias", Shape{hidden}, ParamInit::Kind::kZeros);
}

Act LayerNorm::forward(LayerContext& ctx, const Act& x, bool save) {
  MEMFIT_CHECK(!has_saved()) << "LayerNorm '" << name() << "': forward while holding saved state";
  layers::check_input("LayerNorm", name(), x, hidden_, ctx);
  const Shape& xs = x->view().shape();
  const std::int64_t n = layers::rows(xs);
  Act y = ctx.make(xs, ctx.dtype, Category::kActivation, name());
  const Category stats = save ? Category::kActivation : Category::kTemporary;
  Act mean = ctx.make(Shape{n}, DType::kF32, stats, name());
  Act rstd = ctx.make(Shape{n}, DType::kF32, stats, name());
  ctx.backend.layernorm_forward(ctx.stream, x->view(), w_.weight.view(), b_.weight.view(), eps_,
                                y->view(), mean->view(), rstd->view());
  if (save) {
    x_ = x;
    mean_ = std::move(mean);
    rstd_ = std::move(rstd);
  }
  return y;
}

void LayerNorm::backward_into(LayerContext& ctx, const Act& dy, const Tensor& dres) {
  MEMFIT_CHECK(has_saved()) << "LayerNorm '" << name() << "': backward without a saved forward";
  const Shape& xs = x_->view().shape();
  layers::check_grad("LayerNorm", name(), dy, xs, ctx);
  ctx.backend.layernorm_backward(ctx.stream, dy->view(), x_->view(), w_.weight.view(),
                                 mean_->view(), rstd_->view(), dres, w_.grad.view(),
                                 b_.grad.view());
  release_saved();
}

Act LayerNorm::backward(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "LayerNorm '" << name() << "': backward without a saved forward";
  Act dx = ctx.make(x_->view().shape(), ctx.dtype, Category::kTemporary, name());
  ctx.backend.fill(ctx.stream, dx->view(), 0.0f);  // layernorm_backward accumulates into dinp
  backward_into(ctx, dy, dx->view());
  return dx;
}

void LayerNorm::release_saved() noexcept {
  x_.reset();
  mean_.reset();
  rstd_.reset();
}

LayerCost LayerNorm::cost(std::int64_t seq_len, DType dtype) const {
  LayerCost c;
  c.saves_input = true;
  c.saved_bytes = layers::nbytes(layers::mul(2, seq_len), DType::kF32);
  c.output_bytes = layers::nbytes(layers::mul(seq_len, hidden_), dtype);
  return c;
}

}  // namespace memfit
