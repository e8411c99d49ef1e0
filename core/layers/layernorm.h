// LayerNorm over the last dimension, as torch.nn.LayerNorm(C, eps) with an affine gain and
// bias (biased variance, eps inside the square root).
//
//   LayerNorm ln("h.0.ln1", C);                  // "h.0.ln1.weight" (ones), ".bias" (zeros)
//   Act y = ln.forward(ctx, x, /*save=*/true);   // x (..., C) -> y (..., C)
//   Act dx = ln.backward(ctx, dy);               // dx written; dweight, dbias += (FP32)
//   ln.backward_into(ctx, dy, dres);             // dres += dx: a residual stream's gradient
//
// Saves its input's handle and the row statistics mean, rstd (f32, one each per row): per
// sample 8*T bytes (saved_bytes) whatever the activation dtype. With save == false the
// statistics live only inside forward. No workspace; no flops counted (elementwise).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer.h"
#include "core/layers/layer_util.h"

namespace memfit {

class LayerNorm final : public Layer {
 public:
  LayerNorm(std::string name, std::int64_t hidden, float eps = 1e-5f);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  Act backward(LayerContext& ctx, const Act& dy) override;
  // backward, accumulating dx into dres (x's shape, ctx.dtype) instead of returning it: the
  // blocks hand it the residual stream's gradient, which saves a tensor and an add.
  void backward_into(LayerContext& ctx, const Act& dy, const Tensor& dres);
  void release_saved() noexcept override;
  bool has_saved() const override { return x_ != nullptr; }
  std::vector<Parameter*> parameters() override { return {&w_, &b_}; }
  LayerCost cost(std::int64_t seq_len, DType dtype) const override;
  PeakExcess peaks(std::int64_t, DType) const { return {}; }  // nothing beyond in/out/saved

  std::int64_t hidden() const { return hidden_; }
  float eps() const { return eps_; }
  Parameter& weight() { return w_; }
  Parameter& bias() { return b_; }

 private:
  std::int64_t hidden_;
  float eps_;
  Parameter w_, b_;
  Act x_, mean_, rstd_;
};

}  // namespace memfit
