// GELU, GPT-2's tanh approximation: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
//
//   GELU act("h.0.mlp.gelu", /*features=*/4 * C);
//   Act y = act.forward(ctx, h, /*save=*/true);   // (..., F) -> (..., F)
//   Act dh = act.backward(ctx, dy);               // a new tensor
//   Act dh2 = act.backward_inplace(ctx, dy);      // dy overwritten and returned (MLP uses it)
//
// Saves its input's handle only; no parameters. `features` (the last dimension) is what cost()
// needs; forward checks it. No GEMM flops.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer.h"
#include "core/layers/layer_util.h"

namespace memfit {

class GELU final : public Layer {
 public:
  GELU(std::string name, std::int64_t features);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  Act backward(LayerContext& ctx, const Act& dy) override;
  // The same, writing dx over dy (which the caller must own and no longer need).
  Act backward_inplace(LayerContext& ctx, const Act& dy);
  void release_saved() noexcept override { x_.reset(); }
  bool has_saved() const override { return x_ != nullptr; }
  std::vector<Parameter*> parameters() override { return {}; }
  LayerCost cost(std::int64_t seq_len, DType dtype) const override;
  PeakExcess peaks(std::int64_t, DType) const { return {}; }

 private:
  std::int64_t features_;
  Act x_;
};

}  // namespace memfit
