// AdamW on the host: the step specified in core/adamw.h over FP32 master weights, with
// AVX-512 / AVX2+FMA+F16C / scalar code chosen at run time and OpenMP over tiles. Used by the
// CPU backend's adamw op and by the CPU offload path.
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
// Buffers: param, exp_avg, exp_avg_sq are n floats each (4-byte aligned), grad n elements of
// grad_dtype and param_out n elements of out_dtype (aligned to their element size); no two may
// overlap. Bad options, constants or buffers throw InvalidArgument naming the field and what
// is valid; nothing is written then. Elements are independent, so the result does not depend
// on the thread count or on where the tiles fall. Thread-safe for disjoint buffers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/adamw.h"
#include "core/dtype.h"

namespace memfit {

struct AdamWBuffers {
  std::size_t n = 0;
  float* param = nullptr;       // FP32 master weights, in/out
  float* exp_avg = nullptr;     // first moment m, in/out
  float* exp_avg_sq = nullptr;  // second moment v, in/out
  const void* grad = nullptr;   // in, grad_dtype
  DType grad_dtype = DType::kF32;
  void* param_out = nullptr;  // optional out: the updated weights in out_dtype; null for none
  DType out_dtype = DType::kBF16;
};

// One step over b.n elements. threads: 0 uses OpenMP's default (all cores), 1 runs on the
// calling thread; the result is the same either way. Small n runs on the calling thread.
void adamw_step(const AdamWConstants& k, const AdamWBuffers& b, int threads = 0);

// The kernel adamw_step() dispatches to on this CPU: "avx512", "avx2+fma+f16c" or "scalar".
const char* adamw_isa();

// Bytes one step moves per element when nothing is read back for ownership: 24 for
// param/m/v read and written, plus the gradient read and the copy-out written.
inline constexpr std::size_t adamw_bytes_per_element(DType grad, bool copy_out, DType out) {
  return 24 + dtype_size(grad) + (copy_out ? dtype_size(out) : 0);
}

namespace detail {

// Elements are processed in tiles of this many (a multiple of 64, so every tile starts on a
// cache line when the buffers do); OpenMP hands out tiles with a static schedule.
inline constexpr std::size_t kAdamWTile = 8192;

// A kernel updates elements [begin, end) of b with k; it assumes validated arguments and the
// default MXCSR (adamw_run sets it).
using AdamWKernel = void (*)(const AdamWConstants& k, const AdamWBuffers& b, std::size_t begin,
                             std::size_t end);

// The reference: std::fma exactly where the specification has fma.
void adamw_scalar(const AdamWConstants& k, const AdamWBuffers& b, std::size_t begin,
                  std::size_t end);
bool cpu_has_avx2_fma_f16c();
bool cpu_has_avx512();  // AVX-512 F, BW, VL, DQ with OS support for the ZMM state
// Defined only on x86 builds; call only when the matching cpu_has_*() is true.
void adamw_avx2(const AdamWConstants& k, const AdamWBuffers& b, std::size_t begin, std::size_t end);
void adamw_avx512(const AdamWConstants& k, const AdamWBuffers& b, std::size_t begin,
                  std::size_t end);

AdamWKernel adamw_dispatched();
// adamw_step() with a chosen kernel: validation, tiles, OpenMP, MXCSR. For tests and benches.
void adamw_run(AdamWKernel kernel, const AdamWConstants& k, const AdamWBuffers& b, int threads = 0);

}  // namespace detail

}  // namespace memfit
