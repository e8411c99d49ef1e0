// Picks the vector build of the tiled attention (flash_attention_generic.cpp,
// flash_attention_{avx2,avx512}_target.cpp)
// and runs CpuBackend's flash_attention ops with it.
#include "core/cpu/flash_attention.h"

#include <string>

#include "core/cpu/adamw.h"  // detail::cpu_has_avx2_fma_f16c, cpu_has_avx512: CPUID checks
#include "core/cpu/cpu_backend.h"
#include "memory/error.h"

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

bool flash_isa_available(FlashIsa isa) {
  switch (isa) {
    case FlashIsa::kGeneric:
      return true;
    case FlashIsa::kAvx2:
      return detail::cpu_has_avx2_fma_f16c();
    case FlashIsa::kAvx512:
      return detail::cpu_has_avx512();
  }
  return false;
}

FlashIsa flash_isa_best() {
  static const FlashIsa best = flash_isa_available(FlashIsa::kAvx512) ? FlashIsa::kAvx512
                               : flash_isa_available(FlashIsa::kAvx2) ? FlashIsa::kAvx2
                                                                      : FlashIsa::kGeneric;
  return best;
}

const char* flash_isa_name(FlashIsa isa) {
  switch (isa) {
    case FlashIsa::kGeneric:
      return "generic";
    case FlashIsa::kAvx2:
      return "avx2";
    case FlashIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

namespace {

void need_available(FlashIsa isa) {
  if (!flash_isa_available(isa)) {
    throw InvalidArgument(std::string("cpu flash attention: the ") + flash_isa_name(isa) +
                          " build cannot run on this CPU; valid: one flash_isa_available() "
                          "accepts (generic always)");
  }
}

}  // namespace

void flash_forward(FlashIsa isa, const Tensor& qkv, const AttentionDims& d, const Tensor& out,
                   const Tensor& lse) {
  need_available(isa);
#if defined(__x86_64__) || defined(__i386__)
  if (isa == FlashIsa::kAvx512) return flash_avx512::flash_forward(qkv, d, out, lse);
  if (isa == FlashIsa::kAvx2) return flash_avx2::flash_forward(qkv, d, out, lse);
#endif
  flash_generic::flash_forward(qkv, d, out, lse);
}

void flash_backward(FlashIsa isa, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                    const Tensor& lse, const AttentionDims& d, const Tensor& delta,
                    const Tensor& dqkv) {
  need_available(isa);
#if defined(__x86_64__) || defined(__i386__)
  if (isa == FlashIsa::kAvx512) {
    return flash_avx512::flash_backward(dout, qkv, out, lse, d, delta, dqkv);
  }
  if (isa == FlashIsa::kAvx2)
    return flash_avx2::flash_backward(dout, qkv, out, lse, d, delta, dqkv);
#endif
  flash_generic::flash_backward(dout, qkv, out, lse, d, delta, dqkv);
}

}  // namespace memfit::cpu

namespace memfit {

void CpuBackend::run_flash_attention_forward(const Tensor& qkv, const AttentionDims& d,
                                             const Tensor& out, const Tensor& lse) {
  cpu::flash_forward(cpu::flash_isa_best(), qkv, d, out, lse);
}

void CpuBackend::run_flash_attention_backward(const Tensor& dout, const Tensor& qkv,
                                              const Tensor& out, const Tensor& lse,
                                              const AttentionDims& d, const Tensor& delta,
                                              const Tensor& dqkv) {
  cpu::flash_backward(cpu::flash_isa_best(), dout, qkv, out, lse, d, delta, dqkv);
}

}  // namespace memfit
