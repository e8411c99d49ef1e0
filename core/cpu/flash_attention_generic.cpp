// The tiled causal attention of flash_attention_kernel.h for the build's baseline ISA (the
// fallback); flash_attention.cpp calls it when neither vector build applies.
#define MEMFIT_FLASH_NS flash_generic
#include "core/cpu/flash_attention_kernel.h"
