// The CPU backend's tiled causal attention (Backend::flash_attention_forward/backward, the
// FlashAttention-2 algorithm; see flash_attention_kernel.h for how it works), in the vector
// builds this machine can run. CpuBackend calls the best one; tests call each one to compare.
//
//   cpu::flash_forward(cpu::vec_isa_best(), qkv, dims, out, lse);
//
// Arguments are what Backend's checks passed (core/backend.h's contract), on host memory.
#pragma once

#include "core/backend.h"
#include "core/cpu/vec_isa.h"

namespace memfit::cpu {

// InvalidArgument when `isa` is not available here.
void flash_forward(VecIsa isa, const Tensor& qkv, const AttentionDims& d, const Tensor& out,
                   const Tensor& lse);
void flash_backward(VecIsa isa, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                    const Tensor& lse, const AttentionDims& d, const Tensor& delta,
                    const Tensor& dqkv);

}  // namespace memfit::cpu
