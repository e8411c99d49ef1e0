// Out of memory: budget and provider failures, the retry that empties the cache, the report
// (message and OomInfo), and that the allocator stays usable and leaks nothing.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/fault_injecting_provider.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"
#include "memory/size.h"

namespace memfit {
namespace {

AllocatorConfig checked(std::size_t budget = 0) {
  AllocatorConfig c;
  c.debug_checks = true;
  c.budget = budget;
  return c;
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

TEST(Oom, RetryReleasesCachedSegments) {
  HostProvider host;
  FaultInjectingProvider faulty(host);
  faulty.set_byte_limit(8 * kMiB);
  {
    AllocatorConfig c = checked();
    c.release_before_growth = false;  // it would return the small segments before the retry
    CachingAllocator a(faulty, c);
    {
      std::vector<Block> blocks;
      for (int i = 0; i < 4; ++i) blocks.push_back(a.allocate(kMiB, Category::kActivation));
    }  // two 2 MiB small segments, now cached and free
    EXPECT_EQ(faulty.bytes_in_use(), 4 * kMiB);
    // 6 MiB: neither a 20 MiB nor a 6 MiB segment fits next to the cache; emptying it does.
    Block big = a.allocate(6 * kMiB, Category::kActivation);
    const AllocatorStats s = a.stats();
    EXPECT_EQ(s.num_alloc_retries, 1);
    EXPECT_EQ(s.num_ooms, 0);
    EXPECT_EQ(s.num_device_free, 2);
    EXPECT_EQ(s.reserved_bytes[kStatAll].current, std::int64_t(6 * kMiB));
    EXPECT_EQ(faulty.bytes_in_use(), 6 * kMiB);
  }
  EXPECT_EQ(faulty.live_allocations(), 0);
}

TEST(Oom, OneFailedProviderCallIsRetried) {
  HostProvider host;
  FaultInjectingProvider faulty(host);
  CachingAllocator a(faulty, checked());
  faulty.fail_call(1);
  Block b = a.allocate(1000, Category::kActivation);
  EXPECT_TRUE(b);
  EXPECT_EQ(faulty.failures(), 1);
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  EXPECT_EQ(a.stats().num_ooms, 0);
}

TEST(Oom, MessageAndInfoGiveTheFigures) {
  NullProvider null;
  CachingAllocator a(null, checked(64 * kMiB));
  struct Seen {
    std::size_t size;
    StreamId stream;
    std::string tag;
  };
  std::vector<Seen> ooms;
  a.add_listener([&](const AllocatorEvent& e) {
    if (e.kind == EventKind::kOom) ooms.push_back({e.size, e.stream, std::string(e.tag)});
  });
  Block p = a.allocate(30 * kMiB, Category::kParameter, kDefaultStream, "embed");  // 30 MiB seg
  Block x = a.allocate(12 * kMiB, Category::kActivation);                          // 12 MiB seg
  Block t = a.allocate(4 * kMiB, Category::kTemporary);  // 20 MiB seg, 16 MiB left free
  ASSERT_EQ(a.stats().reserved_bytes[kStatAll].current, std::int64_t(62 * kMiB));

  try {
    a.allocate(40 * kMiB, Category::kGradient, 3, "lm_head.grad");
    FAIL() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    const OomInfo& info = e.info();
    EXPECT_EQ(info.requested_bytes, 40 * kMiB);
    EXPECT_EQ(info.allocated_bytes, 46 * kMiB);
    EXPECT_EQ(info.reserved_bytes, 62 * kMiB);
    EXPECT_EQ(info.budget_bytes, 64 * kMiB);
    EXPECT_EQ(info.largest_free_block, 16 * kMiB);
    ASSERT_EQ(info.top_categories.size(), 3u);
    EXPECT_EQ(info.top_categories[0], std::make_pair(Category::kParameter, 30 * kMiB));
    EXPECT_EQ(info.top_categories[1], std::make_pair(Category::kActivation, 12 * kMiB));
    EXPECT_EQ(info.top_categories[2], std::make_pair(Category::kTemporary, 4 * kMiB));

    const std::string msg = e.what();
    for (const std::string& needle :
         {format_bytes(40 * kMiB), std::to_string(40 * kMiB) + " bytes", std::string("gradient"),
          std::string("lm_head.grad"), std::string("stream 3"), std::string("budget"),
          "allocated " + format_bytes(46 * kMiB), "reserved " + format_bytes(62 * kMiB),
          "budget " + format_bytes(64 * kMiB), "largest free block " + format_bytes(16 * kMiB),
          "parameter " + format_bytes(30 * kMiB), "activation " + format_bytes(12 * kMiB),
          "temporary " + format_bytes(4 * kMiB)}) {
      EXPECT_TRUE(contains(msg, needle)) << "'" << needle << "' missing from: " << msg;
    }
    EXPECT_LT(msg.find("parameter"), msg.find("activation "));  // largest first
  }
  ASSERT_EQ(ooms.size(), 1u);
  EXPECT_EQ(ooms[0].size, 40 * kMiB);
  EXPECT_EQ(ooms[0].stream, 3u);
  EXPECT_EQ(ooms[0].tag, "lm_head.grad");
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.reserved_bytes[kStatAll].current, std::int64_t(62 * kMiB));  // nothing changed
  EXPECT_EQ(s.allocated_bytes[kStatAll].current, std::int64_t(46 * kMiB));

  // Still usable: free the parameter and the request fits after the retry releases its cache.
  p.reset();
  x.reset();
  Block g = a.allocate(40 * kMiB, Category::kGradient);
  EXPECT_TRUE(g);
  s = a.stats();
  EXPECT_EQ(s.num_alloc_retries, 2);
  EXPECT_LE(s.reserved_bytes[kStatAll].current, std::int64_t(64 * kMiB));
  a.check_invariants();
}

TEST(Oom, FailingProviderLeaksNothing) {
  HostProvider host;
  FaultInjectingProvider faulty(host);
  {
    CachingAllocator a(faulty, checked());
    Block kept = a.allocate(100, Category::kInput);
    faulty.fail_every_call(true);
    for (std::size_t bytes : {3 * kMiB, 12 * kMiB, 30 * kMiB}) {
      try {
        a.allocate(bytes, Category::kActivation);
        ADD_FAILURE() << "no OutOfMemory for " << bytes;
      } catch (const OutOfMemory& e) {
        EXPECT_TRUE(contains(e.what(), "returned no memory")) << e.what();
        EXPECT_TRUE(contains(e.what(), "unlimited")) << e.what();
        EXPECT_EQ(e.info().top_categories.size(), 1u);
      }
    }
    EXPECT_EQ(a.stats().num_ooms, 3);
    // A small request still fits the cached segment: no provider call needed.
    Block fits = a.allocate(1000, Category::kActivation);
    kept.reset();
    fits.reset();
    a.empty_cache();
    EXPECT_EQ(faulty.live_allocations(), 0);
    faulty.fail_every_call(false);
    Block after = a.allocate(5 * kMiB, Category::kActivation);
    EXPECT_EQ(faulty.live_allocations(), 1);
  }
  EXPECT_EQ(faulty.live_allocations(), 0);
  EXPECT_EQ(faulty.bytes_in_use(), 0u);
}

TEST(Oom, AbsurdButValidSizes) {
  NullProvider null(80 * kGiB);
  CachingAllocator a(null, checked());
  try {
    a.allocate(std::size_t{1} << 40, Category::kActivation);  // 1 TiB: provider says no
    FAIL();
  } catch (const OutOfMemory& e) {
    EXPECT_TRUE(contains(e.what(), "1.00 TiB")) << e.what();
    EXPECT_TRUE(contains(e.what(), "'null'")) << e.what();
  }
  a.set_budget(24 * kGiB);
  EXPECT_THROW(a.allocate(30 * kGiB, Category::kActivation), OutOfMemory);
  Block ok = a.allocate(20 * kGiB, Category::kActivation);
  EXPECT_EQ(null.in_use(), 20 * kGiB);
  EXPECT_EQ(a.stats().num_ooms, 2);
}

}  // namespace
}  // namespace memfit
