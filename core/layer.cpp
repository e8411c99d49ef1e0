#include "core/layer.h"

#include <memory>

namespace memfit {

Act LayerContext::make(Shape shape, DType dt, Category category, std::string_view tag) const {
  return std::make_shared<OwnedTensor>(
      OwnedTensor::empty(alloc, shape, dt, backend.device(), category, stream, tag));
}

LayerCost& LayerCost::operator+=(const LayerCost& o) {
  saved_bytes += o.saved_bytes;
  saves_input = saves_input || o.saves_input;
  output_bytes += o.output_bytes;
  workspace_bytes += o.workspace_bytes;
  forward_flops += o.forward_flops;
  backward_flops += o.backward_flops;
  for_backward_flops = -1;
  return *this;
}

void Layer::forward_for_backward(LayerContext& ctx, const Act& x) { (void)forward(ctx, x, true); }

void Layer::allocate(const ParamAlloc& a) {
  for (Parameter* p : parameters()) {
    // Tied parameters appear in more than one layer; the first allocation wins.
    if (!p->placed) allocate_parameter(*p, a);
  }
}

}  // namespace memfit
