// RMSNorm over the last dimension (Zhang & Sennrich 2019), as the Llama family's
// LlamaRMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, no bias, no mean subtracted.
//
//   RMSNorm norm("layers.0.input_layernorm", C, 1e-5f);   // "<name>.weight" (ones)
//   Act y = norm.forward(ctx, x, /*save=*/true);          // x (..., C) -> y (..., C)
//   Act dx = norm.backward(ctx, dy);                      // dx written; dweight += (FP32)
//   norm.backward_into(ctx, dy, dres);                    // dres += dx (a residual stream)
//
// Saves its input's handle and one f32 rstd per row: per sample 4*T bytes (saved_bytes)
// whatever the activation dtype. With save == false rstd lives only inside forward. No
// workspace; no flops counted (elementwise). Arithmetic: Backend::rmsnorm_forward/backward
// (FP32, the normalized value times the weight rounded once; HuggingFace rounds the normalized
// value to the input dtype before the weight multiplies it, a difference of one rounding).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer.h"
#include "core/layers/layer_util.h"

namespace memfit {

class RMSNorm final : public Layer {
 public:
  RMSNorm(std::string name, std::int64_t hidden, float eps = 1e-6f);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  Act backward(LayerContext& ctx, const Act& dy) override;
  // backward, accumulating dx into dres (x's shape, ctx.dtype) instead of returning it.
  void backward_into(LayerContext& ctx, const Act& dy, const Tensor& dres);
  void release_saved() noexcept override;
  bool has_saved() const override { return x_ != nullptr; }
  std::vector<Parameter*> parameters() override { return {&w_}; }
  LayerCost cost(std::int64_t seq_len, DType dtype) const override;
  PeakExcess peaks(std::int64_t, DType) const { return {}; }  // nothing beyond in/out/saved

  std::int64_t hidden() const { return hidden_; }
  float eps() const { return eps_; }
  Parameter& weight() { return w_; }

 private:
  std::int64_t hidden_;
  float eps_;
  Parameter w_;
  Act x_, rstd_;
};

}  // namespace memfit
