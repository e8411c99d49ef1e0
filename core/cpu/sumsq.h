// The CPU backend's sumsq reduction, shared with code that must reproduce its bits on host
// memory (gradient offload's norm for clipping and the inf/NaN check,
// policies/offload_optimizer.h): a tensor is cut into blocks of kSumSqBlock elements; each block's
// finite elements' squares are summed in double, in order (sumsq_block); the blocks' sums are then
// added in block order and the tensor's total added into an f32 slot. The same bits whatever the
// thread count.
#pragma once

#include <cmath>
#include <cstdint>

namespace memfit {

inline constexpr std::int64_t kSumSqBlock = 64 * 1024;

// Adds the squares of v[0..n)'s finite elements to `sum` (in order) and counts the others.
inline void sumsq_block(const float* v, std::int64_t n, double& sum, std::int64_t& nonfinite) {
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::isfinite(v[i])) {
      const double d = v[i];
      sum += d * d;
    } else {
      ++nonfinite;
    }
  }
}

}  // namespace memfit
