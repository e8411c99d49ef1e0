// CachingAllocator spot checks against hand-computed values: rounding, pools, splitting,
// stats, events, snapshots, streams, budget, max_split_size, garbage collection, errors.
#include "memory/caching_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "memory/error.h"
#include "memory/fault_injecting_provider.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"
#include "memory/size.h"

namespace memfit {
namespace {

constexpr Category kAct = Category::kActivation;

AllocatorConfig checked() {
  AllocatorConfig c;
  c.debug_checks = true;
  return c;
}

std::uintptr_t addr(const Block& b) { return reinterpret_cast<std::uintptr_t>(b.data()); }

// Events complete only when the test says so.
class ManualSync final : public StreamSync {
 public:
  EventHandle record(StreamId s) override {
    const EventHandle h = next_++;
    events_[h] = {s, false};
    ++recorded_;
    return h;
  }
  bool query(EventHandle e) override { return events_.at(e).done; }
  void synchronize(EventHandle e) override { events_.at(e).done = true; }
  void release(EventHandle e) override { EXPECT_EQ(events_.erase(e), 1u); }
  void complete_all() {
    for (auto& [h, ev] : events_) ev.done = true;
  }
  std::size_t outstanding() const { return events_.size(); }
  int recorded() const { return recorded_; }

 private:
  struct Ev {
    StreamId stream;
    bool done;
  };
  EventHandle next_ = 1;
  std::map<EventHandle, Ev> events_;
  int recorded_ = 0;
};

struct Recorded {
  EventKind kind;
  std::uintptr_t addr;
  std::size_t size;
  StreamId stream;
  Category category;
  std::string tag;
};

TEST(CachingAllocator, RoundSize) {
  NullProvider null;
  CachingAllocator a(null);
  EXPECT_EQ(a.round_size(1), 512u);
  EXPECT_EQ(a.round_size(512), 512u);
  EXPECT_EQ(a.round_size(513), 1024u);
  EXPECT_EQ(a.round_size(9000), 9216u);
  EXPECT_EQ(a.round_size(3 * kMiB + 1), 3 * kMiB + 512);
  EXPECT_THROW(a.round_size(0), InvalidArgument);
  EXPECT_THROW(a.round_size(kMaxAllocationSize + 1), InvalidArgument);

  AllocatorConfig c;
  c.roundup_power2_divisions = 4;  // steps of 2^k / 4 between 2^k and 2^(k+1)
  CachingAllocator r(null, c);
  EXPECT_EQ(r.round_size(1200), 1536u);                        // <= 512 * 4: granule rounding only
  EXPECT_EQ(r.round_size(4096), 4096u);                        // powers of two stay
  EXPECT_EQ(r.round_size(5000), 5120u);                        // [4096, 8192) in steps of 1024
  EXPECT_EQ(r.round_size(9000), 10240u);                       // [8192, 16384) in steps of 2048
  EXPECT_EQ(r.round_size(3 * kMiB + 1), 3 * kMiB + kMiB / 2);  // steps of 512 KiB
  c.roundup_power2_divisions = 1;
  CachingAllocator p2(null, c);
  EXPECT_EQ(p2.round_size(5000), 8192u);

  // Stats count the rounded size.
  Block b = r.allocate(9000, kAct);
  EXPECT_EQ(r.stats().allocated_bytes[kStatAll].current, 10240);
  EXPECT_EQ(r.stats().requested_bytes[kStatAll].current, 9000);
}

TEST(CachingAllocator, SmallPoolStats) {
  HostProvider host;
  CachingAllocator a(host, checked());
  std::uintptr_t first = 0;
  {
    Block b = a.allocate(1000, Category::kParameter, kDefaultStream, "w");
    first = addr(b);
    EXPECT_EQ(b.size(), 1000u);
    const AllocatorStats s = a.stats();
    EXPECT_EQ(s.allocation[kStatAll].current, 1);
    EXPECT_EQ(s.allocation[kStatSmallPool].current, 1);
    EXPECT_EQ(s.allocation[kStatLargePool].current, 0);
    EXPECT_EQ(s.allocated_bytes[kStatSmallPool].current, 1024);
    EXPECT_EQ(s.requested_bytes[kStatAll].current, 1000);
    EXPECT_EQ(s.segment[kStatSmallPool].current, 1);
    EXPECT_EQ(s.reserved_bytes[kStatAll].current, std::int64_t(kSmallBuffer));
    EXPECT_EQ(s.active_bytes[kStatAll].current, 1024);
    // The rest of the 2 MiB segment is a free block of a split segment.
    EXPECT_EQ(s.inactive_split[kStatSmallPool].current, 1);
    EXPECT_EQ(s.inactive_split_bytes[kStatSmallPool].current, std::int64_t(kSmallBuffer - 1024));
    EXPECT_EQ(s.num_device_alloc, 1);
    EXPECT_EQ(s.category_bytes[category_index(Category::kParameter)].current, 1024);
  }
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocated_bytes[kStatAll].current, 0);
  EXPECT_EQ(s.allocated_bytes[kStatAll].peak, 1024);
  EXPECT_EQ(s.allocated_bytes[kStatAll].allocated, 1024);
  EXPECT_EQ(s.allocated_bytes[kStatAll].freed, 1024);
  EXPECT_EQ(s.active[kStatAll].current, 0);
  // The freed block waits unmerged in the free cache: two inactive blocks of a split segment.
  EXPECT_EQ(s.inactive_split[kStatAll].current, 2);
  EXPECT_EQ(s.inactive_split_bytes[kStatAll].current, std::int64_t(kSmallBuffer));
  EXPECT_EQ(s.reserved_bytes[kStatAll].current, std::int64_t(kSmallBuffer));  // cached
  EXPECT_EQ(s.category_bytes[category_index(Category::kParameter)].peak, 1024);

  // The same rounded size is served from the free cache.
  {
    Block same = a.allocate(1020, kAct);
    EXPECT_EQ(addr(same), first);
  }
  // Another size merges the free cache first, then best fit finds the lowest address.
  Block again = a.allocate(3000, kAct);
  EXPECT_EQ(addr(again), first);
  EXPECT_EQ(a.stats().num_device_alloc, 1);
  EXPECT_EQ(a.stats().inactive_split[kStatAll].current, 1);
}

TEST(CachingAllocator, LargePoolSegmentsAndSplits) {
  NullProvider null;
  CachingAllocator a(null, checked());
  Block x = a.allocate(5 * kMiB, kAct);  // 1-10 MiB: a shared 20 MiB segment
  Block y = a.allocate(5 * kMiB, kAct);  // the 15 MiB remainder is split again
  EXPECT_EQ(addr(y), addr(x) + 5 * kMiB);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.segment[kStatLargePool].current, 1);
  EXPECT_EQ(s.reserved_bytes[kStatLargePool].current, std::int64_t(kLargeBuffer));
  EXPECT_EQ(s.inactive_split_bytes[kStatLargePool].current, std::int64_t(10 * kMiB));

  Block z = a.allocate(13 * kMiB + 1, kAct);  // >= 10 MiB: own segment rounded to 2 MiB
  s = a.stats();
  EXPECT_EQ(s.segment[kStatLargePool].current, 2);
  EXPECT_EQ(s.reserved_bytes[kStatAll].current, std::int64_t(kLargeBuffer + 14 * kMiB));
  // A remainder of <= 1 MiB is not split off: the caller's block is the whole segment.
  EXPECT_EQ(s.allocated_bytes[kStatLargePool].current, std::int64_t(10 * kMiB + 14 * kMiB));
  EXPECT_EQ(s.requested_bytes[kStatLargePool].current, std::int64_t(23 * kMiB + 1));
  Block w = a.allocate(11 * kMiB, kAct);  // 12 MiB segment, 1 MiB left: not split either
  EXPECT_EQ(a.stats().inactive_split[kStatAll].current, 1);
  EXPECT_EQ(s.allocated_bytes[kStatSmallPool].current, 0);

  x.reset();  // free with a live right neighbour: an inactive split block
  s = a.stats();
  EXPECT_EQ(s.inactive_split[kStatLargePool].current, 2);
  EXPECT_EQ(s.inactive_split_bytes[kStatLargePool].current, std::int64_t(15 * kMiB));
  y.reset();  // merges with both neighbours: the segment is whole again
  s = a.stats();
  EXPECT_EQ(s.inactive_split[kStatLargePool].current, 0);
  EXPECT_EQ(s.inactive_split_bytes[kStatLargePool].current, 0);
  EXPECT_EQ(a.snapshot().segments[0].blocks.size(), 1u);
}

TEST(CachingAllocator, SnapshotLayout) {
  HostProvider host;
  CachingAllocator a(host, checked());
  Block p = a.allocate(1000, Category::kParameter, kDefaultStream, "fc1.weight");
  Block q = a.allocate(3000, kAct, kDefaultStream, "fc1");
  Block r = a.allocate(600, Category::kTemporary);
  q.reset();
  Block big = a.allocate(3 * kMiB, Category::kGradient, kDefaultStream, "grad");

  const Snapshot snap = a.snapshot();
  ASSERT_EQ(snap.segments.size(), 2u);
  EXPECT_LT(snap.segments[0].address, snap.segments[1].address);
  const SegmentInfo& small = snap.segments[0].is_large ? snap.segments[1] : snap.segments[0];
  EXPECT_FALSE(small.is_large);
  EXPECT_EQ(small.total_size, kSmallBuffer);
  EXPECT_EQ(small.allocated_size, 2048u);
  EXPECT_EQ(small.active_size, 2048u);
  EXPECT_EQ(small.requested_size, 1600u);
  ASSERT_EQ(small.blocks.size(), 4u);
  const std::uintptr_t base = small.address;
  const struct {
    std::uintptr_t address;
    std::size_t size, requested;
    BlockState state;
    Category category;
    const char* tag;
  } want[] = {
      {base, 1024, 1000, BlockState::kActiveAllocated, Category::kParameter, "fc1.weight"},
      {base + 1024, 3072, 0, BlockState::kInactive, Category::kUnknown, ""},
      {base + 4096, 1024, 600, BlockState::kActiveAllocated, Category::kTemporary, ""},
      {base + 5120, kSmallBuffer - 5120, 0, BlockState::kInactive, Category::kUnknown, ""},
  };
  for (std::size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(small.blocks[i].address, want[i].address);
    EXPECT_EQ(small.blocks[i].size, want[i].size);
    EXPECT_EQ(small.blocks[i].requested_size, want[i].requested);
    EXPECT_EQ(small.blocks[i].state, want[i].state);
    EXPECT_EQ(small.blocks[i].category, want[i].category);
    EXPECT_EQ(small.blocks[i].tag, want[i].tag);
  }
  EXPECT_EQ(addr(p), base);
  EXPECT_EQ(addr(r), base + 4096);
  const SegmentInfo& large = snap.segments[0].is_large ? snap.segments[0] : snap.segments[1];
  EXPECT_EQ(large.total_size, kLargeBuffer);
  EXPECT_EQ(large.blocks[0].tag, "grad");
  EXPECT_EQ(large.blocks[0].state, BlockState::kActiveAllocated);
  EXPECT_EQ(std::string(block_state_name(BlockState::kActivePendingFree)), "active_pending_free");
}

TEST(CachingAllocator, ListenersSeeTheEventSequence) {
  HostProvider host;
  CachingAllocator a(host, checked());
  std::vector<Recorded> seen;
  const ListenerId id = a.add_listener([&](const AllocatorEvent& e) {
    seen.push_back({e.kind, e.addr, e.size, e.stream, e.category, std::string(e.tag)});
    EXPECT_GT(e.time_ns, 0);
  });
  void* p = a.allocate_raw(1000, Category::kInput, 0, "batch");
  a.free(p);
  a.empty_cache();
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  const std::vector<std::pair<EventKind, std::size_t>> want = {
      {EventKind::kSegmentAlloc, kSmallBuffer},
      {EventKind::kAlloc, 1024},
      {EventKind::kFreeRequested, 1024},
      {EventKind::kFreeCompleted, 1024},
      {EventKind::kSegmentFree, kSmallBuffer}};
  ASSERT_EQ(seen.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(event_kind_name(seen[i].kind));
    EXPECT_EQ(seen[i].kind, want[i].first);
    EXPECT_EQ(seen[i].size, want[i].second);
    EXPECT_EQ(seen[i].addr, at);
  }
  EXPECT_EQ(seen[1].tag, "batch");
  EXPECT_EQ(seen[1].category, Category::kInput);
  EXPECT_EQ(seen[2].tag, "batch");

  a.remove_listener(id);
  Block b = a.allocate(10, kAct);
  EXPECT_EQ(seen.size(), want.size());
  EXPECT_THROW(a.remove_listener(id), InvalidArgument);
  EXPECT_THROW(a.add_listener(AllocatorListener{}), InvalidArgument);
  EXPECT_STREQ(event_kind_name(EventKind::kOom), "oom");
}

TEST(CachingAllocator, RecordStreamDefersReuseUntilEventsComplete) {
  HostProvider host;
  ManualSync sync;
  CachingAllocator a(host, checked(), &sync);
  std::vector<Recorded> seen;
  a.add_listener([&](const AllocatorEvent& e) {
    seen.push_back({e.kind, e.addr, e.size, e.stream, e.category, std::string(e.tag)});
  });
  Block x = a.allocate(1000, kAct, /*stream=*/0);
  const std::uintptr_t x_addr = addr(x);
  x.record_stream(0);  // its own stream: nothing to wait for
  EXPECT_EQ(sync.recorded(), 0);
  x.record_stream(1);
  x.record_stream(1);  // recorded once
  x.record_stream(2);
  x.reset();
  EXPECT_EQ(sync.recorded(), 2);
  EXPECT_EQ(seen.back().kind, EventKind::kFreeRequested);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocation[kStatAll].current, 0);
  EXPECT_EQ(s.active[kStatAll].current, 1);  // pending frees stay active
  EXPECT_EQ(s.active_bytes[kStatAll].current, 1024);
  EXPECT_EQ(a.snapshot().segments[0].blocks[0].state, BlockState::kActivePendingFree);

  // Not reusable yet, even on its own stream.
  Block y = a.allocate(1000, kAct, 0);
  EXPECT_NE(addr(y), x_addr);
  y.reset();
  const auto completed_x = [&] {
    return std::count_if(seen.begin(), seen.end(), [&](const Recorded& r) {
      return r.kind == EventKind::kFreeCompleted && r.addr == x_addr;
    });
  };
  EXPECT_EQ(completed_x(), 0);
  sync.complete_all();
  // Events polled first: x is back. (y, freed last, waits in the free cache and comes first.)
  Block z = a.allocate(1000, kAct, 0);
  Block z2 = a.allocate(1000, kAct, 0);
  EXPECT_TRUE(addr(z) == x_addr || addr(z2) == x_addr);
  EXPECT_EQ(completed_x(), 1);
  EXPECT_EQ(sync.outstanding(), 0u);
  EXPECT_EQ(a.stats().active[kStatAll].current, 2);
  z2.reset();

  // Blocks are cached per stream: stream 1 gets its own segment.
  z.reset();
  Block w = a.allocate(1000, kAct, 1);
  EXPECT_EQ(a.stats().segment[kStatAll].current, 2);
  EXPECT_EQ(a.snapshot().segments.size(), 2u);
}

TEST(CachingAllocator, EmptyCacheWaitsForPendingFrees) {
  HostProvider host;
  FaultInjectingProvider counted(host);
  ManualSync sync;
  {
    CachingAllocator a(counted, checked(), &sync);
    void* p = a.allocate_raw(4 * kMiB, kAct, 0);
    void* keep = a.allocate_raw(100, kAct, 0);
    a.record_stream(p, 7);
    a.free(p);
    EXPECT_EQ(counted.live_allocations(), 2);
    a.empty_cache();  // synchronizes the event, then returns the whole free segment
    EXPECT_EQ(sync.outstanding(), 0u);
    EXPECT_EQ(counted.live_allocations(), 1);
    EXPECT_EQ(a.stats().num_device_free, 1);
    a.free(keep);
    a.empty_cache();
    EXPECT_EQ(counted.live_allocations(), 0);
    EXPECT_EQ(a.stats().reserved_bytes[kStatAll].current, 0);
  }
}

TEST(CachingAllocator, BudgetIsEnforced) {
  NullProvider null;
  AllocatorConfig c = checked();
  c.budget = 10 * kMiB;
  CachingAllocator a(null, c);
  EXPECT_EQ(a.budget(), 10 * kMiB);
  // A 6 MiB request would take a 20 MiB segment; under the budget a 6 MiB one is used instead
  // (PyTorch reports out of memory here).
  Block x = a.allocate(6 * kMiB, kAct);
  EXPECT_EQ(a.stats().reserved_bytes[kStatAll].current, std::int64_t(6 * kMiB));
  EXPECT_THROW(a.allocate(5 * kMiB, kAct), OutOfMemory);
  EXPECT_LE(a.stats().reserved_bytes[kStatAll].peak, std::int64_t(10 * kMiB));
  Block small = a.allocate(kMiB, kAct);  // 2 MiB small segment: 8 MiB reserved, fits
  EXPECT_EQ(a.stats().reserved_bytes[kStatAll].current, std::int64_t(8 * kMiB));
  a.set_budget(0);  // unlimited
  Block y = a.allocate(5 * kMiB, kAct);
  EXPECT_EQ(a.stats().reserved_bytes[kStatAll].current, std::int64_t(28 * kMiB));
}

TEST(CachingAllocator, MaxSplitSizeKeepsOversizeBlocksWhole) {
  NullProvider null;
  AllocatorConfig c = checked();
  c.max_split_size = 64 * kMiB;
  CachingAllocator a(null, c);
  Block big = a.allocate(100 * kMiB, kAct);
  const std::uintptr_t big_addr = addr(big);
  big.reset();
  // A request below max_split_size never takes (and splits) an oversize block.
  Block mid = a.allocate(50 * kMiB, kAct);
  EXPECT_NE(addr(mid), big_addr);
  EXPECT_EQ(a.stats().num_device_alloc, 2);
  // An oversize request takes it only within kLargeBuffer (20 MiB) of its size...
  Block o70 = a.allocate(70 * kMiB, kAct);
  EXPECT_NE(addr(o70), big_addr);
  EXPECT_EQ(a.stats().num_device_alloc, 3);
  Block o90 = a.allocate(90 * kMiB, kAct);
  EXPECT_EQ(addr(o90), big_addr);
  // ...and then whole, not split.
  EXPECT_EQ(a.stats().allocated_bytes[kStatAll].current, std::int64_t((50 + 70 + 100) * kMiB));
  EXPECT_EQ(a.snapshot().segments.size(), 3u);

  // Without max_split_size the 100 MiB block serves the 50 MiB request and is split.
  CachingAllocator plain(null, checked());
  Block b2 = plain.allocate(100 * kMiB, kAct);
  const std::uintptr_t b2_addr = addr(b2);
  b2.reset();
  Block m2 = plain.allocate(50 * kMiB, kAct);
  EXPECT_EQ(addr(m2), b2_addr);
  EXPECT_EQ(plain.stats().inactive_split_bytes[kStatAll].current, std::int64_t(50 * kMiB));
}

TEST(CachingAllocator, GarbageCollectionReleasesOldestCachedSegments) {
  NullProvider null;
  auto run = [&](double threshold, std::vector<std::uintptr_t>* released) {
    AllocatorConfig c = checked();
    c.budget = 100 * kMiB;
    c.garbage_collection_threshold = threshold;
    c.release_before_growth = false;  // it would release both 30 MiB segments first
    CachingAllocator a(null, c);
    a.add_listener([&](const AllocatorEvent& e) {
      if (e.kind == EventKind::kSegmentFree) released->push_back(e.addr);
    });
    Block x = a.allocate(30 * kMiB, kAct);
    Block y = a.allocate(30 * kMiB, kAct);
    const std::uintptr_t x_addr = addr(x);
    x.reset();  // freed first: the oldest
    y.reset();
    Block z = a.allocate(40 * kMiB, kAct);  // no cached fit; reserved 60 MiB > 0.5 * 100 MiB
    if (threshold > 0) {
      EXPECT_EQ(released->size(), 1u);
      if (!released->empty()) EXPECT_EQ((*released)[0], x_addr);
    }
    return a.stats().reserved_bytes[kStatAll].current;
  };
  std::vector<std::uintptr_t> with_gc, without_gc;
  EXPECT_EQ(run(0.5, &with_gc), std::int64_t(70 * kMiB));
  EXPECT_EQ(run(0.0, &without_gc), std::int64_t(100 * kMiB));
  EXPECT_TRUE(without_gc.empty());
}

TEST(CachingAllocator, ResetPeakAndAccumulatedStats) {
  HostProvider host;
  CachingAllocator a(host, checked());
  { Block b = a.allocate(200 * 1024, kAct); }
  Block keep = a.allocate(10 * 1024, Category::kWorkspace);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocated_bytes[kStatAll].peak, 200 * 1024);
  a.reset_peak_stats();
  s = a.stats();
  EXPECT_EQ(s.allocated_bytes[kStatAll].peak, 10 * 1024);
  EXPECT_EQ(s.category_bytes[category_index(kAct)].peak, 0);
  EXPECT_EQ(s.reserved_bytes[kStatAll].peak, std::int64_t(kSmallBuffer));
  { Block b = a.allocate(20 * 1024, kAct); }
  EXPECT_EQ(a.stats().allocated_bytes[kStatAll].peak, 30 * 1024);

  a.reset_accumulated_stats();
  s = a.stats();
  EXPECT_EQ(s.allocated_bytes[kStatAll].allocated, 0);
  EXPECT_EQ(s.allocated_bytes[kStatAll].freed, 0);
  EXPECT_EQ(s.num_device_alloc, 0);
  EXPECT_EQ(s.allocated_bytes[kStatAll].current, 10 * 1024);  // current is not accumulated

  const auto m = s.as_map();
  EXPECT_EQ(m.at("allocated_bytes.all.current"), 10 * 1024);
  EXPECT_EQ(m.at("reserved_bytes.small_pool.current"), std::int64_t(kSmallBuffer));
  EXPECT_EQ(m.at("category_bytes.workspace.current"), 10 * 1024);
  EXPECT_EQ(m.count("num_alloc_retries") + m.count("num_ooms") + m.count("num_device_free"), 3u);
  EXPECT_EQ(m.count("inactive_split_bytes.large_pool.freed"), 1u);
}

TEST(CachingAllocator, BadInputIsRejectedAndChangesNothing) {
  HostProvider host;
  CachingAllocator a(host, checked());
  EXPECT_THROW(a.allocate(0, kAct), InvalidArgument);
  EXPECT_THROW(a.allocate_raw(kMaxAllocationSize + 1, kAct), InvalidArgument);
  EXPECT_THROW(a.allocate(~std::size_t{0}, kAct), InvalidArgument);

  void* p = a.allocate_raw(1000, kAct);
  const auto expect_invalid = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  int local = 0;
  char hex[32];
  std::snprintf(hex, sizeof hex, "%p", static_cast<void*>(&local));
  expect_invalid([&] { a.free(&local); }, hex);
  expect_invalid([&] { a.free(&local); }, "not allocated by this allocator");
  expect_invalid([&] { a.record_stream(&local, 1); }, hex);
  std::snprintf(hex, sizeof hex, "%p", static_cast<char*>(p) + 512);
  expect_invalid([&] { a.free(static_cast<char*>(p) + 512); }, hex);
  a.free(p);
  std::snprintf(hex, sizeof hex, "%p", p);
  expect_invalid([&] { a.free(p); }, "double free");
  expect_invalid([&] { a.free(p); }, hex);
  expect_invalid([&] { a.record_stream(p, 1); }, hex);
  a.free(nullptr);  // like std::free
  a.check_invariants();
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocation[kStatAll].current, 0);
  EXPECT_EQ(s.allocation[kStatAll].allocated, 1);

  Block empty;
  EXPECT_THROW(empty.record_stream(1), InvalidArgument);
  empty.reset();  // no-op
}

TEST(CachingAllocator, BlockOwnership) {
  HostProvider host;
  CachingAllocator a(host, checked());
  Block b = a.allocate(100, kAct);
  EXPECT_EQ(b.allocator(), &a);
  b.as<char>()[99] = 1;
  Block moved = std::move(b);
  EXPECT_FALSE(b);
  EXPECT_TRUE(moved);
  EXPECT_EQ(a.stats().allocation[kStatAll].current, 1);
  void* raw = moved.release();
  EXPECT_EQ(a.stats().allocation[kStatAll].current, 1);
  a.free(raw);
  EXPECT_EQ(a.stats().allocation[kStatAll].current, 0);
  Block c = a.allocate(100, kAct);
  Block d = a.allocate(100, kAct);
  c = std::move(d);  // frees c's old block
  EXPECT_EQ(a.stats().allocation[kStatAll].current, 1);
}

TEST(CachingAllocator, DestructorReturnsEverythingAndReportsLiveBlocks) {
  HostProvider host;
  FaultInjectingProvider counted(host);
  testing::internal::CaptureStderr();
  {
    CachingAllocator a(counted);
    a.allocate_raw(1000, kAct);
    a.allocate_raw(3 * kMiB, kAct);
    void* freed = a.allocate_raw(100, kAct);
    a.free(freed);
    EXPECT_EQ(counted.live_allocations(), 2);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("2 live block(s)"), std::string::npos) << err;
  EXPECT_NE(err.find(format_bytes(1024 + 3 * kMiB)), std::string::npos) << err;
  EXPECT_EQ(counted.live_allocations(), 0);

  testing::internal::CaptureStderr();
  {
    CachingAllocator a(counted);
    Block b = a.allocate(1000, kAct);
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

// cudaMalloc guarantees only 256-byte alignment: segments may start off a 512-byte boundary.
class Aligned256Provider final : public MemoryProvider {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = host_.allocate(bytes + 256);
    return p == nullptr ? nullptr : static_cast<char*>(p) + 256;
  }
  void deallocate(void* p, std::size_t bytes) override {
    host_.deallocate(static_cast<char*>(p) - 256, bytes + 256);
  }
  const char* name() const override { return "aligned256"; }
  MemoryKind kind() const override { return MemoryKind::kHost; }
  std::size_t alignment() const override { return 256; }

 private:
  HostProvider host_;
};

TEST(CachingAllocator, ProviderAlignedTo256Bytes) {
  Aligned256Provider provider;
  CachingAllocator a(provider, checked());
  std::vector<Block> blocks;
  for (std::size_t n : {std::size_t{1}, std::size_t{700}, 3 * kMiB, std::size_t{5000}}) {
    blocks.push_back(a.allocate(n, kAct));
    EXPECT_EQ(addr(blocks.back()) % 256, 0u);
    EXPECT_EQ(addr(blocks.back()) % 512, 256u);  // the segment base's offset is kept
    blocks.back().as<char>()[n - 1] = 1;
  }
  blocks.erase(blocks.begin() + 1);
  blocks.push_back(a.allocate(600, kAct));
  EXPECT_EQ(a.snapshot().segments.size(), 2u);
}

// fail_allocation(n): the nth allocation from now throws the budget path's OutOfMemory, whether
// a cached block would serve it (no provider call) or a new segment, persistent pool or not;
// nothing of the failed request changes the allocator; later requests succeed.
TEST(CachingAllocator, FailAllocationFailsTheNthRequestFromNowAndChangesNothing) {
  HostProvider host;
  FaultInjectingProvider counted(host);
  CachingAllocator a(counted, checked());
  {
    Block warm = a.allocate(4096, kAct);  // a segment now cached: the next 4 KiB is a cache hit
  }
  const AllocatorStats s0 = a.stats();
  const std::int64_t calls0 = counted.calls();
  a.fail_allocation(3);
  EXPECT_EQ(a.pending_fault(), 3);
  Block x = a.allocate(4096, kAct);                 // 1: from the cache
  Block g = a.allocate(8192, Category::kGradient);  // 2: a persistent pool's segment
  const AllocatorStats s1 = a.stats();
  const Snapshot snap1 = a.snapshot();
  try {
    (void)a.allocate_raw(4096, Category::kOptimizerState);  // 3: fails
    ADD_FAILURE() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("fail_allocation"), std::string::npos) << e.what();
    EXPECT_EQ(e.info().requested_bytes, 4096u);
  }
  EXPECT_EQ(a.pending_fault(), 0);
  a.check_invariants();
  const AllocatorStats s2 = a.stats();
  EXPECT_EQ(s2.num_ooms, s1.num_ooms + 1);
  EXPECT_EQ(s2.allocation[kStatAll].allocated, s1.allocation[kStatAll].allocated);
  EXPECT_EQ(s2.allocated_bytes[kStatAll].current, s1.allocated_bytes[kStatAll].current);
  EXPECT_EQ(s2.reserved_bytes[kStatAll].current, s1.reserved_bytes[kStatAll].current);
  EXPECT_EQ(a.snapshot().segments.size(), snap1.segments.size());
  EXPECT_EQ(counted.calls(), calls0 + 1);  // only the gradient's segment reached the provider
  Block y = a.allocate(4096, kAct);        // disarmed once fired
  EXPECT_EQ(a.stats().allocation[kStatAll].allocated, s0.allocation[kStatAll].allocated + 3);

  // 0 disarms before it fires; a negative count is refused and changes nothing.
  a.fail_allocation(1);
  a.fail_allocation(0);
  Block z = a.allocate(512, kAct);
  EXPECT_THROW(a.fail_allocation(-1), InvalidArgument);
  EXPECT_EQ(a.pending_fault(), 0);
  Block w = a.allocate(512, kAct);
  EXPECT_EQ(a.stats().num_ooms, s1.num_ooms + 1);
}

}  // namespace
}  // namespace memfit
