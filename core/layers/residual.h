// Residual: y = x + inner(x), the skip connection around any layer whose output has its
// input's shape (a user's chain; the built-in blocks add their residuals inline, the same way).
//
//   Residual r("res0", std::make_unique<Linear>("res0.fc", C, C));
//   Act y = r.forward(ctx, x, true);     // inner(x) + x
//   Act dx = r.backward(ctx, dy);        // dy + inner'(dy)
//
// The add runs in place over inner's output when nobody else holds it (a layer that saved
// its own output keeps it intact: then the sum goes to a new tensor), and over inner's dx,
// so the wrapper adds no memory of its own: its cost is inner's (flops of the add aside).
// Parameters are inner's; the output tag is inner's output's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/layer.h"

namespace memfit {

class Residual final : public Layer {
 public:
  // InvalidArgument for a null inner.
  Residual(std::string name, std::unique_ptr<Layer> inner);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  Act backward(LayerContext& ctx, const Act& dy) override;
  void release_saved() noexcept override { inner_->release_saved(); }
  bool has_saved() const override { return inner_->has_saved(); }
  std::vector<Parameter*> parameters() override { return inner_->parameters(); }
  void allocate(const ParamAlloc& a) override { inner_->allocate(a); }
  LayerCost cost(std::int64_t seq_len, DType dtype) const override {
    LayerCost k = inner_->cost(seq_len, dtype);
    k.for_backward_flops = -1;  // the default forward_for_backward: the whole forward
    return k;
  }

  Layer& inner() { return *inner_; }

 private:
  std::unique_ptr<Layer> inner_;
};

}  // namespace memfit
