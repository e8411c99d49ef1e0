#include "core/layers/linear.h"

#include "core/layers/layer_util.h"
#include "memory/check.h"

namespace memfit {

using layers::mul;

Linear::Linear(std::string name, std::int64_t in, std::int64_t out, bool bias, float init_std)
    : Layer(std::move(name)), in_(in), out_(out), has_bias_(bias) {
  layers::check_dim("Linear", this->name(), "in_features", in);
  layers::check_dim("Linear", this->name(), "out_features", out);
  layers::init_param(w_, this->name() + ".weight", Shape{out, in}, ParamInit::Kind::kNormal,
                     init_std);
  if (has_bias_)
    layers::init_param(b_, this->name() + ".bias", Shape{out}, ParamInit::Kind::kZeros);
}

std::vector<Parameter*> Linear::parameters() {
  if (has_bias_) return {&w_, &b_};
  return {&w_};
}

Act Linear::forward(LayerContext& ctx, const Act& x, bool save) {
  MEMFIT_CHECK(!has_saved()) << "Linear '" << name() << "': forward while holding saved state";
  layers::check_input("Linear", name(), x, in_, ctx);
  const Shape& xs = x->view().shape();
  Act y = ctx.make(layers::with_last(xs, out_), ctx.dtype, Category::kActivation, name());
  GemmDesc d;  // x (N,in) @ W^T, W stored (out,in)
  d.m = layers::rows(xs);
  d.n = out_;
  d.k = in_;
  d.trans_b = true;
  ctx.backend.gemm(ctx.stream, d, x->view(), w_.weight.view(), y->view());
  if (has_bias_) ctx.backend.add_bias(ctx.stream, b_.weight.view(), y->view());
  if (save) x_ = x;
  return y;
}

void Linear::forward_for_backward(LayerContext& ctx, const Act& x) {
  MEMFIT_CHECK(!has_saved()) << "Linear '" << name() << "': forward while holding saved state";
  layers::check_input("Linear", name(), x, in_, ctx);
  x_ = x;  // backward reads x and W, never y
}

Act Linear::backward(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "Linear '" << name() << "': backward without a saved forward";
  const Shape& xs = x_->view().shape();
  layers::check_grad("Linear", name(), dy, layers::with_last(xs, out_), ctx);
  const std::int64_t n = layers::rows(xs);
  Act dx = ctx.make(xs, ctx.dtype, Category::kTemporary, name());
  GemmDesc dd;  // dx (N,in) = dy (N,out) @ W (out,in)
  dd.m = n;
  dd.n = in_;
  dd.k = out_;
  ctx.backend.gemm(ctx.stream, dd, dy->view(), w_.weight.view(), dx->view());
  GemmDesc dw;  // dW (out,in) += dy^T (out,N) @ x (N,in)
  dw.m = out_;
  dw.n = in_;
  dw.k = n;
  dw.trans_a = true;
  dw.beta = 1.0f;
  ctx.backend.gemm(ctx.stream, dw, dy->view(), x_->view(), w_.grad.view());
  if (has_bias_) ctx.backend.bias_backward(ctx.stream, dy->view(), b_.grad.view());
  x_.reset();
  return dx;
}

LayerCost Linear::cost(std::int64_t seq_len, DType dtype) const {
  LayerCost c;
  c.saves_input = true;
  c.output_bytes = layers::nbytes(mul(seq_len, out_), dtype);
  c.forward_flops = mul(2, mul(seq_len, mul(in_, out_)));
  c.backward_flops = mul(2, c.forward_flops);
  c.for_backward_flops = 0;  // keeps its input, no GEMM
  return c;
}

}  // namespace memfit
