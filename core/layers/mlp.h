// MLP: GPT-2's feed-forward sublayer, proj(gelu_tanh(fc(x))).
//
//   MLP mlp("h.0.mlp", C, /*inner=*/4 * C, /*proj_std=*/0.02f / std::sqrt(2.0f * L));
//   Act y = mlp.forward(ctx, x, /*save=*/true);   // (..., C) -> (..., C)
//   Act dx = mlp.backward(ctx, dy);
//
// Parameters, in order: "<name>.fc.weight" (F, C) N(0, 0.02), "<name>.fc.bias" (F),
// "<name>.proj.weight" (C, F) N(0, proj_std), "<name>.proj.bias" (C).
// Per sample of T tokens (f = T*F, c = T*C elements of dt bytes):
//   saved      fc's output (f, GELU's input) and GELU's output (f, proj's input); x is held by
//              fc (saves_input)
//   output     c
//   workspace  backward: proj's dx (f) lives beside both saved tensors for a moment; GELU's
//              backward then runs in place over it: f - c beyond dx (0 when F <= C).
//   flops      forward 4*T*C*F; backward twice that.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer.h"
#include "core/layers/gelu.h"
#include "core/layers/layer_util.h"
#include "core/layers/linear.h"

namespace memfit {

class MLP final : public Layer {
 public:
  MLP(std::string name, std::int64_t hidden, std::int64_t inner, float proj_std = 0.02f);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  void forward_for_backward(LayerContext& ctx, const Act& x) override;  // fc and GELU; no proj
  Act backward(LayerContext& ctx, const Act& dy) override;
  void release_saved() noexcept override;
  bool has_saved() const override { return fc_.has_saved(); }
  std::vector<Parameter*> parameters() override;
  LayerCost cost(std::int64_t seq_len, DType dtype) const override;
  PeakExcess peaks(std::int64_t seq_len, DType dtype) const;

  Linear& fc() { return fc_; }
  Linear& proj() { return proj_; }

 private:
  std::int64_t hidden_, inner_;
  Linear fc_;
  GELU gelu_;
  Linear proj_;
};

}  // namespace memfit
