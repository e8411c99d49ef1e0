// Row helpers for the CPU backend's neural-network ops (nn_ops.cpp, attention_ops.cpp):
// widen a run of elements of any dtype to f32 and round f32 back, both with memfit::convert
// (exact widening, nearest-even rounding). Internal to libmemfit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"

namespace memfit::cpu {

// Below this many elements of work an OpenMP team costs more than it saves (as cpu_backend.cpp).
inline constexpr std::int64_t kNnParallelMin = 64 * 1024;
// Column block of the column-parallel reductions (bias, layernorm and embedding gradients):
// every output element is summed by one thread in row order, so results do not depend on the
// thread count.
inline constexpr std::int64_t kColBlock = 256;

inline char* element(const Tensor& t, std::int64_t off) {
  return static_cast<char*>(t.raw()) + static_cast<std::size_t>(off) * dtype_size(t.dtype());
}

// dst[0, n) = t[off, off + n) as f32.
inline void widen(const Tensor& t, std::int64_t off, std::int64_t n, float* dst) {
  convert(element(t, off), t.dtype(), dst, DType::kF32, static_cast<std::size_t>(n));
}

// t[off, off + n) = src[0, n) rounded to t's dtype.
inline void narrow(const float* src, const Tensor& t, std::int64_t off, std::int64_t n) {
  convert(src, DType::kF32, element(t, off), t.dtype(), static_cast<std::size_t>(n));
}

inline float* f32(const Tensor& t) { return static_cast<float*>(t.raw()); }

// Rows before the last dimension.
inline std::int64_t rows_of(const Tensor& t) {
  const std::int64_t c = t.size(t.ndim() - 1);
  return c == 0 ? 0 : t.numel() / c;
}

}  // namespace memfit::cpu
