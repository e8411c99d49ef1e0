#include "core/layers/gated_mlp.h"

#include "memory/check.h"

namespace memfit {

using layers::mul;
using layers::nbytes;

namespace {

std::int64_t checked_inner(const std::string& name, std::int64_t hidden, std::int64_t inner) {
  layers::check_dim("GatedMLP", name, "hidden", hidden);
  layers::check_dim("GatedMLP", name, "inner", inner);
  return inner;
}

}  // namespace

GatedMLP::GatedMLP(std::string name, std::int64_t hidden, std::int64_t inner, bool bias,
                   float proj_std)
    : Layer(name),
      hidden_(hidden),
      inner_(checked_inner(name, hidden, inner)),
      bias_(bias),
      gate_up_(name + ".gate_up", hidden, mul(2, inner), bias, layers::kInitStd),
      down_(name + ".down", inner, hidden, bias, proj_std) {}

std::vector<Parameter*> GatedMLP::parameters() {
  if (!bias_) return {&gate_up_.weight(), &down_.weight()};
  return {&gate_up_.weight(), &gate_up_.bias(), &down_.weight(), &down_.bias()};
}

void GatedMLP::release_saved() noexcept {
  gate_up_.release_saved();
  down_.release_saved();
  gu_.reset();
}

Act GatedMLP::forward(LayerContext& ctx, const Act& x, bool save) {
  MEMFIT_CHECK(!has_saved()) << "GatedMLP '" << name() << "': forward while holding saved state";
  try {
    Act gu = gate_up_.forward(ctx, x, save);  // (..., 2F)
    Act h = ctx.make(layers::with_last(gu->view().shape(), inner_), ctx.dtype,
                     Category::kActivation, name());
    ctx.backend.swiglu_forward(ctx.stream, gu->view(), h->view());
    if (!save) gu.reset();
    Act y = down_.forward(ctx, h, save);
    if (save) gu_ = std::move(gu);
    return y;
  } catch (...) {
    release_saved();
    throw;
  }
}

void GatedMLP::forward_for_backward(LayerContext& ctx, const Act& x) {
  MEMFIT_CHECK(!has_saved()) << "GatedMLP '" << name() << "': forward while holding saved state";
  try {
    Act gu = gate_up_.forward(ctx, x, true);
    Act h = ctx.make(layers::with_last(gu->view().shape(), inner_), ctx.dtype,
                     Category::kActivation, name());
    ctx.backend.swiglu_forward(ctx.stream, gu->view(), h->view());
    down_.forward_for_backward(ctx, h);
    gu_ = std::move(gu);
  } catch (...) {
    release_saved();
    throw;
  }
}

Act GatedMLP::backward(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "GatedMLP '" << name() << "': backward without a saved forward";
  Act dh = down_.backward(ctx, dy);  // down drops its handle on SwiGLU's output
  // dgate_up in place over the saved gate_up, which nothing reads after this.
  Act dgu = std::move(gu_);
  ctx.backend.swiglu_backward(ctx.stream, dh->view(), dgu->view(), dgu->view());
  dh.reset();
  return gate_up_.backward(ctx, dgu);
}

PeakExcess GatedMLP::peaks(std::int64_t seq_len, DType dtype) const {
  const std::int64_t c = nbytes(mul(seq_len, hidden_), dtype);
  const std::int64_t f = nbytes(mul(seq_len, inner_), dtype);
  PeakExcess p;
  p.forward = 0;
  // down's dx (dh, f) beside all 3f saved, against base (3f saved) + dx (c); dgate_up then
  // takes the saved gate_up's memory, and gate_up's dx comes with only dgate_up (2f) left.
  p.backward = f - c;
  return p;
}

LayerCost GatedMLP::cost(std::int64_t seq_len, DType dtype) const {
  LayerCost k;
  k.saves_input = true;
  k.saved_bytes = 3 * nbytes(mul(seq_len, inner_), dtype);
  k.output_bytes = nbytes(mul(seq_len, hidden_), dtype);
  k.workspace_bytes = peaks(seq_len, dtype).workspace();
  k.forward_flops = mul(6, mul(seq_len, mul(hidden_, inner_)));
  k.backward_flops = mul(2, k.forward_flops);
  k.for_backward_flops = mul(4, mul(seq_len, mul(hidden_, inner_)));  // gate_up; down keeps x
  return k;
}

}  // namespace memfit
