// The tiled causal attention of flash_attention_kernel.h for AVX2 + FMA + F16C: that header's
// `#pragma GCC target` below its includes enables the ISA (not file-wide -m flags: see there).
// flash_attention.cpp calls it only when the CPU has it.
#if defined(__x86_64__) || defined(__i386__)
#define MEMFIT_FLASH_NS flash_avx2
#define MEMFIT_FLASH_ISA_AVX2  // flash_attention_kernel.h's #pragma GCC target
#include "core/cpu/flash_attention_kernel.h"
#endif  // x86
