// CachingAllocator with expandable segments (expandable_segments:True), against hand-computed
// layouts: one range per pool and stream grown page by page, a request served by free blocks
// and unmapped pages side by side, empty_cache unmapping whole free pages only, the events and
// stats that follow, failures part way through a grow, and providers without virtual memory.
// The randomized checks are in caching_allocator_property_test.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/check.h"
#include "memory/error.h"
#include "memory/fault_injecting_provider.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"
#include "memory/pinned_host_provider.h"
#include "memory/size.h"

namespace memfit {
namespace {

constexpr Category kAct = Category::kActivation;
constexpr std::size_t kPage = std::size_t{2} << 20;

AllocatorConfig expandable() {
  AllocatorConfig c;
  c.expandable_segments = true;
  c.debug_checks = true;
  return c;
}

std::uintptr_t addr(const Block& b) { return reinterpret_cast<std::uintptr_t>(b.data()); }
std::int64_t reserved(const CachingAllocator& a) {
  return a.stats().reserved_bytes[kStatAll].current;
}

struct Seen {
  EventKind kind;
  std::uintptr_t addr;
  std::size_t size;
};

TEST(CachingAllocatorExpandable, OneRangeGrowsByPagesAndBlocksSitSideBySide) {
  NullProvider null;
  CachingAllocator a(null, expandable());
  // 3 MiB + 3 MiB + 1.5 MiB: large pool, one range, 8 MiB mapped (fixed segments: three
  // 20 MiB segments would hold them... or one; either way 20 MiB at least).
  Block x = a.allocate(3 * kMiB, kAct);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(2 * kPage));  // 3 MiB -> 2 pages
  Block y = a.allocate(3 * kMiB, kAct);
  EXPECT_EQ(addr(y), addr(x) + 3 * kMiB) << "the next block follows in the same range";
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(3 * kPage));
  Block z = a.allocate(1536 * kKiB, kAct);
  EXPECT_EQ(addr(z), addr(y) + 3 * kMiB);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(4 * kPage));
  EXPECT_EQ(null.mapped(), 4 * kPage);
  EXPECT_EQ(null.num_allocs(), 0) << "no fixed segment was made";

  const Snapshot snap = a.snapshot();
  ASSERT_EQ(snap.segments.size(), 1u) << "one mapped run";
  EXPECT_TRUE(snap.segments[0].is_expandable);
  EXPECT_EQ(snap.segments[0].total_size, 4 * kPage);
  ASSERT_EQ(snap.segments[0].blocks.size(), 4u);  // x, y, z, and 0.5 MiB free at the end
  EXPECT_EQ(snap.segments[0].blocks[3].state, BlockState::kInactive);
  EXPECT_EQ(snap.segments[0].blocks[3].size, 512 * kKiB);
  const AllocatorStats st = a.stats();
  EXPECT_EQ(st.segment[kStatAll].current, 1);
  EXPECT_EQ(st.num_device_alloc, 3) << "one map per growth";
  EXPECT_EQ(st.inactive_split[kStatAll].current, 1);
}

TEST(CachingAllocatorExpandable, AFreeBlockAndUnmappedPagesAfterItServeOneRequest) {
  NullProvider null;
  CachingAllocator a(null, expandable());
  Block x = a.allocate(3 * kMiB, kAct);
  Block y = a.allocate(3 * kMiB, kAct);  // 6 MiB: 3 pages mapped
  const std::uintptr_t y_at = addr(y);
  y.reset();  // [x 3 MiB][free 3 MiB] | unmapped
  // 5 MiB fits no free block; the free 3 MiB and one more page after it do.
  Block z = a.allocate(5 * kMiB, kAct);
  EXPECT_EQ(addr(z), y_at);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(4 * kPage));
  EXPECT_EQ(a.snapshot().segments.size(), 1u);
}

TEST(CachingAllocatorExpandable, EmptyCacheUnmapsWholeFreePagesOnlyWithEvents) {
  NullProvider null;
  CachingAllocator a(null, expandable());
  std::vector<Seen> seen;
  a.add_listener([&](const AllocatorEvent& e) {
    if (e.kind == EventKind::kSegmentMap || e.kind == EventKind::kSegmentUnmap ||
        e.kind == EventKind::kSegmentAlloc || e.kind == EventKind::kSegmentFree) {
      seen.push_back({e.kind, e.addr, e.size});
    }
  });
  Block w = a.allocate(kPage, kAct);
  Block x = a.allocate(kPage, kAct);
  Block y = a.allocate(kPage, kAct);
  Block z = a.allocate(3 * kMiB, kAct);  // pages 3 and 4, half of 4 free
  const std::uintptr_t base = addr(w);
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].kind, EventKind::kSegmentMap);
  EXPECT_EQ(seen[0].addr, base);
  EXPECT_EQ(seen[0].size, kPage);
  EXPECT_EQ(seen[3].addr, base + 3 * kPage);
  EXPECT_EQ(seen[3].size, 2 * kPage);
  x.reset();
  seen.clear();
  a.empty_cache();
  // Page 1 goes; the free half of page 4 shares it with z and stays.
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, EventKind::kSegmentUnmap);
  EXPECT_EQ(seen[0].addr, base + kPage);
  EXPECT_EQ(seen[0].size, kPage);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(4 * kPage));
  const Snapshot snap = a.snapshot();
  ASSERT_EQ(snap.segments.size(), 2u) << "two mapped runs around the unmapped page";
  EXPECT_EQ(snap.segments[0].total_size, kPage);
  EXPECT_EQ(snap.segments[1].address, base + 2 * kPage);
  EXPECT_EQ(snap.segments[1].total_size, 3 * kPage);
  EXPECT_EQ(a.stats().segment[kStatAll].current, 2);
  EXPECT_EQ(a.stats().num_device_free, 1);

  // A 2 MiB request maps page 1 again (the lowest place), joining the runs.
  Block again = a.allocate(kPage, kAct);
  EXPECT_EQ(addr(again), base + kPage);
  EXPECT_EQ(a.stats().segment[kStatAll].current, 1);

  w.reset();
  again.reset();
  y.reset();
  z.reset();
  a.empty_cache();
  EXPECT_EQ(reserved(a), 0);
  EXPECT_EQ(null.mapped(), 0u);
  EXPECT_EQ(null.reservations(), 0u) << "a range with nothing mapped is released";
  EXPECT_TRUE(a.snapshot().segments.empty());
  EXPECT_EQ(a.stats().segment[kStatAll].current, 0);
}

TEST(CachingAllocatorExpandable, PoolsAndStreamsGetRangesOfTheirOwn) {
  NullProvider null;
  CachingAllocator a(null, expandable());
  Block small = a.allocate(4 * kKiB, kAct);
  Block large = a.allocate(4 * kMiB, kAct);
  Block other = a.allocate(4 * kMiB, kAct, /*stream=*/1);
  Block grad = a.allocate(4 * kMiB, Category::kGradient);  // the persistent pool
  const Snapshot snap = a.snapshot();
  ASSERT_EQ(snap.segments.size(), 4u);
  int persistent = 0;
  for (const SegmentInfo& s : snap.segments) persistent += s.persistent ? 1 : 0;
  EXPECT_EQ(persistent, 1) << "the gradient's range";
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(kPage + 2 * kPage * 3));
  EXPECT_EQ(a.stats().reserved_bytes[kStatSmallPool].current,
            static_cast<std::int64_t>(kPage));
}

TEST(CachingAllocatorExpandable, FailureHalfWayThroughAGrowRetriesAfterUnmapping) {
  NullProvider null;
  FaultInjectingProvider faulty(null);
  CachingAllocator a(faulty, expandable());
  // [f0][unmapped page 1][f2][unmapped ...]: a request of 8 MiB takes f0 and maps page 1
  // (merging f0, page 1 and f2), then needs one more page after f2.
  Block x0 = a.allocate(kPage, kAct);
  Block x1 = a.allocate(kPage, kAct);
  Block x2 = a.allocate(kPage, kAct);
  Block x3 = a.allocate(kPage, kAct);
  const std::uintptr_t base = addr(x0);
  x1.reset();
  x3.reset();
  a.empty_cache();
  x0.reset();
  x2.reset();
  ASSERT_EQ(reserved(a), static_cast<std::int64_t>(2 * kPage));

  faulty.fail_call(2);  // the second map of the grow fails
  const std::int64_t failures = faulty.failures();
  Block big = a.allocate(8 * kMiB, kAct);  // retried: free pages unmapped, then a fresh grow
  EXPECT_EQ(faulty.failures(), failures + 1);
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  EXPECT_EQ(a.stats().num_ooms, 0);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(4 * kPage));
  EXPECT_EQ(faulty.bytes_in_use(), 4 * kPage);
  EXPECT_GE(addr(big), base) << "a fresh range: the old one was emptied and released";
  a.check_invariants();
}

TEST(CachingAllocatorExpandable, BudgetRefusedHalfWayThroughAGrowThrowsAndLeavesItUsable) {
  NullProvider null;
  CachingAllocator a(null, expandable());
  Block x0 = a.allocate(kPage, kAct);
  Block x1 = a.allocate(kPage, kAct);
  Block x2 = a.allocate(kPage, kAct);
  Block keep = a.allocate(kPage, kAct);  // stays: the retry cannot unmap it
  x1.reset();
  a.empty_cache();
  x0.reset();
  x2.reset();  // [f0][unmapped][f2][keep][unmapped ...]: 3 pages mapped
  a.set_budget(5 * kPage);
  // 10 MiB: f0 + page 1 + f2 = 6 MiB, then keep is in the way: no place in this range
  // reaches 10 MiB... except after keep. There, 5 pages would exceed the budget.
  EXPECT_THROW(a.allocate(10 * kMiB, kAct), OutOfMemory);
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_LE(reserved(a), static_cast<std::int64_t>(5 * kPage));
  a.check_invariants();
  // The retry unmapped every free page: only keep's page is left.
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(kPage));
  // Usable: 8 MiB fits the budget, and the memory is there.
  Block y = a.allocate(8 * kMiB, kAct);
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(5 * kPage));
}

TEST(CachingAllocatorExpandable, MapFailureWhileGrowingFromAFreeBlockKeepsWhatWasMapped) {
  NullProvider null;
  FaultInjectingProvider faulty(null);
  CachingAllocator a(faulty, expandable());
  Block x = a.allocate(kPage, kAct);
  Block y = a.allocate(kPage, kAct);
  y.reset();  // [x][free page 1] | unmapped
  faulty.fail_every_call(true);
  EXPECT_THROW(a.allocate(6 * kMiB, kAct), OutOfMemory);
  faulty.fail_every_call(false);
  a.check_invariants();
  // The retry unmapped the free page; x's page stays.
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(kPage));
  EXPECT_EQ(faulty.bytes_in_use(), kPage);
}

TEST(CachingAllocatorExpandable, HostMemoryIsWritableAndReturned) {
  HostProvider host;
  {
    CachingAllocator a(host, expandable());
    std::vector<Block> blocks;
    for (int i = 0; i < 20; ++i) {
      blocks.push_back(a.allocate((i + 1) * 300 * kKiB, kAct));
      auto* p = static_cast<unsigned char*>(blocks.back().data());
      p[0] = static_cast<unsigned char>(i);
      p[blocks.back().size() - 1] = static_cast<unsigned char>(i + 1);
    }
    for (int i = 0; i < 20; ++i) {
      const auto* p = static_cast<const unsigned char*>(blocks[i].data());
      EXPECT_EQ(p[0], static_cast<unsigned char>(i));
      EXPECT_EQ(p[blocks[i].size() - 1], static_cast<unsigned char>(i + 1));
    }
    for (int i = 0; i < 20; i += 2) blocks[i].reset();
    a.empty_cache();
    Block again = a.allocate(5 * kMiB, kAct);
    static_cast<unsigned char*>(again.data())[5 * kMiB - 1] = 7;  // mapped again: writable
  }  // the destructor unmaps and releases every range (checked on NullProvider below)
}

TEST(CachingAllocatorExpandable, DestructorUnmapsAndReleasesEveryRange) {
  NullProvider null;
  {
    CachingAllocator a(null, expandable());
    Block x = a.allocate(3 * kMiB, kAct);
    Block y = a.allocate(100 * kKiB, kAct);
    Block z = a.allocate(3 * kMiB, Category::kOptimizerState, 1);
  }
  EXPECT_EQ(null.mapped(), 0u);
  EXPECT_EQ(null.in_use(), 0u);
  EXPECT_EQ(null.num_maps(), 3);
  EXPECT_EQ(null.num_unmaps(), 3) << "each run unmapped once";
  EXPECT_EQ(null.reservations(), 0u) << "every range released";
}

TEST(CachingAllocatorExpandable, BudgetSizesTheRangeAndBoundsReserved) {
  NullProvider null;
  AllocatorConfig c = expandable();
  c.budget = 16 * kMiB;
  CachingAllocator a(null, c);
  std::vector<Block> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(a.allocate(3 * kMiB, kAct));
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(8 * kPage));
  EXPECT_THROW(a.allocate(3 * kMiB, kAct), OutOfMemory);  // would be 18 MiB
  EXPECT_EQ(reserved(a), static_cast<std::int64_t>(8 * kPage));
}

TEST(CachingAllocatorExpandable, AProviderWithoutVirtualMemoryIsAConfigErrorNamingIt) {
  PinnedHostProvider pinned(PinnedHostProvider::Mode::kMlock);
  try {
    CachingAllocator a(pinned, expandable());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("expandable_segments"), std::string::npos) << what;
    EXPECT_NE(what.find(pinned.name()), std::string::npos) << what;
  }
}

TEST(CachingAllocatorExpandable, HostProviderVirtualMemoryPrimitives) {
  HostProvider host;
  ASSERT_EQ(host.page_size(), kPage);
  void* base = host.reserve(4 * kPage);
  ASSERT_NE(base, nullptr);
  auto* p = static_cast<unsigned char*>(base);
  ASSERT_TRUE(host.map(p + kPage, 2 * kPage));
  p[kPage] = 1;
  p[3 * kPage - 1] = 2;
  EXPECT_EQ(p[kPage] + p[3 * kPage - 1], 3);
  host.unmap(p + kPage, 2 * kPage);
  ASSERT_TRUE(host.map(p + kPage, kPage));
  EXPECT_EQ(p[kPage], 0) << "an unmapped page comes back zeroed: its memory was returned";
  host.unmap(p + kPage, kPage);
  host.release(base, 4 * kPage);
}

TEST(CachingAllocatorExpandable, NullProviderModelsPagesAndRefusesMisuse) {
  NullProvider null(3 * kPage);
  void* base = null.reserve(8 * kPage);
  ASSERT_NE(base, nullptr);
  auto* p = static_cast<char*>(base);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(base) % kPage, 0u);
  EXPECT_EQ(null.in_use(), 0u) << "reserving costs nothing";
  EXPECT_TRUE(null.map(p, 2 * kPage));
  EXPECT_FALSE(null.map(p + 2 * kPage, 2 * kPage)) << "beyond the capacity";
  EXPECT_TRUE(null.map(p + 2 * kPage, kPage));
  EXPECT_EQ(null.mapped(), 3 * kPage);
  EXPECT_THROW(null.map(p, kPage), CheckFailure) << "mapping a mapped page";
  EXPECT_THROW(null.release(base, 8 * kPage), CheckFailure) << "pages still mapped";
  null.unmap(p, 3 * kPage);
  EXPECT_THROW(null.unmap(p, kPage), CheckFailure) << "unmapping an unmapped page";
  EXPECT_THROW(null.map(p + 1, kPage), CheckFailure) << "not on a page";
  null.release(base, 8 * kPage);
  EXPECT_EQ(null.num_maps(), 2);
  EXPECT_EQ(null.num_unmaps(), 1);
}

}  // namespace
}  // namespace memfit
