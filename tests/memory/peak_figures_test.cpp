// PeakFigures and the allocator's moment of the reserved peak: the breakdown at the peak adds
// up to it (categories + cached = reserved), follows the moment with the most allocated at
// the peak, restarts with reset_peak_stats, and take_max keeps a breakdown that adds up.
#include "memory/peak_figures.h"

#include <gtest/gtest.h>

#include <vector>

#include "memory/caching_allocator.h"
#include "memory/null_provider.h"
#include "memory/size.h"

namespace memfit {
namespace {

std::size_t sum(const std::array<std::size_t, kCategoryCount>& a) {
  std::size_t s = 0;
  for (std::size_t b : a) s += b;
  return s;
}

TEST(PeakFigures, TheBreakdownIsTheMomentReservedPeakedWithTheMostAllocated) {
  NullProvider null;
  CachingAllocator alloc(null);
  // A 20 MiB segment for a 6 MiB activation, then 3 MiB of temporaries inside it: reserved
  // stays, allocated grows, so the moment moves to the later, fuller one. (Gradients would get
  // a segment of their own: separate_persistent_pools.)
  Block a = alloc.allocate(6 * kMiB, Category::kActivation);
  PeakFigures p = PeakFigures::of(alloc.stats());
  EXPECT_EQ(p.reserved, 20 * kMiB);
  EXPECT_EQ(p.at_peak_of(Category::kActivation), 6 * kMiB);
  Block t = alloc.allocate(3 * kMiB, Category::kTemporary);
  p = PeakFigures::of(alloc.stats());
  EXPECT_EQ(p.reserved, 20 * kMiB);
  EXPECT_EQ(p.at_peak_of(Category::kTemporary), 3 * kMiB);
  EXPECT_EQ(p.allocated_at_peak, 9 * kMiB);
  EXPECT_EQ(p.cached(), 11 * kMiB);
  EXPECT_EQ(sum(p.at_peak) + p.cached(), p.reserved);
  // Freeing and allocating less at the same reserved peak does not move the moment.
  a.reset();
  Block w = alloc.allocate(2 * kMiB, Category::kWorkspace);
  p = PeakFigures::of(alloc.stats());
  EXPECT_EQ(p.reserved, 20 * kMiB);
  EXPECT_EQ(p.at_peak_of(Category::kActivation), 6 * kMiB);
  EXPECT_EQ(p.at_peak_of(Category::kWorkspace), 0u);
  EXPECT_EQ(p.category_peaks[category_index(Category::kWorkspace)], 2 * kMiB);  // its own peak
  // A gradient gets a segment of its own: a new reserved peak, a new moment.
  Block g = alloc.allocate(30 * kMiB, Category::kGradient);
  p = PeakFigures::of(alloc.stats());
  EXPECT_EQ(p.reserved, 50 * kMiB);
  EXPECT_EQ(p.at_peak_of(Category::kActivation), 0u);
  EXPECT_EQ(p.at_peak_of(Category::kGradient), 30 * kMiB);
  EXPECT_EQ(p.at_peak_of(Category::kTemporary), 3 * kMiB);
  EXPECT_EQ(p.at_peak_of(Category::kWorkspace), 2 * kMiB);
  EXPECT_EQ(sum(p.at_peak) + p.cached(), p.reserved);
  // reset_peak_stats: the present is the moment.
  g.reset();
  alloc.empty_cache();
  alloc.reset_peak_stats();
  p = PeakFigures::of(alloc.stats());
  EXPECT_EQ(p.reserved, 20 * kMiB);
  EXPECT_EQ(p.allocated_at_peak, 5 * kMiB);
  EXPECT_EQ(p.at_peak_of(Category::kGradient), 0u);
  EXPECT_EQ(sum(p.at_peak) + p.cached(), p.reserved);
}

TEST(PeakFigures, TakeMaxKeepsABreakdownThatAddsUp) {
  PeakFigures a, b;
  a.reserved = 100;
  a.allocated = 90;
  a.at_peak[0] = 80;
  a.allocated_at_peak = 80;
  a.category_peaks[0] = 85;
  b.reserved = 120;
  b.allocated = 70;
  b.at_peak[1] = 60;
  b.allocated_at_peak = 60;
  b.category_peaks[1] = 65;
  b.host_pinned = 7;
  PeakFigures m = a;
  m.take_max(b);
  EXPECT_EQ(m.reserved, 120u);
  EXPECT_EQ(m.allocated, 90u);
  EXPECT_EQ(m.at_peak, b.at_peak);  // the breakdown of the larger reserved peak
  EXPECT_EQ(m.cached(), 60u);
  EXPECT_EQ(m.category_peaks[0], 85u);
  EXPECT_EQ(m.category_peaks[1], 65u);
  EXPECT_EQ(m.host_pinned, 7u);
  PeakFigures n = b;
  n.take_max(a);
  EXPECT_EQ(n, m);
}

}  // namespace
}  // namespace memfit
