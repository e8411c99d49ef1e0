#include "core/device_adamw.h"

#include <cmath>
#include <set>
#include <string>

#include "memory/error.h"
#include "profiler/scoped_range.h"

namespace memfit {

namespace {

void check_lr(double lr) {
  if (!(lr >= 0.0) || !std::isfinite(lr)) {
    throw InvalidArgument("DeviceAdamW: lr = " + std::to_string(lr) +
                          "; valid: a finite value >= 0");
  }
}

std::uint32_t adamw_range_id() {
  static const std::uint32_t id = intern_name("device_adamw");
  return id;
}

}  // namespace

DeviceAdamW::DeviceAdamW(std::vector<Parameter*> params, AdamWOptions options, LayerContext& ctx)
    : params_(std::move(params)), options_(options) {
  (void)adamw_constants(options_, 1, 1.0);  // InvalidArgument naming a bad option, before anything
  std::set<const Parameter*> seen;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter* p = params_[i];
    if (p == nullptr) {
      throw InvalidArgument("DeviceAdamW: parameter " + std::to_string(i) +
                            " is null; valid: the model's parameters");
    }
    if (!seen.insert(p).second) {
      throw InvalidArgument("DeviceAdamW: parameter '" + p->name +
                            "' listed twice; valid: each parameter once (a tied one too)");
    }
    const Tensor& w = p->weight.view();
    if (w.device() != ctx.device() || !(p->master_on_device() || w.dtype() == DType::kF32)) {
      throw InvalidArgument("DeviceAdamW: parameter '" + p->name +
                            "' has no FP32 master on the device (" + device_name(w.device()) +
                            ", " + dtype_name(w.dtype()) +
                            "); valid: parameters as Model allocates them, masters not offloaded");
    }
  }
  // All state now, so step() never allocates (core/optimizer.h). An OutOfMemory here unwinds
  // the moments made so far.
  exp_avg_.reserve(params_.size());
  exp_avg_sq_.reserve(params_.size());
  for (const Parameter* p : params_) {
    exp_avg_.push_back(OwnedTensor::empty(ctx.alloc, p->shape, DType::kF32, ctx.device(),
                                          Category::kOptimizerState, ctx.stream,
                                          "exp_avg/" + p->name));
    exp_avg_sq_.push_back(OwnedTensor::empty(ctx.alloc, p->shape, DType::kF32, ctx.device(),
                                             Category::kOptimizerState, ctx.stream,
                                             "exp_avg_sq/" + p->name));
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    ctx.backend.fill(ctx.stream, exp_avg_[i].view(), 0.0f);
    ctx.backend.fill(ctx.stream, exp_avg_sq_[i].view(), 0.0f);
  }
}

void DeviceAdamW::step(LayerContext& ctx, double grad_scale) {
  const ScopedRange r(RangeKind::kOptimizer, adamw_range_id());
  // Validates options, step and grad_scale before any parameter is touched.
  const AdamWConstants k = adamw_constants(options_, steps_ + 1, grad_scale);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    if (p.master_on_device()) {
      const Tensor weight = p.weight.view();
      ctx.backend.adamw(ctx.stream, k, p.master.view(), p.grad.view(), exp_avg_[i].view(),
                        exp_avg_sq_[i].view(), &weight);
    } else {
      ctx.backend.adamw(ctx.stream, k, p.master_view(), p.grad.view(), exp_avg_[i].view(),
                        exp_avg_sq_[i].view(), nullptr);
    }
  }
  ++steps_;
}

void DeviceAdamW::skip(LayerContext& ctx) {
  (void)ctx;  // the gradients are simply not applied; the trainer zeroes them next step
}

void DeviceAdamW::set_steps(std::int64_t steps) {
  if (steps < 0) {
    throw InvalidArgument("DeviceAdamW::set_steps(" + std::to_string(steps) + "): valid: >= 0");
  }
  steps_ = steps;
}

std::vector<StateTensor> DeviceAdamW::state() {
  std::vector<StateTensor> out;
  out.reserve(3 * params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = *params_[i];
    if (p.master_on_device()) {
      out.push_back({"master/" + p.name, p.master.view()});
    } else {
      out.push_back({"weight/" + p.name, p.weight.view()});
    }
    out.push_back({"exp_avg/" + p.name, exp_avg_[i].view()});
    out.push_back({"exp_avg_sq/" + p.name, exp_avg_sq_[i].view()});
  }
  return out;
}

void DeviceAdamW::state_loaded(LayerContext& ctx) {
  for (Parameter* p : params_) {
    if (p->master_on_device()) ctx.backend.cast(ctx.stream, p->master.view(), p->weight.view());
  }
}

void DeviceAdamW::set_lr(double lr) {
  check_lr(lr);
  options_.lr = lr;
}

}  // namespace memfit
