// Gradient accumulation: splitting a global batch into micro-batches.
//
//   std::vector<std::int64_t> mb = split_batch(/*global=*/10, /*accum=*/4);   // {3, 3, 3, 1}
//   float dloss = scale / float(global * seq_len);   // the same for every micro-batch
//
// split_batch(B, K): K micro-batches of ceil(B / K) samples, the last one taking what is left
// (at least 1). InvalidArgument when B < 1, K < 1, K > B, or when the even split leaves fewer
// than K non-empty micro-batches (B = 5, K = 4: ceil = 2 gives 2, 2, 1: three), naming the
// batch sizes that would split into K. Because every micro-batch's loss gradient is
// scale / (B * T) (LmHead: dloss), an uneven last micro-batch is weighted by its rows and the
// accumulated gradient equals the full batch's up to FP32 summation order.
// micro_batch_split(B, micro): ceil(B / micro) micro-batches of `micro`, the last what is left.
// Either way at most kMaxMicroBatches (InvalidArgument beyond, naming the limit).
// split_shape / micro_batch_shape: the same splits (and errors) as {size, count, last} in O(1)
// time and memory, for callers that must not hold a vector as long as the batch is large (a
// planner asked for a global batch of 10^12 samples).
#pragma once

#include <cstdint>
#include <vector>

namespace memfit {

inline constexpr std::int64_t kMaxMicroBatches = std::int64_t{1} << 31;

struct Split {
  std::int64_t size = 0;   // samples in every micro-batch but the last
  std::int64_t count = 0;  // micro-batches
  std::int64_t last = 0;   // samples in the last (1 <= last <= size)
  bool operator==(const Split&) const = default;
};

std::vector<std::int64_t> split_batch(std::int64_t batch, std::int64_t accum);
std::vector<std::int64_t> micro_batch_split(std::int64_t batch, std::int64_t micro);
Split split_shape(std::int64_t batch, std::int64_t accum);
Split micro_batch_shape(std::int64_t batch, std::int64_t micro);
std::vector<std::int64_t> sizes_of(const Split& s);  // {size, ..., size, last}

}  // namespace memfit
