// DeviceAdamW: AdamW on the device: FP32 Adam moments beside the FP32 masters, one
// Backend::adamw per parameter (core/adamw.h's arithmetic, so it matches the CPU offload path
// bit for bit).
//
//   DeviceAdamW opt(model.parameters(), options, ctx);   // moments allocated, zeroed
//   opt.step(ctx, 1.0 / loss_scale);                    // masters updated, weights rounded
//
// Moments are Category::kOptimizerState, tagged "exp_avg/<name>", "exp_avg_sq/<name>". With a
// low-precision compute dtype the update writes the master (Parameter::master) and the rounded
// working copy (Parameter::weight) in the same pass; with f32 it updates the weight in place.
// Contract: core/optimizer.h.
#pragma once

#include <vector>

#include "core/optimizer.h"

namespace memfit {

class DeviceAdamW final : public Optimizer {
 public:
  DeviceAdamW(std::vector<Parameter*> params, AdamWOptions options, LayerContext& ctx);

  const char* name() const override { return "adamw"; }
  void step(LayerContext& ctx, double grad_scale) override;
  void skip(LayerContext& ctx) override;
  std::int64_t steps() const override { return steps_; }
  void set_steps(std::int64_t steps) override;
  std::vector<StateTensor> state() override;  // master/<name> (or weight/<name> for f32),
                                              // exp_avg/<name>, exp_avg_sq/<name>
  void state_loaded(LayerContext& ctx) override;
  const AdamWOptions& options() const override { return options_; }
  void set_lr(double lr) override;

 private:
  std::vector<Parameter*> params_;
  AdamWOptions options_;
  std::vector<OwnedTensor> exp_avg_, exp_avg_sq_;
  std::int64_t steps_ = 0;
};

}  // namespace memfit
