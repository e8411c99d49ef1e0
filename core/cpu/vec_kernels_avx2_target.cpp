// vec_kernels.h for AVX2 + FMA + F16C (that header's `#pragma GCC target` enables the ISA, not
// file-wide -m flags); vec_kernels.cpp calls it only when the CPU has it.
#if defined(__x86_64__) || defined(__i386__)
#define MEMFIT_VEC_NS vec_avx2
#define MEMFIT_VEC_ISA_AVX2
#include "core/cpu/vec_kernels.h"
#endif  // x86
