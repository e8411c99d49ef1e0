// GatedMLP: the Llama family's feed-forward sublayer, down(silu(gate(x)) * up(x)) (SwiGLU,
// Shazeer 2020), with gate and up fused into one projection.
//
//   GatedMLP mlp("layers.0.mlp", C, /*inner=*/F, /*bias=*/false, proj_std);
//   Act y = mlp.forward(ctx, x, /*save=*/true);   // (..., C) -> (..., C)
//   Act dx = mlp.backward(ctx, dy);
//
// Parameters, in order: "<name>.gate_up.weight" (2F, C) N(0, 0.02) (rows: HuggingFace's
// gate_proj, then up_proj), "<name>.gate_up.bias" (2F) when bias, "<name>.down.weight"
// (C, F) N(0, proj_std) (down_proj), "<name>.down.bias" (C) when bias.
// Per sample of T tokens (f = T*F, c = T*C elements of dt bytes):
//   saved      gate_up's output (2f, SwiGLU's input) and SwiGLU's output (f, down's input);
//              x is held by gate_up (saves_input)
//   output     c
//   workspace  backward: down's dx (f) beside the saved state: f - c beyond dx (dgate_up is
//              written in place over the saved gate_up output); forward: none
//   flops      forward 6*T*C*F (gate_up 4TCF, down 2TCF); backward twice that.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer.h"
#include "core/layers/layer_util.h"
#include "core/layers/linear.h"

namespace memfit {

class GatedMLP final : public Layer {
 public:
  // InvalidArgument for sizes < 1.
  GatedMLP(std::string name, std::int64_t hidden, std::int64_t inner, bool bias = false,
           float proj_std = 0.02f);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  void forward_for_backward(LayerContext& ctx, const Act& x) override;  // no down projection
  Act backward(LayerContext& ctx, const Act& dy) override;
  void release_saved() noexcept override;
  bool has_saved() const override { return gate_up_.has_saved(); }
  std::vector<Parameter*> parameters() override;
  LayerCost cost(std::int64_t seq_len, DType dtype) const override;
  PeakExcess peaks(std::int64_t seq_len, DType dtype) const;

  Linear& gate_up() { return gate_up_; }
  Linear& down() { return down_; }

 private:
  std::int64_t hidden_, inner_;
  bool bias_;
  Linear gate_up_, down_;
  Act gu_;  // saved: gate_up's output (B,T,2F)
};

}  // namespace memfit
