// Elementwise f32 kernels of the CPU backend in vector form, written once and compiled three
// times like flash_attention_kernel.h: vec_kernels_generic.cpp (the build's baseline ISA),
// vec_kernels_avx2_target.cpp and vec_kernels_avx512_target.cpp, each including this file
// inside its own namespace (MEMFIT_VEC_NS) with the ISA enabled by `#pragma GCC target` below
// the includes. vec_kernels.cpp declares each build's entry points and picks one (vec_isa.h).
//
// GELU, GPT-2's tanh form, gelu(x) = 0.5 x (1 + tanh u), u = s (x + a x^3), evaluated as
// x * sigma with sigma = (1 + tanh u) / 2 = 1 / (1 + exp(-2u)): one exp per element, no
// cancellation near 0. Its derivative, with 1 - tanh^2 u = 4 sigma (1 - sigma):
//   d gelu / dx = sigma + 2 x sigma (1 - sigma) s (1 + 3 a x^2),
// 1 - sigma taken as exp(-2u) sigma where sigma > 1/2 (no cancellation) and as 1 - sigma
// elsewhere (no inf * 0). Relative error a few ulp of f32 (vexp's ~2 ulp, then a division).
// Internal to libmemfit: CpuBackend's gelu ops call these on f32 runs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

// 64-byte vectors in a build without AVX-512 change the ABI of functions passing them by value
// (-Wpsabi); every such function here is internal to its translation unit.
#pragma GCC diagnostic ignored "-Wpsabi"

#if defined(MEMFIT_VEC_ISA_AVX512) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#elif defined(MEMFIT_VEC_ISA_AVX2) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace memfit::cpu::MEMFIT_VEC_NS {
namespace {

using i64 = std::int64_t;

#include "core/cpu/vmath.h"

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

// sigma = 1 / (1 + exp(-2u)) and e = exp(-2u); sigma = 0 exactly where -2u > 88 (x below
// about -9.4, where x sigma < 2e-37), which vexp's clamp would leave at ~4e-39 instead.
[[gnu::always_inline]] inline v16 gelu_sigma(v16 x, v16* e) {
  const v16 m = -2.0f * kGeluS * (x + kGeluA * x * x * x);
  *e = vexp(m);
  return m > 88.0f ? v16{} : 1.0f / (1.0f + *e);
}

[[gnu::always_inline]] inline v16 gelu_v(v16 x) {
  v16 e;
  return x * gelu_sigma(x, &e);
}

// Where sigma is exactly 0 or 1 the derivative is sigma: the second term's sigma (1 - sigma)
// is 0 there, and skipping it avoids 0 * inf once x^2 overflows.
[[gnu::always_inline]] inline v16 gelu_grad_v(v16 x) {
  v16 e;
  const v16 sg = gelu_sigma(x, &e);
  const v16 one_minus = sg > 0.5f ? e * sg : 1.0f - sg;
  const v16 full = sg + 2.0f * x * sg * one_minus * kGeluS * (1.0f + 3.0f * kGeluA * x * x);
  return ((sg == 0.0f) | (one_minus == 0.0f)) ? sg : full;
}

// f over [0, n) in whole vectors, the tail through a zero-padded vector.
template <typename F>
inline void each_vector(i64 n, F&& f) {
  i64 i = 0;
  for (; i + kLanes <= n; i += kLanes) f(i, kLanes);
  if (i < n) f(i, n - i);
}

[[gnu::always_inline]] inline v16 load_n(const float* p, i64 n) {
  if (n == kLanes) return load(p);
  v16 v{};
  std::memcpy(&v, p, static_cast<std::size_t>(n) * sizeof(float));
  return v;
}

[[gnu::always_inline]] inline void store_n(float* p, v16 v, i64 n) {
  if (n == kLanes) return store(p, v);
  std::memcpy(p, &v, static_cast<std::size_t>(n) * sizeof(float));
}

}  // namespace

// y[i] = gelu(x[i]); y may be x.
void gelu_forward(const float* x, float* y, i64 n) {
  each_vector(n, [&](i64 i, i64 k) { store_n(y + i, gelu_v(load_n(x + i, k)), k); });
}

// dx[i] = dy[i] * gelu'(x[i]); dx may be dy or x.
void gelu_backward(const float* x, const float* dy, float* dx, i64 n) {
  each_vector(n, [&](i64 i, i64 k) {
    store_n(dx + i, load_n(dy + i, k) * gelu_grad_v(load_n(x + i, k)), k);
  });
}

}  // namespace memfit::cpu::MEMFIT_VEC_NS

#if (defined(MEMFIT_VEC_ISA_AVX512) || defined(MEMFIT_VEC_ISA_AVX2)) && !defined(__clang__)
#pragma GCC pop_options
#endif
