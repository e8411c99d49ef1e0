#include "policies/loss_scaler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <string>

#include "memory/error.h"

namespace memfit {
namespace {

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("LossScaler: " + what); }

std::string str(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// A scale is a float (it multiplies the f32 loss gradient): keep it a value a float holds, and
// inside the range where it neither overflows to inf nor underflows to a subnormal.
bool valid_scale(double s) { return std::isfinite(s) && s >= FLT_MIN && s <= FLT_MAX; }

// The product rounded to float, as PyTorch's f32 scale tensor holds it, saturating at the ends.
double next_scale(double scale, double factor) {
  const double s = scale * factor;
  if (s >= FLT_MAX) return FLT_MAX;
  if (s <= FLT_MIN) return FLT_MIN;
  return static_cast<double>(static_cast<float>(s));
}

}  // namespace

LossScaler::LossScaler(LossScalerOptions options) : options_(options) {
  const LossScalerOptions& o = options_;
  if (!valid_scale(o.init_scale)) {
    bad("init_scale = " + str(o.init_scale) + "; valid: finite, > 0 and within float's normal " +
        "range [FLT_MIN, FLT_MAX] = [" + str(FLT_MIN) + ", " + str(FLT_MAX) + "]");
  }
  if (!(std::isfinite(o.growth_factor) && o.growth_factor > 1.0)) {
    bad("growth_factor = " + str(o.growth_factor) + "; valid: finite and > 1 (default 2)");
  }
  if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0)) {
    bad("backoff_factor = " + str(o.backoff_factor) + "; valid: in (0, 1) (default 0.5)");
  }
  if (o.growth_interval < 1) {
    bad("growth_interval = " + std::to_string(o.growth_interval) +
        "; valid: >= 1 clean steps (default 2000)");
  }
  state_.scale = next_scale(o.init_scale, 1.0);
  state_.growth_tracker = 0;
  used_ = scale();
}

double LossScaler::scale() const { return options_.enabled ? state_.scale : 1.0; }

double LossScaler::scale_used() const { return used_; }

bool LossScaler::update(bool found_inf) {
  used_ = scale();
  if (!options_.enabled) return found_inf;
  if (found_inf) {
    state_.scale = next_scale(state_.scale, options_.backoff_factor);
    state_.growth_tracker = 0;
    return true;
  }
  if (++state_.growth_tracker >= options_.growth_interval) {
    state_.scale = next_scale(state_.scale, options_.growth_factor);
    state_.growth_tracker = 0;
  }
  return false;
}

void LossScaler::set_state(const LossScalerState& s) {
  if (!valid_scale(s.scale)) {
    bad("set_state: scale = " + str(s.scale) + "; valid: finite, > 0 and within [FLT_MIN, " +
        "FLT_MAX]");
  }
  if (s.growth_tracker < 0) {
    bad("set_state: growth_tracker = " + std::to_string(s.growth_tracker) + "; valid: >= 0");
  }
  state_ = s;
  used_ = scale();
}

SumSqResult grads_sumsq(LayerContext& ctx, const std::vector<Parameter*>& params) {
  if (ctx.device() == Device::kMeta) return {};  // addresses only: nothing to read
  Backend& be = ctx.backend;
  // One slot pair on the device gathers every gradient's count; one copy, one sync.
  Block slots = ctx.alloc.allocate(kSumSqSlots * sizeof(float), Category::kTemporary, ctx.stream,
                                   "loss_scaler.nonfinite");
  const Tensor dev(slots.data(), Shape{kSumSqSlots}, DType::kF32, ctx.device());
  be.fill(ctx.stream, dev, 0.0f);
  for (const Parameter* p : params) {
    if (p == nullptr || p->grad.view().numel() == 0) continue;
    be.sumsq(ctx.stream, p->grad.view(), dev);
  }
  float host[kSumSqSlots] = {0.0f, 0.0f};
  const Tensor out(host, Shape{kSumSqSlots}, DType::kF32, Device::kCpu);
  be.copy(ctx.stream, dev, out);
  be.synchronize(ctx.stream);
  return read_sumsq(out);
}

}  // namespace memfit
