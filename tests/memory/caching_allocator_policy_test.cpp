// memfit's departures from PyTorch's allocator rules (caching_allocator.h): separate pools for
// persistent categories and the release of unfit cached segments before reserved memory grows
// past its high-water mark; plus one clock reading per public call for events.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/null_provider.h"
#include "memory/size.h"

namespace memfit {
namespace {

constexpr Category kAct = Category::kActivation;
constexpr Category kGrad = Category::kGradient;

AllocatorConfig conf(bool separate, bool release) {
  AllocatorConfig c;
  c.debug_checks = true;
  c.separate_persistent_pools = separate;
  c.release_before_growth = release;
  return c;
}

std::uintptr_t addr(const Block& b) { return reinterpret_cast<std::uintptr_t>(b.data()); }
std::int64_t reserved(const CachingAllocator& a) {
  return a.stats().reserved_bytes[kStatAll].current;
}

// The segment that holds `p`, from a snapshot.
const SegmentInfo* segment_of(const Snapshot& s, std::uintptr_t p) {
  for (const SegmentInfo& seg : s.segments)
    if (seg.address <= p && p < seg.address + seg.total_size) return &seg;
  return nullptr;
}

TEST(AllocatorPolicy, PersistentCategoriesNeverShareASegmentWithTransientOnes) {
  for (bool separate : {false, true}) {
    SCOPED_TRACE(separate ? "separate pools" : "shared pools");
    NullProvider null;
    CachingAllocator a(null, conf(separate, false));
    Block logits = a.allocate(100 * kMiB, kAct, 0, "logits");
    const std::uintptr_t logits_at = addr(logits);
    logits.reset();  // a 100 MiB free segment, cached
    // 1-10 MiB requests: persistent ones share a 20 MiB segment of their own.
    Block grad = a.allocate(6 * kMiB, kGrad, 0, "w.grad");
    Block moment = a.allocate(6 * kMiB, Category::kOptimizerState, 0, "w.exp_avg");
    Block weight_copy = a.allocate(6 * kMiB, Category::kParameter, 0, "w.half");
    const Snapshot snap = a.snapshot();
    const SegmentInfo* big = segment_of(snap, logits_at);
    ASSERT_NE(big, nullptr);
    // Gradient and optimizer state stay out of the transient segment; parameters do not.
    EXPECT_EQ(segment_of(snap, addr(grad)) == big, !separate);
    EXPECT_EQ(segment_of(snap, addr(moment)), segment_of(snap, addr(grad)));
    EXPECT_EQ(segment_of(snap, addr(weight_copy)), big);
    EXPECT_EQ(a.stats().num_device_alloc, separate ? 2 : 1);
    // The persistent segment, now wholly free, serves persistent requests only, and the big
    // transient one transient requests only.
    grad.reset();
    moment.reset();
    Block act = a.allocate(15 * kMiB, kAct);
    EXPECT_EQ(segment_of(a.snapshot(), addr(act))->address, logits_at);
    Block grad2 = a.allocate(8 * kMiB, kGrad);
    EXPECT_EQ(segment_of(a.snapshot(), addr(grad2))->address == logits_at, !separate);
    EXPECT_EQ(a.stats().num_device_alloc, separate ? 2 : 1);
    a.check_invariants();
  }
}

TEST(AllocatorPolicy, SmallPersistentBlocksHaveTheirOwnSmallSegments) {
  NullProvider null;
  CachingAllocator a(null, conf(true, false));
  Block act = a.allocate(4096, kAct);
  Block bias_grad = a.allocate(3072, kGrad);
  const Snapshot snap = a.snapshot();
  EXPECT_NE(segment_of(snap, addr(act)), segment_of(snap, addr(bias_grad)));
  EXPECT_EQ(a.stats().segment[kStatSmallPool].current, 2);
}

TEST(AllocatorPolicy, ReleasesUnfitFreeSegmentsBeforeGrowingPastThePeak) {
  for (bool release : {false, true}) {
    SCOPED_TRACE(release ? "release on" : "release off");
    NullProvider null;
    CachingAllocator a(null, conf(true, release));
    std::vector<std::uintptr_t> released;
    a.add_listener([&](const AllocatorEvent& e) {
      if (e.kind == EventKind::kSegmentFree) released.push_back(e.addr);
    });
    Block x = a.allocate(30 * kMiB, kAct);
    Block y = a.allocate(40 * kMiB, kAct);
    const std::uintptr_t x_at = addr(x), y_at = addr(y);
    x.reset();  // idle longest
    y.reset();  // mark: 70 MiB
    // 50 MiB fits neither; a 50 MiB segment would make 120. Releasing x (30) leaves 90 > 70,
    // so y goes too.
    Block z = a.allocate(50 * kMiB, kAct);
    if (release) {
      EXPECT_EQ(released, (std::vector<std::uintptr_t>{x_at, y_at}));
      EXPECT_EQ(reserved(a), std::int64_t(50 * kMiB));
      EXPECT_EQ(a.stats().reserved_bytes[kStatAll].peak, std::int64_t(70 * kMiB));
    } else {
      EXPECT_TRUE(released.empty());
      EXPECT_EQ(reserved(a), std::int64_t(120 * kMiB));
    }
    EXPECT_EQ(a.stats().num_alloc_retries, 0);
    a.check_invariants();
  }
}

TEST(AllocatorPolicy, ReleasesOnlyAsMuchAsKeepsTheNewSegmentUnderTheMark) {
  NullProvider null;
  CachingAllocator a(null, conf(true, true));
  Block x = a.allocate(30 * kMiB, kAct);
  Block y = a.allocate(12 * kMiB, kAct);
  Block w = a.allocate(40 * kMiB, kAct);  // the mark: 82 MiB
  const std::uintptr_t y_at = addr(y);
  w.reset();
  a.empty_cache();  // reserved 42
  x.reset();        // idle longest
  y.reset();
  // 41 MiB: a 42 MiB segment would make 84 > 82. Returning x (30) suffices; y stays cached.
  Block big = a.allocate(41 * kMiB, kAct);
  EXPECT_EQ(reserved(a), std::int64_t(54 * kMiB));
  EXPECT_EQ(a.stats().num_device_free, 2);  // w (empty_cache), then x
  Block again = a.allocate(12 * kMiB, kAct);
  EXPECT_EQ(addr(again), y_at);
  a.check_invariants();
}

TEST(AllocatorPolicy, NoReleaseBelowTheMarkAndNoneForPersistentGrowth) {
  NullProvider null;
  CachingAllocator a(null, conf(true, true));
  {
    Block x = a.allocate(30 * kMiB, kAct);
    Block y = a.allocate(40 * kMiB, kAct);
  }
  a.empty_cache();  // reserved 0; the mark stays at 70
  { Block x = a.allocate(30 * kMiB, kAct); }
  Block z = a.allocate(36 * kMiB, kAct);  // 30 + 36 <= 70: the cached 30 stays
  EXPECT_EQ(reserved(a), std::int64_t(66 * kMiB));
  const std::int64_t frees = a.stats().num_device_free;
  // Persistent growth past the mark keeps the cached transient segment...
  Block g = a.allocate(40 * kMiB, kGrad);
  EXPECT_EQ(a.stats().num_device_free, frees);
  EXPECT_EQ(reserved(a), std::int64_t(106 * kMiB));
  // ...and transient growth does not take a cached persistent one.
  g.reset();
  Block t = a.allocate(50 * kMiB, kAct);  // 30 (transient, free) goes; 40 (persistent) stays
  EXPECT_EQ(a.stats().num_device_free, frees + 1);
  EXPECT_EQ(reserved(a), std::int64_t(126 * kMiB));
  a.check_invariants();
}

// The free cache (caching_allocator_impl.h): small blocks wait unmerged for a request of the
// same (pool, stream, size); debug checks run after every operation here.
TEST(AllocatorPolicy, FreeCacheServesRepeatsAndMergesOnMissFullAndEmptyCache) {
  NullProvider null;
  CachingAllocator a(null, conf(true, true));
  std::vector<Block> blocks;
  std::vector<std::uintptr_t> at;
  for (int i = 0; i < 10; ++i) {
    blocks.push_back(a.allocate(512 * std::size_t(i + 1), kAct));
    at.push_back(addr(blocks.back()));
  }
  Block tail = a.allocate(512, kAct);  // keeps the segment split after the others merge
  const auto inactive = [&] { return a.stats().inactive_split[kStatSmallPool].current; };
  EXPECT_EQ(inactive(), 1);  // the rest of the segment
  blocks[3].reset();         // 2048 bytes, cached
  blocks[4].reset();         // 2560, cached beside it, unmerged
  EXPECT_EQ(inactive(), 3);
  const Snapshot snap = a.snapshot();
  EXPECT_EQ(snap.segments[0].blocks[3].state, BlockState::kInactive);
  EXPECT_EQ(snap.segments[0].blocks[4].state, BlockState::kInactive);
  // A repeat of a cached size takes that block.
  Block same = a.allocate(2048, kAct);
  EXPECT_EQ(addr(same), at[3]);
  EXPECT_EQ(inactive(), 2);
  same.reset();
  blocks[5].reset();  // cached now: 2560, 2048, 3072, side by side
  EXPECT_EQ(inactive(), 4);
  // A miss merges them (7680 bytes) before best fit, which then finds that run first.
  Block miss = a.allocate(5632, kAct);
  EXPECT_EQ(addr(miss), at[3]);
  EXPECT_EQ(inactive(), 2);  // the 2048 bytes after it and the rest of the segment
  // A cached block serves its own stream only.
  blocks[1].reset();
  Block other_stream = a.allocate(1024, kAct, 1);
  EXPECT_NE(addr(other_stream), at[1]);
  EXPECT_EQ(a.stats().segment[kStatSmallPool].current, 2);
  // Nine frees overflow the list of eight (the oldest is merged); empty_cache merges the
  // rest and returns the segments that are wholly free.
  for (int i : {0, 2, 6, 7, 8, 9}) blocks[i].reset();
  miss.reset();
  tail.reset();
  other_stream.reset();
  EXPECT_EQ(a.stats().num_device_free, 0);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes[kStatAll].current, 0);
  EXPECT_EQ(inactive(), 0);
  EXPECT_EQ(a.stats().num_device_free, 2);
}

TEST(AllocatorPolicy, EventsOfOneCallShareOneClockReading) {
  NullProvider null;
  CachingAllocator a(null, conf(true, true));
  std::vector<AllocatorEvent> seen;
  a.add_listener([&](const AllocatorEvent& e) { seen.push_back(e); });
  Block x = a.allocate(3 * kMiB, kAct);  // segment_alloc + alloc
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].kind, EventKind::kSegmentAlloc);
  EXPECT_EQ(seen[0].time_ns, seen[1].time_ns);
  x.reset();  // free_requested + free_completed
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[2].time_ns, seen[3].time_ns);
  EXPECT_GE(seen[2].time_ns, seen[1].time_ns);
  a.empty_cache();  // segment_free
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_GE(seen[4].time_ns, seen[3].time_ns);
}

}  // namespace
}  // namespace memfit
