// Splitting a global batch into micro-batches: even and uneven splits, the errors and what
// they suggest.
#include "policies/accumulation.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "memory/error.h"

namespace memfit {
namespace {

using V = std::vector<std::int64_t>;

void expect_invalid(std::int64_t b, std::int64_t k, std::initializer_list<const char*> parts) {
  try {
    split_batch(b, k);
    ADD_FAILURE() << "split_batch(" << b << ", " << k << ") did not throw";
  } catch (const InvalidArgument& e) {
    for (const char* p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
}

TEST(SplitBatch, EvenAndUneven) {
  EXPECT_EQ(split_batch(8, 4), (V{2, 2, 2, 2}));
  EXPECT_EQ(split_batch(10, 4), (V{3, 3, 3, 1}));  // the uneven last takes what is left
  EXPECT_EQ(split_batch(7, 1), (V{7}));
  EXPECT_EQ(split_batch(7, 7), (V{1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(split_batch(16, 3), (V{6, 6, 4}));
}

TEST(SplitBatch, EverySplitIsKNonEmptyBatchesSummingToB) {
  for (std::int64_t b = 1; b <= 60; ++b) {
    for (std::int64_t k = 1; k <= b; ++k) {
      V v;
      try {
        v = split_batch(b, k);
      } catch (const InvalidArgument&) {
        // Refused only when ceil(B/K)-sized batches run out before K of them.
        const std::int64_t m = (b + k - 1) / k;
        EXPECT_LT(b - (k - 1) * m, 1) << b << "/" << k;
        continue;
      }
      ASSERT_EQ(static_cast<std::int64_t>(v.size()), k);
      EXPECT_EQ(std::accumulate(v.begin(), v.end(), std::int64_t{0}), b);
      for (std::size_t i = 0; i + 1 < v.size(); ++i) EXPECT_EQ(v[i], v[0]);
      EXPECT_GE(v.back(), 1);
      EXPECT_LE(v.back(), v[0]);
    }
  }
}

TEST(SplitBatch, Errors) {
  expect_invalid(0, 1, {"batch", ">= 1"});
  expect_invalid(-3, 1, {"batch"});
  expect_invalid(4, 0, {"accum", ">= 1"});
  expect_invalid(3, 4, {"more micro-batches than samples", "[1, 3]"});
  // 5 / 4: ceil = 2 gives 2, 2, 1: three batches. 4 and 7 are the nearest that split in four.
  expect_invalid(5, 4, {"split_batch(batch = 5, accum = 4)", "e.g. 4 or 7"});
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(split_batch(big, 1), (V{big}));
  const V two = split_batch(big, 2);
  EXPECT_EQ(two[0] + two[1], big);
}

TEST(MicroBatchSplit, Cases) {
  EXPECT_EQ(micro_batch_split(10, 4), (V{4, 4, 2}));
  EXPECT_EQ(micro_batch_split(12, 4), (V{4, 4, 4}));
  EXPECT_EQ(micro_batch_split(3, 8), (V{3}));
  EXPECT_EQ(micro_batch_split(1, 1), (V{1}));
  EXPECT_THROW(micro_batch_split(0, 4), InvalidArgument);
  EXPECT_THROW(micro_batch_split(4, 0), InvalidArgument);
  EXPECT_THROW(micro_batch_split(std::numeric_limits<std::int64_t>::max(), 1), InvalidArgument);
}

// The O(1) shapes describe exactly the vectors, and reach sizes no vector could hold.
TEST(SplitShape, DescribesTheSplitsWithoutTheVector) {
  for (std::int64_t b = 1; b <= 40; ++b) {
    for (std::int64_t k = 1; k <= b; ++k) {
      try {
        EXPECT_EQ(sizes_of(split_shape(b, k)), split_batch(b, k)) << b << " / " << k;
      } catch (const InvalidArgument&) {
        EXPECT_THROW(split_batch(b, k), InvalidArgument);
      }
      EXPECT_EQ(sizes_of(micro_batch_shape(b, k)), micro_batch_split(b, k)) << b << " by " << k;
    }
  }
  const std::int64_t big = std::int64_t{1} << 40;
  EXPECT_EQ(micro_batch_shape(big + 5, 1024), (Split{1024, (big >> 10) + 1, 5}));
  EXPECT_EQ(split_shape(big, 1 << 20), (Split{big >> 20, 1 << 20, big >> 20}));
  // Past kMaxMicroBatches: an error naming the limit, never a clamp or an overflow.
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  try {
    micro_batch_shape(max, 1);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(kMaxMicroBatches)), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(micro_batch_shape(max, max), (Split{max, 1, max}));
  EXPECT_EQ(micro_batch_shape(max, max / 2).count, 3);
}

}  // namespace
}  // namespace memfit
