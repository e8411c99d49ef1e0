// The CPU backend's vectorized elementwise f32 kernels (vec_kernels.h explains the math), in
// the vector builds this machine can run. CpuBackend calls them with vec_isa_best() on f32 runs
// (16-bit tensors widened a chunk at a time); tests call each build to compare.
//
//   cpu::gelu_forward(cpu::vec_isa_best(), x, y, n);
//
// InvalidArgument when `isa` is not available here (vec_isa.h).
#pragma once

#include <cstdint>

#include "core/cpu/vec_isa.h"

namespace memfit::cpu {

// y[i] = gelu(x[i]) (GPT-2's tanh form); y may be x.
void gelu_forward(VecIsa isa, const float* x, float* y, std::int64_t n);
// dx[i] = dy[i] * gelu'(x[i]); dx may be dy or x.
void gelu_backward(VecIsa isa, const float* x, const float* dy, float* dx, std::int64_t n);

}  // namespace memfit::cpu
