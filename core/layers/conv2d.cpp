#include "core/layers/conv2d.h"

#include <cmath>

#include "memory/check.h"
#include "memory/error.h"

namespace memfit {

using layers::mul;

Conv2d::Conv2d(std::string name, const Conv2dSpec& spec) : Layer(std::move(name)), spec_(spec) {
  desc_.n = 1;
  desc_.h = spec.height;
  desc_.w = spec.width;
  desc_.c = spec.in_channels;
  desc_.k = spec.out_channels;
  desc_.r = spec.kernel_h;
  desc_.s = spec.kernel_w;
  desc_.stride_h = spec.stride_h;
  desc_.stride_w = spec.stride_w;
  desc_.pad_h = spec.pad_h;
  desc_.pad_w = spec.pad_w;
  const std::string why = desc_.invalid_reason();
  if (!why.empty()) {
    throw InvalidArgument("Conv2d '" + this->name() + "': geometry " + desc_.str() + ": " + why);
  }
  const float std =
      spec.init_std > 0.0f
          ? spec.init_std
          : static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec.kernel_h * spec.kernel_w *
                                                                   spec.in_channels)));
  layers::init_param(w_, this->name() + ".weight",
                     Shape{spec.out_channels, spec.kernel_h, spec.kernel_w, spec.in_channels},
                     ParamInit::Kind::kNormal, std);
  if (spec.bias) {
    layers::init_param(b_, this->name() + ".bias", Shape{spec.out_channels},
                       ParamInit::Kind::kZeros);
  }
}

Conv2dDesc Conv2d::desc(std::int64_t b) const {
  Conv2dDesc d = desc_;
  d.n = b;
  return d;
}

std::vector<Parameter*> Conv2d::parameters() {
  if (spec_.bias) return {&w_, &b_};
  return {&w_};
}

Act Conv2d::forward(LayerContext& ctx, const Act& x, bool save) {
  MEMFIT_CHECK(!has_saved()) << "Conv2d '" << name() << "': forward while holding saved state";
  layers::check_input("Conv2d", name(), x, spec_.in_channels, ctx);
  const Shape& xs = x->view().shape();
  if (xs.ndim() != 3 || xs[1] != in_positions()) {
    throw InvalidArgument("Conv2d '" + name() + "': input shape " + xs.str() + "; valid: (B, " +
                          std::to_string(in_positions()) + ", " +
                          std::to_string(spec_.in_channels) + "), images of " +
                          std::to_string(spec_.height) + " x " + std::to_string(spec_.width) +
                          " positions, channels last");
  }
  const std::int64_t b = xs[0];
  Act y = ctx.make(Shape{b, out_positions(), spec_.out_channels}, ctx.dtype, Category::kActivation,
                   name());
  ctx.backend.conv2d_forward(ctx.stream, desc(b), x->view(), w_.weight.view(), y->view());
  if (spec_.bias) ctx.backend.add_bias(ctx.stream, b_.weight.view(), y->view());
  if (save) x_ = x;
  return y;
}

Act Conv2d::backward(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "Conv2d '" << name() << "': backward without a saved forward";
  const Shape& xs = x_->view().shape();
  const std::int64_t b = xs[0];
  layers::check_grad("Conv2d", name(), dy, Shape{b, out_positions(), spec_.out_channels}, ctx);
  Act dx = ctx.make(xs, ctx.dtype, Category::kTemporary, name());
  const Tensor dxv = dx->view();
  ctx.backend.conv2d_backward(ctx.stream, desc(b), dy->view(), x_->view(), w_.weight.view(), &dxv,
                              w_.grad.view());
  if (spec_.bias) ctx.backend.bias_backward(ctx.stream, dy->view(), b_.grad.view());
  x_.reset();
  return dx;
}

LayerCost Conv2d::cost(std::int64_t seq_len, DType dtype) const {
  if (seq_len != in_positions()) {
    throw InvalidArgument(
        "Conv2d '" + name() + "': cost at seq_len " + std::to_string(seq_len) +
        "; valid: the input's positions, height * width = " + std::to_string(in_positions()));
  }
  LayerCost c;
  c.saves_input = true;
  c.output_bytes = layers::nbytes(mul(out_positions(), spec_.out_channels), dtype);
  c.forward_flops = desc_.flops();  // n = 1: one sample
  c.backward_flops = mul(2, c.forward_flops);
  return c;
}

}  // namespace memfit
