// AdamW's per-step constants and their validation (core/adamw.h).
#include "core/adamw.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "memory/error.h"

namespace memfit {

namespace {

std::string num(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("adamw: " + what); }

void check_range(const char* name, double x, bool ok, const char* valid) {
  if (!ok) bad(std::string(name) + " = " + num(x) + "; valid: " + valid);
}

bool finite(double x) { return std::isfinite(x); }

}  // namespace

void validate_adamw_constants(const AdamWConstants& k) {
  // The fields adamw_constants() can produce; a hand-made struct outside them is a bug.
  check_range("constants.grad_scale", k.grad_scale, finite(k.grad_scale) && k.grad_scale > 0,
              "finite, > 0");
  check_range("constants.beta1", k.beta1, k.beta1 >= 0 && k.beta1 < 1, "[0, 1)");
  check_range("constants.beta2", k.beta2, k.beta2 >= 0 && k.beta2 < 1, "[0, 1)");
  check_range("constants.one_minus_beta1", k.one_minus_beta1,
              k.one_minus_beta1 > 0 && k.one_minus_beta1 <= 1, "(0, 1]");
  check_range("constants.one_minus_beta2", k.one_minus_beta2,
              k.one_minus_beta2 > 0 && k.one_minus_beta2 <= 1, "(0, 1]");
  check_range("constants.inv_bc2_sqrt", k.inv_bc2_sqrt,
              finite(k.inv_bc2_sqrt) && k.inv_bc2_sqrt >= 1, "finite, >= 1");
  check_range("constants.eps", k.eps, finite(k.eps) && k.eps > 0, "finite, > 0");
  check_range("constants.neg_step_size", k.neg_step_size,
              finite(k.neg_step_size) && k.neg_step_size <= 0, "finite, <= 0");
  check_range("constants.decay", k.decay, finite(k.decay) && k.decay <= 1, "finite, <= 1");
}

AdamWConstants adamw_constants(const AdamWOptions& o, std::int64_t step, double grad_scale) {
  check_range("lr", o.lr, finite(o.lr) && o.lr >= 0, "finite, >= 0");
  check_range("beta1", o.beta1, o.beta1 >= 0 && o.beta1 < 1, "[0, 1)");
  check_range("beta2", o.beta2, o.beta2 >= 0 && o.beta2 < 1, "[0, 1)");
  check_range("eps", o.eps, finite(o.eps) && static_cast<float>(o.eps) > 0,
              "finite, > 0 and not below the smallest float (1.4e-45)");
  check_range("weight_decay", o.weight_decay, finite(o.weight_decay) && o.weight_decay >= 0,
              "finite, >= 0");
  if (step < 1) bad("step = " + std::to_string(step) + "; valid: >= 1 (1 for the first step)");
  check_range("grad_scale", grad_scale,
              finite(grad_scale) && static_cast<float>(grad_scale) > 0 &&
                  std::isfinite(static_cast<float>(grad_scale)),
              "finite and > 0 as a float, e.g. 1 / (loss_scale * accumulation_steps)");
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(o.beta1, t);
  const double bc2 = 1.0 - std::pow(o.beta2, t);
  AdamWConstants k;
  k.grad_scale = static_cast<float>(grad_scale);
  k.beta1 = static_cast<float>(o.beta1);
  k.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  k.beta2 = static_cast<float>(o.beta2);
  k.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  k.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  k.eps = static_cast<float>(o.eps);
  k.neg_step_size = static_cast<float>(-o.lr / bc1);
  k.decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
  // beta close to 1 can round to 1.0f (beta > 1 - 2^-25); that would freeze the moments.
  validate_adamw_constants(k);
  return k;
}

}  // namespace memfit
