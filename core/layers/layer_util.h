// Helpers shared by the built-in layers (not a public API): shape checks, the same shape with
// a new last dimension, byte counts of per-sample costs, parameter setup.
#pragma once

#include <cstdint>
#include <string>

#include "core/layer.h"

namespace memfit::layers {

// InvalidArgument unless x is defined, in `dtype`, on `device`, has >= 2 dimensions and its
// last dimension is `last` (the layer's input width).
void check_input(const char* layer_kind, const std::string& name, const Act& x,
                 std::int64_t last, const LayerContext& ctx);
// InvalidArgument unless dy has `shape`.
void check_grad(const char* layer_kind, const std::string& name, const Act& dy,
                const Shape& shape, const LayerContext& ctx);
// InvalidArgument for a dimension < 1.
void check_dim(const char* layer_kind, const std::string& name, const char* what,
               std::int64_t v);

// x's shape with its last dimension replaced by `last`.
Shape with_last(const Shape& s, std::int64_t last);
// Product of the dimensions before the last (the GEMM's m).
inline std::int64_t rows(const Shape& s) { return s.numel() / s[s.ndim() - 1]; }

// Bytes of n elements of dt (overflow-checked).
std::int64_t nbytes(std::int64_t n, DType dt);
// Overflow-checked product of non-negative sizes.
std::int64_t mul(std::int64_t a, std::int64_t b);

void init_param(Parameter& p, std::string name, Shape shape, ParamInit::Kind kind,
                float std = 0.0f);

// GPT-2's initialization scale for weights, and for the projections into the residual stream
// (GPT-2 paper, section 2.3: scaled by 1/sqrt(N) for N residual layers; two per block).
inline constexpr float kInitStd = 0.02f;
float residual_init_std(std::int64_t n_layers);

}  // namespace memfit::layers

namespace memfit {

// What the composite layers need to add their parts' memory exactly (the public LayerCost has
// one workspace figure, the larger of the two):
//   forward_excess  = peak during forward(save=true) - (live before + saved + output)
//   backward_excess = peak during backward - (live before, saved and dy included, + dx)
// backward_excess may be negative (a layer that frees saved state before its dx is made).
struct PeakExcess {
  std::int64_t forward = 0;
  std::int64_t backward = 0;
  std::int64_t workspace() const {
    return forward > backward ? (forward > 0 ? forward : 0) : (backward > 0 ? backward : 0);
  }
};

}  // namespace memfit
