#include "core/layers/global_avg_pool.h"

#include "memory/check.h"
#include "memory/error.h"

namespace memfit {

using layers::mul;

GlobalAvgPool::GlobalAvgPool(std::string name, std::int64_t positions, std::int64_t channels)
    : Layer(std::move(name)), positions_(positions), channels_(channels) {
  layers::check_dim("GlobalAvgPool", this->name(), "positions", positions);
  layers::check_dim("GlobalAvgPool", this->name(), "channels", channels);
}

Act GlobalAvgPool::ones(LayerContext& ctx) const {
  Act o = ctx.make(Shape{positions_}, ctx.dtype, Category::kTemporary, name());
  ctx.backend.fill(ctx.stream, o->view(), 1.0f);
  return o;
}

Act GlobalAvgPool::forward(LayerContext& ctx, const Act& x, bool save) {
  MEMFIT_CHECK(!has_saved()) << "GlobalAvgPool '" << name()
                             << "': forward while holding saved state";
  layers::check_input("GlobalAvgPool", name(), x, channels_, ctx);
  const Shape& xs = x->view().shape();
  if (xs.ndim() != 3 || xs[1] != positions_) {
    throw InvalidArgument("GlobalAvgPool '" + name() + "': input shape " + xs.str() +
                          "; valid: (B, " + std::to_string(positions_) + ", " +
                          std::to_string(channels_) + ")");
  }
  const std::int64_t b = xs[0];
  Act y = ctx.make(Shape{b, 1, channels_}, ctx.dtype, Category::kActivation, name());
  const Act one = ones(ctx);
  GemmDesc d;  // y[b] (1,C) = (1/T) ones (1,T) @ x[b] (T,C)
  d.m = 1;
  d.n = channels_;
  d.k = positions_;
  d.alpha = static_cast<float>(1.0 / static_cast<double>(positions_));
  d.batch = b;
  d.stride_a = 0;
  ctx.backend.gemm(ctx.stream, d, one->view(), x->view(), y->view());
  if (save) saved_batch_ = b;
  return y;
}

Act GlobalAvgPool::backward(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "GlobalAvgPool '" << name() << "': backward without a saved forward";
  const std::int64_t b = saved_batch_;
  layers::check_grad("GlobalAvgPool", name(), dy, Shape{b, 1, channels_}, ctx);
  Act dx = ctx.make(Shape{b, positions_, channels_}, ctx.dtype, Category::kTemporary, name());
  const Act one = ones(ctx);
  GemmDesc d;  // dx[b] (T,C) = (1/T) ones (T,1) @ dy[b] (1,C)
  d.m = positions_;
  d.n = channels_;
  d.k = 1;
  d.alpha = static_cast<float>(1.0 / static_cast<double>(positions_));
  d.batch = b;
  d.stride_a = 0;
  ctx.backend.gemm(ctx.stream, d, one->view(), dy->view(), dx->view());
  saved_batch_ = -1;
  return dx;
}

PeakExcess GlobalAvgPool::peaks(std::int64_t seq_len, DType dtype) const {
  (void)seq_len;
  const std::int64_t ones_bytes = layers::nbytes(positions_, dtype);
  return {ones_bytes, ones_bytes};
}

LayerCost GlobalAvgPool::cost(std::int64_t seq_len, DType dtype) const {
  if (seq_len != positions_) {
    throw InvalidArgument("GlobalAvgPool '" + name() + "': cost at seq_len " +
                          std::to_string(seq_len) + "; valid: its positions, " +
                          std::to_string(positions_));
  }
  LayerCost c;
  c.output_bytes = layers::nbytes(channels_, dtype);
  c.workspace_bytes = peaks(seq_len, dtype).workspace();
  c.forward_flops = mul(2, mul(positions_, channels_));
  c.backward_flops = c.forward_flops;
  return c;
}

}  // namespace memfit
