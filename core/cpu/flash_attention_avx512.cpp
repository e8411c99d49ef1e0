// The tiled causal attention of flash_attention_kernel.h for AVX-512 F/BW/VL/DQ + FMA (compiled
// with those flags); flash_attention.cpp calls it only when the CPU has it.
#if defined(__x86_64__) || defined(__i386__)
#define MEMFIT_FLASH_NS flash_avx512
#include "core/cpu/flash_attention_kernel.h"
#endif  // x86
