// vec_kernels.h for AVX-512 F/BW/VL/DQ + FMA + F16C (that header's `#pragma GCC target` enables
// the ISA, not file-wide -m flags); vec_kernels.cpp calls it only when the CPU has it.
#if defined(__x86_64__) || defined(__i386__)
#define MEMFIT_VEC_NS vec_avx512
#define MEMFIT_VEC_ISA_AVX512
#include "core/cpu/vec_kernels.h"
#endif  // x86
