// LossScaler: dynamic loss scaling for f16 training, PyTorch GradScaler's rules and defaults.
//
//   LossScaler scaler;                                  // enabled, scale 65536
//   float dloss = scaler.scale() / rows;                // the loss gradient, scaled
//   ... backward ...
//   bool inf = grads_nonfinite(ctx, model.parameters()); // one sumsq pass, one host read
//   if (scaler.update(inf)) opt.skip(ctx); else opt.step(ctx, 1.0 / scaler.scale_used());
//
// update(found_inf): with an inf/NaN gradient the step is to be skipped (returns true), the
// scale is multiplied by backoff_factor (0.5) and the clean-step count restarts; otherwise
// (returns false) the count grows and after growth_interval (2000) clean steps in a row the
// scale is multiplied by growth_factor (2). scale_used() is the scale the finished step's
// gradients carry (before update() changed it). Disabled: scale 1, update() returns
// found_inf (a non-finite gradient still skips the step) and never changes the scale.
// Options are validated (InvalidArgument naming the field): init_scale finite > 0,
// growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1. The scale never rises
// above FLT_MAX nor falls below FLT_MIN (it saturates, as a float scale must).
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend.h"  // SumSqResult
#include "core/layer.h"

namespace memfit {

struct LossScalerOptions {
  bool enabled = true;
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

struct LossScalerState {
  double scale = 65536.0;
  std::int64_t growth_tracker = 0;  // clean steps since the last change
  bool operator==(const LossScalerState&) const = default;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});
  bool enabled() const { return options_.enabled; }
  double scale() const;       // to multiply the loss gradient with (1 when disabled)
  double scale_used() const;  // the scale of the step update() last judged (scale() before it)
  bool update(bool found_inf);  // true: skip this step

  LossScalerState state() const { return state_; }
  void set_state(const LossScalerState& s);  // InvalidArgument for a non-finite or <= 0 scale
  const LossScalerOptions& options() const { return options_; }

 private:
  LossScalerOptions options_;
  LossScalerState state_;
  double used_ = 1.0;
};

// The sum of squares of every finite gradient element of `params` and whether any is inf or NaN
// (core/backend.h's sumsq, deterministic): one sumsq pass on ctx.stream into one device slot
// pair, one copy to the host, one synchronize. Zero and false on the meta backend. Both the
// loss scaler's check and gradient clipping (TrainerOptions::max_grad_norm) read it.
SumSqResult grads_sumsq(LayerContext& ctx, const std::vector<Parameter*>& params);
inline bool grads_nonfinite(LayerContext& ctx, const std::vector<Parameter*>& params) {
  return grads_sumsq(ctx, params).nonfinite;
}

}  // namespace memfit
