#include "core/layers/gelu.h"

#include "memory/check.h"

namespace memfit {

GELU::GELU(std::string name, std::int64_t features)
    : Layer(std::move(name)), features_(features) {
  layers::check_dim("GELU", this->name(), "features", features);
}

Act GELU::forward(LayerContext& ctx, const Act& x, bool save) {
  MEMFIT_CHECK(!has_saved()) << "GELU '" << name() << "': forward while holding saved state";
  layers::check_input("GELU", name(), x, features_, ctx);
  Act y = ctx.make(x->view().shape(), ctx.dtype, Category::kActivation, name());
  ctx.backend.gelu_forward(ctx.stream, x->view(), y->view());
  if (save) x_ = x;
  return y;
}

Act GELU::backward(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "GELU '" << name() << "': backward without a saved forward";
  layers::check_grad("GELU", name(), dy, x_->view().shape(), ctx);
  Act dx = ctx.make(x_->view().shape(), ctx.dtype, Category::kTemporary, name());
  ctx.backend.gelu_backward(ctx.stream, dy->view(), x_->view(), dx->view());
  x_.reset();
  return dx;
}

Act GELU::backward_inplace(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "GELU '" << name() << "': backward without a saved forward";
  layers::check_grad("GELU", name(), dy, x_->view().shape(), ctx);
  ctx.backend.gelu_backward(ctx.stream, dy->view(), x_->view(), dy->view());
  x_.reset();
  return dy;
}

LayerCost GELU::cost(std::int64_t seq_len, DType dtype) const {
  LayerCost c;
  c.saves_input = true;
  c.output_bytes = layers::nbytes(layers::mul(seq_len, features_), dtype);
  return c;
}

}  // namespace memfit
