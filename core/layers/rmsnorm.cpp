#include "core/layers/rmsnorm.h"

#include <cmath>
#include <string>

#include "memory/check.h"
#include "memory/error.h"

namespace memfit {

RMSNorm::RMSNorm(std::string name, std::int64_t hidden, float eps)
    : Layer(std::move(name)), hidden_(hidden), eps_(eps) {
  layers::check_dim("RMSNorm", this->name(), "hidden", hidden);
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    throw InvalidArgument("RMSNorm '" + this->name() + "': eps = " + std::to_string(eps) +
                          "; valid: a finite value > 0");
  }
  layers::init_param(w_, this->name() + ".weight", Shape{hidden}, ParamInit::Kind::kOnes);
}

Act RMSNorm::forward(LayerContext& ctx, const Act& x, bool save) {
  MEMFIT_CHECK(!has_saved()) << "RMSNorm '" << name() << "': forward while holding saved state";
  layers::check_input("RMSNorm", name(), x, hidden_, ctx);
  const Shape& xs = x->view().shape();
  Act y = ctx.make(xs, ctx.dtype, Category::kActivation, name());
  Act rstd = ctx.make(Shape{layers::rows(xs)}, DType::kF32,
                      save ? Category::kActivation : Category::kTemporary, name());
  ctx.backend.rmsnorm_forward(ctx.stream, x->view(), w_.weight.view(), eps_, y->view(),
                              rstd->view());
  if (save) {
    x_ = x;
    rstd_ = std::move(rstd);
  }
  return y;
}

void RMSNorm::backward_into(LayerContext& ctx, const Act& dy, const Tensor& dres) {
  MEMFIT_CHECK(has_saved()) << "RMSNorm '" << name() << "': backward without a saved forward";
  layers::check_grad("RMSNorm", name(), dy, x_->view().shape(), ctx);
  ctx.backend.rmsnorm_backward(ctx.stream, dy->view(), x_->view(), w_.weight.view(), rstd_->view(),
                               dres, w_.grad.view());
  release_saved();
}

Act RMSNorm::backward(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "RMSNorm '" << name() << "': backward without a saved forward";
  Act dx = ctx.make(x_->view().shape(), ctx.dtype, Category::kTemporary, name());
  ctx.backend.fill(ctx.stream, dx->view(), 0.0f);  // rmsnorm_backward accumulates into dinp
  backward_into(ctx, dy, dx->view());
  return dx;
}

void RMSNorm::release_saved() noexcept {
  x_.reset();
  rstd_.reset();
}

LayerCost RMSNorm::cost(std::int64_t seq_len, DType dtype) const {
  LayerCost c;
  c.saves_input = true;
  c.saved_bytes = layers::nbytes(seq_len, DType::kF32);
  c.output_bytes = layers::nbytes(layers::mul(seq_len, hidden_), dtype);
  return c;
}

}  // namespace memfit
