// vec_kernels.h for the build's baseline ISA (the fallback); vec_kernels.cpp calls it when
// neither vector build applies.
#define MEMFIT_VEC_NS vec_generic
#include "core/cpu/vec_kernels.h"
