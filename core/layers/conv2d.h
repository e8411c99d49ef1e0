// Conv2d: a 2-D convolution layer, channels-last, as torch.nn.Conv2d on NHWC data:
//   y[b,p,q,k] = bias[k] + sum_{r,s,c} x[b, p*sh - ph + r, q*sw - pw + s, c] * W[k,r,s,c].
//
//   Conv2dSpec spec{.height = 12, .width = 12, .in_channels = 1, .out_channels = 16,
//                   .kernel_h = 3, .kernel_w = 3, .pad_h = 1, .pad_w = 1};
//   Conv2d conv("conv1", spec);                    // "conv1.weight" (K,R,S,C), "conv1.bias" (K)
//   conv.allocate({alloc, DType::kBF16, Device::kCpu, kDefaultStream});
//   Act y = conv.forward(ctx, x, /*save=*/true);  // x (B, H*W, C) -> y (B, P*Q, K)
//   Act dx = conv.backward(ctx, dy);              // dW += , db += (FP32); dx (B, H*W, C)
//
// Activations stay (B, T, C) with T = H*W positions in row-major (h, w) order, so a Conv2d
// chains with GELU, Linear and the pool layer like any other layer; the image size is fixed
// at construction (the spec), and forward checks the input against it. The arithmetic is
// Backend::conv2d_forward/backward (core/backend.h) plus add_bias / bias_backward.
// Saves only its input's handle (saves_input; nothing of its own), like Linear. Weight init
// N(0, std) with std = init_std, or 1/sqrt(R*S*C) (fan-in scaling) when init_std is 0; bias 0.
// Costs per sample (seq_len must be H*W): output P*Q*K elements; forward 2*P*Q*K*R*S*C flops,
// backward twice that (dx and dW; bias terms are not counted, as in Linear); no workspace
// from the layer. On CUDA, cuDNN's workspace is the backend's own transient allocation
// (Category::kWorkspace, "cuda.conv.workspace"), not part of the layer's cost.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer.h"
#include "core/layers/layer_util.h"

namespace memfit {

struct Conv2dSpec {
  std::int64_t height = 0, width = 0;  // the input image
  std::int64_t in_channels = 0, out_channels = 0;
  std::int64_t kernel_h = 3, kernel_w = 3;
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;
  bool bias = true;
  float init_std = 0.0f;  // 0: 1/sqrt(kernel_h * kernel_w * in_channels)
};

class Conv2d final : public Layer {
 public:
  // InvalidArgument naming the layer for a geometry Conv2dDesc rejects (core/backend.h).
  Conv2d(std::string name, const Conv2dSpec& spec);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  Act backward(LayerContext& ctx, const Act& dy) override;
  void release_saved() noexcept override { x_.reset(); }
  bool has_saved() const override { return x_ != nullptr; }
  std::vector<Parameter*> parameters() override;
  LayerCost cost(std::int64_t seq_len, DType dtype) const override;
  PeakExcess peaks(std::int64_t, DType) const { return {}; }  // nothing beyond in/out/saved

  const Conv2dSpec& spec() const { return spec_; }
  std::int64_t out_height() const { return desc_.p(); }
  std::int64_t out_width() const { return desc_.q(); }
  std::int64_t in_positions() const { return spec_.height * spec_.width; }  // T in
  std::int64_t out_positions() const { return desc_.p() * desc_.q(); }      // T out
  // The backend descriptor for a batch of b images.
  Conv2dDesc desc(std::int64_t b) const;
  Parameter& weight() { return w_; }
  Parameter& bias() { return b_; }  // unallocated, unused when !spec().bias

 private:
  Conv2dSpec spec_;
  Conv2dDesc desc_;  // n = 1
  Parameter w_, b_;
  Act x_;  // the saved input
};

}  // namespace memfit
