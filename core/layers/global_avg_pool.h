// GlobalAvgPool: the mean over positions, the pooling step between a CNN's convolutions and
// its classifier: x (B, T, C) -> y (B, 1, C), y[b,0,c] = (1/T) sum_t x[b,t,c].
//
//   GlobalAvgPool pool("pool", /*positions=*/P * Q, /*channels=*/K);
//   Act y = pool.forward(ctx, x, /*save=*/true);   // (B, P*Q, K) -> (B, 1, K)
//   Act dx = pool.backward(ctx, dy);               // dx[b,t,c] = dy[b,0,c] / T
//
// Both directions are one batched GEMM with a vector of ones that every batch entry shares
// (stride 0), so each backend's GEMM does the work and the sums are as deterministic as the
// GEMM: forward y[b] (1,C) = (1/T) ones (1,T) @ x[b] (T,C); backward dx[b] (T,C) =
// (1/T) ones (T,1) @ dy[b] (1,C). The ones vector (T elements in ctx.dtype, Category::kTemporary,
// tagged with the layer's name) is made and filled inside each call and freed on return.
// Saves nothing (backward needs only T and the shape). No parameters.
// Costs per sample: output C elements; 2*T*C GEMM flops each way; workspace the ones vector,
// T elements, which is per call, not per sample (one vector serves the whole batch), so at
// batch B the real figure is 1/B of what B * workspace_bytes says.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer.h"
#include "core/layers/layer_util.h"

namespace memfit {

class GlobalAvgPool final : public Layer {
 public:
  GlobalAvgPool(std::string name, std::int64_t positions, std::int64_t channels);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  Act backward(LayerContext& ctx, const Act& dy) override;
  void release_saved() noexcept override { saved_batch_ = -1; }
  bool has_saved() const override { return saved_batch_ >= 0; }
  std::vector<Parameter*> parameters() override { return {}; }
  LayerCost cost(std::int64_t seq_len, DType dtype) const override;
  // The ones vector during forward and during backward (see the workspace note above).
  PeakExcess peaks(std::int64_t seq_len, DType dtype) const;

  std::int64_t positions() const { return positions_; }
  std::int64_t channels() const { return channels_; }

 private:
  Act ones(LayerContext& ctx) const;
  std::int64_t positions_, channels_;
  std::int64_t saved_batch_ = -1;  // B of the saved forward; -1: nothing saved
};

}  // namespace memfit
