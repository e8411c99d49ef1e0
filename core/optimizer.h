// Optimizer: what the trainer needs from anything that updates a model's parameters, and what
// a training-state file saves of it. Implementations: AdamW on the device
// (core/device_adamw.h) and the CPU-offloaded AdamW (policies/offload_optimizer.h).
//
//   DeviceAdamW opt(model.parameters(), options, ctx);
//   ... backward of the last micro-batch ...
//   if (found_inf) opt.skip(ctx); else opt.step(ctx, 1.0 / loss_scale);
//
// Contract:
// - Built over a fixed list of Parameters; all its state (Adam moments, offloaded masters,
//   staging buffers) is allocated at construction, so step() never allocates and an
//   OutOfMemory can only happen before the first step, never half-way through an update.
// - grads_ready(ctx, params): the step's gradients of `params` are final (called from
//   executor hooks during the last micro-batch's backward). An implementation may start
//   moving them. Optional: step() must work without it.
// - before_stage/after_stage(ctx, stage, m, count): every micro-batch's backward stages
//   (gradient offload needs them all; grads_ready is the last micro-batch's after_stage seen
//   per parameter).
// - before_use/after_use(ctx, unit, next): around every use of a weight unit
//   (Model::weight_units(), ExecutorHooks::before_use), forwards, recomputes, backwards and
//   evaluation alike (weight offload lends the weights their device memory there).
// - step(ctx, grad_scale): one update of every parameter with gradients multiplied by
//   grad_scale (1 / loss scale; the accumulation weighting is already in the loss's gradient),
//   then the working weights (Parameter::weight) hold the new values rounded to the compute
//   dtype. steps() counts completed updates (AdamW's bias correction uses steps() + 1).
// - skip(ctx): the step's gradients are dropped (inf/NaN under a loss scaler); parameters,
//   moments and steps() do not change.
// - state(): every tensor that defines the optimizer's state, named, for save/resume; they may
//   live on the device or the host (Tensor::device()). Loading writes into these same tensors.
// - flush(ctx): work the optimizer still has in flight (a delayed update) lands in the
//   working weights; before a save, an evaluation, or the end of training. No-op by default.
// - host_by_category(): pinned host memory it holds (an offloaded optimizer's slab), by
//   category (FP32 masters and moments are optimizer state, as ZeRO counts them); none by
//   default. host_bytes() is their sum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/adamw.h"
#include "core/layer.h"

namespace memfit {

struct StateTensor {
  std::string name;  // "exp_avg/h.0.attn.qkv.weight", "master/wte", ...
  Tensor tensor;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const char* name() const = 0;  // "adamw", "offload-adamw"

  virtual void grads_ready(LayerContext& ctx, const std::vector<Parameter*>& params) {
    (void)ctx;
    (void)params;
  }
  // Around stage `stage` of Model::backward_stages() in every micro-batch (`micro_batch` of
  // `count`): an optimizer that keeps the gradients off the device lends Parameter::grad its
  // memory before the stage and takes the gradients after it. No-ops by default.
  virtual void before_stage(LayerContext& ctx, int stage, int micro_batch, int count) {
    (void)ctx, (void)stage, (void)micro_batch, (void)count;
  }
  virtual void after_stage(LayerContext& ctx, int stage, int micro_batch, int count) {
    (void)ctx, (void)stage, (void)micro_batch, (void)count;
  }
  // Around every use of weight unit `unit` of Model::weight_units() (`next`: the unit used after
  // it, -1 for none): an optimizer that keeps the working weights off the device lends
  // Parameter::weight a device copy before the use and takes it back after. No-ops by default.
  virtual void before_use(LayerContext& ctx, int unit, int next) {
    (void)ctx, (void)unit, (void)next;
  }
  virtual void after_use(LayerContext& ctx, int unit) { (void)ctx, (void)unit; }
  virtual void step(LayerContext& ctx, double grad_scale) = 0;
  virtual void skip(LayerContext& ctx) = 0;
  virtual void flush(LayerContext& ctx) { (void)ctx; }
  virtual CategoryBytes host_by_category() const { return {}; }
  std::size_t host_bytes() const { return total_bytes(host_by_category()); }

  virtual std::int64_t steps() const = 0;
  virtual void set_steps(std::int64_t steps) = 0;  // resume
  virtual std::vector<StateTensor> state() = 0;
  // Called after state() tensors were overwritten by a load: refresh derived copies (the
  // working weights from the masters).
  virtual void state_loaded(LayerContext& ctx) = 0;

  virtual const AdamWOptions& options() const = 0;
  virtual void set_lr(double lr) = 0;
};

}  // namespace memfit
