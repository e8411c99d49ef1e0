#include "profiler/host_region.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "profiler/scoped_range.h"

namespace memfit {
namespace {

std::size_t of(const CategoryBytes& b, Category c) { return b[category_index(c)]; }

// Regions are process-wide: each test measures against the live bytes it found.
TEST(HostRegion, ListenersHearEachRegionComeAndGoWithTheTotalsAfter) {
  const CategoryBytes before = host_region_bytes();
  std::vector<HostRegionEvent> heard;
  CategoryBytes live{};
  const std::uint64_t id =
      add_host_region_listener([&](const HostRegionEvent& e) { heard.push_back(e); }, &live);
  EXPECT_EQ(live, before);
  {
    HostRegion masters(Category::kOptimizerState, 4096, "masters");
    HostRegion grads(Category::kGradient, 1024, "grads");
    EXPECT_EQ(of(host_region_bytes(), Category::kOptimizerState),
              of(before, Category::kOptimizerState) + 4096);
    EXPECT_EQ(masters.bytes(), 4096u);
    EXPECT_EQ(grads.category(), Category::kGradient);
  }
  remove_host_region_listener(id);
  HostRegion unheard(Category::kActivation, 8, "after removal");
  ASSERT_EQ(heard.size(), 4u);
  EXPECT_TRUE(heard[0].pinned);
  EXPECT_EQ(heard[0].bytes, 4096u);
  EXPECT_EQ(interned_name(heard[0].tag), "masters");
  EXPECT_EQ(of(heard[1].after, Category::kGradient), of(before, Category::kGradient) + 1024);
  // Destroyed in reverse order: grads first.
  EXPECT_FALSE(heard[2].pinned);
  EXPECT_EQ(heard[2].category, Category::kGradient);
  EXPECT_EQ(heard[3].after, before);
  EXPECT_LE(heard[0].time_ns, heard[3].time_ns);
}

TEST(HostRegion, MovedFromEmptyAndZeroByteRegionsAreNone) {
  const CategoryBytes before = host_region_bytes();
  int heard = 0;
  const std::uint64_t id = add_host_region_listener([&](const HostRegionEvent&) { ++heard; });
  {
    HostRegion none;
    HostRegion zero(Category::kActivation, 0, "zero");
    HostRegion a(Category::kActivation, 100, "a");
    HostRegion b = std::move(a);  // one region, now b's
    EXPECT_EQ(a.bytes(), 0u);
    EXPECT_EQ(of(host_region_bytes(), Category::kActivation),
              of(before, Category::kActivation) + 100);
    HostRegion c(Category::kGradient, 50, "c");
    c = std::move(b);  // c's own region goes; b's is c's now
    EXPECT_EQ(of(host_region_bytes(), Category::kGradient), of(before, Category::kGradient));
    EXPECT_EQ(of(host_region_bytes(), Category::kActivation),
              of(before, Category::kActivation) + 100);
  }
  remove_host_region_listener(id);
  EXPECT_EQ(heard, 4);  // a, c, c's release, and the moved region's release
  EXPECT_EQ(host_region_bytes(), before);
}

}  // namespace
}  // namespace memfit
