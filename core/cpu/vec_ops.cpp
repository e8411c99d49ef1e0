// Picks the vector build of vec_kernels.h (vec_kernels_generic.cpp,
// vec_kernels_{avx2,avx512}_target.cpp) for each op of vec_ops.h.
#include "core/cpu/vec_ops.h"

namespace memfit::cpu {

#define MEMFIT_VEC_DECLARE(ns)                                                         \
  namespace ns {                                                                       \
  void gelu_forward(const float* x, float* y, std::int64_t n);                         \
  void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t n);      \
  }
MEMFIT_VEC_DECLARE(vec_generic)
#if defined(__x86_64__) || defined(__i386__)
MEMFIT_VEC_DECLARE(vec_avx2)
MEMFIT_VEC_DECLARE(vec_avx512)
#endif
#undef MEMFIT_VEC_DECLARE

void gelu_forward(VecIsa isa, const float* x, float* y, std::int64_t n) {
  need_vec_isa(isa, "cpu gelu_forward");
#if defined(__x86_64__) || defined(__i386__)
  if (isa == VecIsa::kAvx512) return vec_avx512::gelu_forward(x, y, n);
  if (isa == VecIsa::kAvx2) return vec_avx2::gelu_forward(x, y, n);
#endif
  vec_generic::gelu_forward(x, y, n);
}

void gelu_backward(VecIsa isa, const float* x, const float* dy, float* dx, std::int64_t n) {
  need_vec_isa(isa, "cpu gelu_backward");
#if defined(__x86_64__) || defined(__i386__)
  if (isa == VecIsa::kAvx512) return vec_avx512::gelu_backward(x, dy, dx, n);
  if (isa == VecIsa::kAvx2) return vec_avx2::gelu_backward(x, dy, dx, n);
#endif
  vec_generic::gelu_backward(x, dy, dx, n);
}

}  // namespace memfit::cpu
