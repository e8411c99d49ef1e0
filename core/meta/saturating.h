// Saturating int64 arithmetic for the meta backend's counters: a dry run at absurd scale
// reports INT64_MAX instead of wrapping. Private to core/meta/.
#pragma once

#include <cstdint>
#include <limits>

#include "core/tensor.h"

namespace memfit::meta {

inline constexpr std::int64_t kSatMax = std::numeric_limits<std::int64_t>::max();

// Both operands are non-negative counts.
inline std::int64_t sat_add(std::int64_t a, std::int64_t b) {
  return a > kSatMax - b ? kSatMax : a + b;
}
inline std::int64_t sat_mul(std::int64_t a, std::int64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > kSatMax / b ? kSatMax : a * b;
}

inline std::int64_t bytes(const Tensor& t) { return static_cast<std::int64_t>(t.nbytes()); }
template <typename... Ts>
std::int64_t bytes(const Tensor& t, const Ts&... rest) {
  return sat_add(bytes(t), bytes(rest...));
}

}  // namespace memfit::meta
