// Which vector build of the CPU kernels this machine runs (vec_isa.h).
#include "core/cpu/vec_isa.h"

#include <string>

#include "core/cpu/adamw.h"  // detail::cpu_has_avx2_fma_f16c, cpu_has_avx512: CPUID checks
#include "memory/error.h"

namespace memfit::cpu {

// CPUID once per process: in a VM each CPUID traps to the hypervisor (microseconds), and the
// kernels ask per chunk (a 4M-element GELU took 6x longer asking each time).
bool vec_isa_available(VecIsa isa) {
  static const bool avx2 = detail::cpu_has_avx2_fma_f16c();
  static const bool avx512 = detail::cpu_has_avx512();
  switch (isa) {
    case VecIsa::kGeneric:
      return true;
    case VecIsa::kAvx2:
      return avx2;
    case VecIsa::kAvx512:
      return avx512;
  }
  return false;
}

VecIsa vec_isa_best() {
  static const VecIsa best = vec_isa_available(VecIsa::kAvx512) ? VecIsa::kAvx512
                             : vec_isa_available(VecIsa::kAvx2)  ? VecIsa::kAvx2
                                                                 : VecIsa::kGeneric;
  return best;
}

const char* vec_isa_name(VecIsa isa) {
  switch (isa) {
    case VecIsa::kGeneric:
      return "generic";
    case VecIsa::kAvx2:
      return "avx2";
    case VecIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

void need_vec_isa(VecIsa isa, const char* what) {
  if (!vec_isa_available(isa)) {
    throw InvalidArgument(std::string(what) + ": the " + vec_isa_name(isa) +
                          " build cannot run on this CPU; valid: one vec_isa_available() accepts "
                          "(generic always)");
  }
}

}  // namespace memfit::cpu
