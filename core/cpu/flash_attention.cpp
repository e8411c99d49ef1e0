// Picks the vector build of the tiled attention (flash_attention_generic.cpp,
// flash_attention_{avx2,avx512}_target.cpp)
// and runs CpuBackend's flash_attention ops with it.
#include "core/cpu/flash_attention.h"

#include "core/cpu/cpu_backend.h"

namespace memfit::cpu {

#define MEMFIT_FLASH_DECLARE(ns)                                                                   \
  namespace ns {                                                                                   \
  void flash_forward(const Tensor& qkv, const AttentionDims& d, const Tensor& out,                 \
                     const Tensor& lse);                                                           \
  void flash_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, \
                      const AttentionDims& d, const Tensor& delta, const Tensor& dqkv);            \
  }
MEMFIT_FLASH_DECLARE(flash_generic)
#if defined(__x86_64__) || defined(__i386__)
MEMFIT_FLASH_DECLARE(flash_avx2)
MEMFIT_FLASH_DECLARE(flash_avx512)
#endif
#undef MEMFIT_FLASH_DECLARE

void flash_forward(VecIsa isa, const Tensor& qkv, const AttentionDims& d, const Tensor& out,
                   const Tensor& lse) {
  need_vec_isa(isa, "cpu flash attention");
#if defined(__x86_64__) || defined(__i386__)
  if (isa == VecIsa::kAvx512) return flash_avx512::flash_forward(qkv, d, out, lse);
  if (isa == VecIsa::kAvx2) return flash_avx2::flash_forward(qkv, d, out, lse);
#endif
  flash_generic::flash_forward(qkv, d, out, lse);
}

void flash_backward(VecIsa isa, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                    const Tensor& lse, const AttentionDims& d, const Tensor& delta,
                    const Tensor& dqkv) {
  need_vec_isa(isa, "cpu flash attention");
#if defined(__x86_64__) || defined(__i386__)
  if (isa == VecIsa::kAvx512) {
    return flash_avx512::flash_backward(dout, qkv, out, lse, d, delta, dqkv);
  }
  if (isa == VecIsa::kAvx2)
    return flash_avx2::flash_backward(dout, qkv, out, lse, d, delta, dqkv);
#endif
  flash_generic::flash_backward(dout, qkv, out, lse, d, delta, dqkv);
}

}  // namespace memfit::cpu

namespace memfit {

void CpuBackend::run_flash_attention_forward(const Tensor& qkv, const AttentionDims& d,
                                             const Tensor& out, const Tensor& lse) {
  cpu::flash_forward(cpu::vec_isa_best(), qkv, d, out, lse);
}

void CpuBackend::run_flash_attention_backward(const Tensor& dout, const Tensor& qkv,
                                              const Tensor& out, const Tensor& lse,
                                              const AttentionDims& d, const Tensor& delta,
                                              const Tensor& dqkv) {
  cpu::flash_backward(cpu::vec_isa_best(), dout, qkv, out, lse, d, delta, dqkv);
}

}  // namespace memfit
