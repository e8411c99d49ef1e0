// AdamW's arithmetic, specified bit for bit, and its per-step constants: shared by every
// implementation (the host kernels in core/cpu/adamw.h used by the CPU backend and the CPU
// offload path, Backend::adamw, and a CUDA kernel), so offloaded and on-device AdamW agree.
//
//   AdamWOptions opt;                                   // torch.optim.AdamW's defaults
//   opt.lr = 3e-4;
//   AdamWConstants k = adamw_constants(opt, step, 1.0 / (loss_scale * accum_steps));
//   AdamWBuffers b;
//   b.n = n;                                            // elements
//   b.param = master; b.exp_avg = m; b.exp_avg_sq = v;  // f32 (n,), updated in place
//   b.grad = grad_host; b.grad_dtype = DType::kBF16;    // (n,) f32, f16 or bf16
//   b.param_out = weights_bf16; b.out_dtype = DType::kBF16;  // optional copy-out
//   adamw_step(k, b);                                   // OpenMP over all cores
//
// The step is torch.optim.AdamW(lr, betas=(beta1, beta2), eps, weight_decay) with
// maximize=False, amsgrad=False, bias correction on: decoupled weight decay
// p <- p(1 - lr wd) - lr/(1 - beta1^t) * m / (sqrt(v)/sqrt(1 - beta2^t) + eps).
//
// 1. Host, once per step (adamw_constants), in double, each result rounded to float once:
//      grad_scale      = fl(grad_scale)                 e.g. 1/(loss_scale * accumulation steps)
//      beta1, beta2    = fl(beta1), fl(beta2)
//      one_minus_beta1 = fl(1 - beta1)                  1 - beta1 in double
//      one_minus_beta2 = fl(1 - beta2)
//      inv_bc2_sqrt    = fl(1 / sqrt(1 - pow(beta2, t)))
//      eps             = fl(eps)
//      neg_step_size   = fl(-lr / (1 - pow(beta1, t)))
//      decay           = fl(1 - lr * weight_decay)
// 2. Per element i, in binary32, every operation rounded to nearest even (fma: one rounding),
//    exactly this sequence (no other contraction, reassociation or approximation):
//      g  = widen(grad[i])                       exact (f16/bf16 -> f32)
//      g  = g * grad_scale
//      m  = fma(beta1, m[i], one_minus_beta1 * g)
//      v  = fma(beta2, v[i], (one_minus_beta2 * g) * g)
//      d  = fma(sqrt(v), inv_bc2_sqrt, eps)      sqrt correctly rounded
//      u  = m / d                                division correctly rounded
//      p  = fma(neg_step_size, u, p[i] * decay)
//      m[i] = m; v[i] = v; p[i] = p; param_out[i] = round(p) to out_dtype (memfit::convert's
//      rounding: nearest even, NaN rule of core/dtype.h)
//    Subnormals are kept (no flush to zero): the host paths run with MXCSR at its default
//    (round to nearest, no FTZ/DAZ) whatever the caller set, and restore it afterwards.
//    A CUDA kernel matches with __fmul_rn/__fmaf_rn/__fsqrt_rn/__fdiv_rn (or nvcc
//    -fmad=false -prec-div=true -prec-sqrt=true -ftz=false) and the same AdamWConstants.
//    NaN results are NaN on every path, but their payload bits are not specified (x86 and
//    CUDA propagate different NaNs); every non-NaN result is bit-identical.
//
#pragma once

#include <cstdint>

namespace memfit {

struct AdamWOptions {
  double lr = 1e-3;            // >= 0, finite
  double beta1 = 0.9;          // [0, 1)
  double beta2 = 0.999;        // [0, 1)
  double eps = 1e-8;           // > 0, and fl(eps) > 0
  double weight_decay = 0.01;  // >= 0, finite
};

// The per-step FP32 factors of the formula above; plain data, so a device kernel can take it
// by value. Build it with adamw_constants(); adamw_step() checks hand-made ones.
struct AdamWConstants {
  float grad_scale;
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float inv_bc2_sqrt;
  float eps;
  float neg_step_size;
  float decay;
};

// Validates opt, step (>= 1, the 1-based count of steps taken including this one) and
// grad_scale (finite, > 0) and computes the factors as specified in step 1 above.
AdamWConstants adamw_constants(const AdamWOptions& opt, std::int64_t step, double grad_scale = 1.0);

// Throws InvalidArgument naming the field when k lies outside what adamw_constants() can
// produce (a hand-made struct): the one definition of valid constants for every backend.
void validate_adamw_constants(const AdamWConstants& k);

}  // namespace memfit
