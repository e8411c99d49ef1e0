// The vector builds of the CPU backend's hand-written kernels: each kernel header
// (flash_attention_kernel.h, vec_kernels.h) is compiled once per ISA below, and the caller picks
// one at run time by CPUID. CpuBackend runs the best; tests run each one to compare them.
//
//   if (cpu::vec_isa_available(cpu::VecIsa::kAvx2)) ...;   // what this CPU can run
//   cpu::VecIsa isa = cpu::vec_isa_best();                 // AVX-512, else AVX2, else generic
#pragma once

namespace memfit::cpu {

enum class VecIsa { kGeneric, kAvx2, kAvx512 };

bool vec_isa_available(VecIsa isa);   // kGeneric always; the others per CPUID and OS support
VecIsa vec_isa_best();                // computed once
const char* vec_isa_name(VecIsa isa);  // "generic", "avx2", "avx512"
// InvalidArgument naming `what` when `isa` cannot run here.
void need_vec_isa(VecIsa isa, const char* what);

}  // namespace memfit::cpu
