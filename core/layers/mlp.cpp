#include "core/layers/mlp.h"

#include "memory/check.h"

namespace memfit {

using layers::mul;
using layers::nbytes;

MLP::MLP(std::string name, std::int64_t hidden, std::int64_t inner, float proj_std)
    : Layer(name),
      hidden_(hidden),
      inner_(inner),
      fc_(name + ".fc", hidden, inner, true, layers::kInitStd),
      gelu_(name + ".gelu", inner),
      proj_(name + ".proj", inner, hidden, true, proj_std) {}

std::vector<Parameter*> MLP::parameters() {
  return {&fc_.weight(), &fc_.bias(), &proj_.weight(), &proj_.bias()};
}

void MLP::release_saved() noexcept {
  fc_.release_saved();
  gelu_.release_saved();
  proj_.release_saved();
}

Act MLP::forward(LayerContext& ctx, const Act& x, bool save) {
  MEMFIT_CHECK(!has_saved()) << "MLP '" << name() << "': forward while holding saved state";
  try {
    Act h = fc_.forward(ctx, x, save);
    Act g = gelu_.forward(ctx, h, save);
    h.reset();  // GELU holds it when saving
    return proj_.forward(ctx, g, save);
  } catch (...) {
    release_saved();
    throw;
  }
}

void MLP::forward_for_backward(LayerContext& ctx, const Act& x) {
  MEMFIT_CHECK(!has_saved()) << "MLP '" << name() << "': forward while holding saved state";
  try {
    Act h = fc_.forward(ctx, x, true);
    Act g = gelu_.forward(ctx, h, true);
    h.reset();
    proj_.forward_for_backward(ctx, g);
  } catch (...) {
    release_saved();
    throw;
  }
}

Act MLP::backward(LayerContext& ctx, const Act& dy) {
  MEMFIT_CHECK(has_saved()) << "MLP '" << name() << "': backward without a saved forward";
  Act dg = proj_.backward(ctx, dy);
  Act dh = gelu_.backward_inplace(ctx, dg);
  dg.reset();
  return fc_.backward(ctx, dh);
}

PeakExcess MLP::peaks(std::int64_t seq_len, DType dtype) const {
  const std::int64_t c = nbytes(mul(seq_len, hidden_), dtype);
  const std::int64_t f = nbytes(mul(seq_len, inner_), dtype);
  PeakExcess p;
  p.forward = 0;
  // Peak a: proj's dx (f) beside everything saved. Peak b: fc's dx (c) beside dh (f) with
  // both saved tensors gone (-2f). Measured against base + dx (c).
  const std::int64_t a = f - c;
  const std::int64_t b = -f;
  p.backward = a > b ? a : b;
  return p;
}

LayerCost MLP::cost(std::int64_t seq_len, DType dtype) const {
  LayerCost k;
  k.saves_input = true;
  k.saved_bytes = 2 * nbytes(mul(seq_len, inner_), dtype);
  k.output_bytes = nbytes(mul(seq_len, hidden_), dtype);
  k.workspace_bytes = peaks(seq_len, dtype).workspace();
  k.forward_flops = mul(4, mul(seq_len, mul(hidden_, inner_)));
  k.backward_flops = mul(2, k.forward_flops);
  k.for_backward_flops = k.forward_flops / 2;  // fc only: the projection keeps its input
  return k;
}

}  // namespace memfit
