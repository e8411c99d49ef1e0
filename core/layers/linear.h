// Linear: y = x @ W^T + b over the last dimension, as torch.nn.Linear (W is (out, in)).
//
//   Linear fc("h.0.mlp.fc", /*in=*/C, /*out=*/4 * C);         // "h.0.mlp.fc.weight", ".bias"
//   fc.allocate({alloc, DType::kBF16, Device::kCpu, kDefaultStream});
//   Act y = fc.forward(ctx, x, /*save=*/true);   // x (..., in) -> y (..., out)
//   Act dx = fc.backward(ctx, dy);               // dW += dy^T x, db += sum dy (FP32)
//
// Saves only its input's handle (saves_input; nothing of its own). Weight init N(0, std)
// (GPT-2: 0.02, or 0.02/sqrt(2 * layers) for projections into the residual stream), bias 0.
// Costs per sample of T tokens: output T*out elements; forward 2*T*in*out flops, backward
// twice that (dx and dW); no workspace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer.h"
#include "core/layers/layer_util.h"

namespace memfit {

class Linear final : public Layer {
 public:
  Linear(std::string name, std::int64_t in, std::int64_t out, bool bias = true,
         float init_std = 0.02f);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  void forward_for_backward(LayerContext& ctx, const Act& x) override;  // keeps x; no GEMM
  Act backward(LayerContext& ctx, const Act& dy) override;
  void release_saved() noexcept override { x_.reset(); }
  bool has_saved() const override { return x_ != nullptr; }
  std::vector<Parameter*> parameters() override;
  LayerCost cost(std::int64_t seq_len, DType dtype) const override;
  PeakExcess peaks(std::int64_t, DType) const { return {}; }  // nothing beyond in/out/saved

  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }
  bool has_bias() const { return has_bias_; }
  Parameter& weight() { return w_; }
  Parameter& bias() { return b_; }  // unallocated, unused when !has_bias()

 private:
  std::int64_t in_, out_;
  bool has_bias_;
  Parameter w_, b_;
  Act x_;  // the saved input
};

}  // namespace memfit
