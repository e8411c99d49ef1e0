#include "policies/accumulation.h"

#include <cstddef>
#include <string>

#include "memory/error.h"

namespace memfit {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// K micro-batches of ceil(B / K), the last holding what is left: it must hold at least one.
bool splits(std::int64_t batch, std::int64_t accum) {
  const std::int64_t m = ceil_div(batch, accum);
  return accum - 1 <= (batch - 1) / m;  // (K-1)*m <= B-1, without the product
}

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument(what); }

}  // namespace

Split split_shape(std::int64_t batch, std::int64_t accum) {
  const std::string call =
      "split_batch(batch = " + std::to_string(batch) + ", accum = " + std::to_string(accum) + ")";
  if (batch < 1) bad(call + ": batch must be >= 1");
  if (accum < 1) bad(call + ": accum must be >= 1");
  if (accum > batch) {
    bad(call + ": more micro-batches than samples; valid: accum in [1, " + std::to_string(batch) +
        "], or a batch of at least " + std::to_string(accum));
  }
  if (accum > kMaxMicroBatches) {
    bad(call + ": at most " + std::to_string(kMaxMicroBatches) + " micro-batches");
  }
  if (!splits(batch, accum)) {
    // Multiples of accum always split, so each search ends within accum steps.
    std::int64_t below = batch - 1;
    while (below > accum && !splits(below, accum)) --below;
    std::int64_t above = batch + 1;
    while (!splits(above, accum)) ++above;
    bad(call + ": micro-batches of ceil(" + std::to_string(batch) + " / " + std::to_string(accum) +
        ") = " + std::to_string(ceil_div(batch, accum)) + " samples leave fewer than " +
        std::to_string(accum) + " non-empty ones; valid: a batch that splits into " +
        std::to_string(accum) + " (e.g. " + std::to_string(below) + " or " + std::to_string(above) +
        "), or another accumulation count");
  }
  const std::int64_t m = ceil_div(batch, accum);
  return {m, accum, batch - (accum - 1) * m};
}

Split micro_batch_shape(std::int64_t batch, std::int64_t micro) {
  const std::string call = "micro_batch_split(batch = " + std::to_string(batch) +
                           ", micro = " + std::to_string(micro) + ")";
  if (batch < 1) bad(call + ": batch must be >= 1");
  if (micro < 1) bad(call + ": micro must be >= 1");
  const std::int64_t count = ceil_div(batch, micro);
  if (count > kMaxMicroBatches) {
    bad(call + ": " + std::to_string(count) + " micro-batches; valid: at most " +
        std::to_string(kMaxMicroBatches) + " (a larger micro)");
  }
  return {micro, count, batch - (count - 1) * micro};
}

std::vector<std::int64_t> sizes_of(const Split& s) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(s.count), s.size);
  out.back() = s.last;
  return out;
}

std::vector<std::int64_t> split_batch(std::int64_t batch, std::int64_t accum) {
  return sizes_of(split_shape(batch, accum));
}

std::vector<std::int64_t> micro_batch_split(std::int64_t batch, std::int64_t micro) {
  return sizes_of(micro_batch_shape(batch, micro));
}

}  // namespace memfit
