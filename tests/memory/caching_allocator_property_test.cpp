// Randomized property test of CachingAllocator: >= 100,000 seeded operations (allocate, free,
// record_stream, event completion, empty_cache, reset_peak_stats) over two streams, with the
// allocator's whole-structure check after every operation (config.debug_checks) and a
// test-side model that asserts, independently of the allocator's own bookkeeping:
//   - the live set (address, requested size, category, tag, stream) equals the snapshot's
//     active_allocated blocks; no two blocks overlap; segments are covered exactly;
//   - stats equal sums recomputed from snapshot();
//   - a block freed after record_stream is never handed out again before its events complete
//     (the fake StreamSync completes events only when the test says so);
//   - reserved memory never exceeds the budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/check.h"
#include "memory/error.h"
#include "memory/fault_injecting_provider.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"
#include "memory/size.h"

namespace memfit {
namespace {

class TestSync final : public StreamSync {
 public:
  EventHandle record(StreamId) override {
    const EventHandle h = next_++;
    done_[h] = false;
    return h;
  }
  bool query(EventHandle e) override { return state(e); }
  void synchronize(EventHandle e) override {
    state(e);
    done_[e] = true;
  }
  void release(EventHandle e) override {
    EXPECT_TRUE(state(e)) << "event " << e << " released before it completed";
    done_.erase(e);
  }
  // Completes each outstanding event with probability 1/2.
  void complete_some(std::mt19937_64& rng) {
    for (auto& [h, d] : done_)
      if (rng() & 1) d = true;
  }
  // Released events completed (the allocator releases only completed ones).
  bool is_done(EventHandle e) const {
    auto it = done_.find(e);
    return it == done_.end() || it->second;
  }
  EventHandle next() const { return next_; }
  std::size_t outstanding() const { return done_.size(); }

 private:
  bool state(EventHandle e) {
    auto it = done_.find(e);
    if (it == done_.end()) {
      ADD_FAILURE() << "unknown or released event " << e;
      return true;
    }
    return it->second;
  }
  EventHandle next_ = 1;
  std::unordered_map<EventHandle, bool> done_;
};

struct LiveEntry {
  Block block;          // empty for raw allocations
  void* raw = nullptr;  // set for raw allocations
  std::size_t requested = 0;
  Category category = Category::kUnknown;
  std::string tag;
  StreamId stream = 0;
  bool used_elsewhere = false;  // record_stream with another stream: its free will wait
  std::uintptr_t addr() const {
    return reinterpret_cast<std::uintptr_t>(raw != nullptr ? raw : block.data());
  }
};

struct PendingRange {
  std::uintptr_t addr;
  std::size_t size;
  EventHandle first, last;  // the events recorded by its free, [first, last)
};

struct Counters {
  int allocs = 0, frees = 0, ooms = 0, pending_frees = 0, reuse_after_pending = 0;
  int empty_caches = 0, checks = 0;
  std::int64_t provider_failures = 0;  // injected (Scenario::fault_every)
};

std::size_t random_size(std::mt19937_64& rng, std::size_t small_max, std::size_t large_max) {
  const auto pick = [&](std::size_t lo, std::size_t hi) {
    return lo + static_cast<std::size_t>(rng() % (hi - lo + 1));
  };
  const int r = static_cast<int>(rng() % 100);
  if (r < 45) return pick(1, 64 * 1024);
  if (r < 60) return pick(64 * 1024, small_max);
  if (r < 85) return pick(kSmallSize + 1, std::min<std::size_t>(10 * kMiB, large_max));
  return pick(10 * kMiB, large_max);
}

// Compares the snapshot with the model and with the stats.
void verify(const CachingAllocator& a, const std::vector<LiveEntry>& live,
            const std::vector<PendingRange>& pending, const TestSync& sync) {
  const Snapshot snap = a.snapshot();
  const AllocatorStats st = a.stats();
  AllocatorStats want;
  std::map<std::uintptr_t, const BlockInfo*> allocated;
  std::map<std::uintptr_t, const BlockInfo*> all_blocks;
  std::map<std::uintptr_t, StreamId> block_stream;
  std::uintptr_t prev_end = 0;
  for (const SegmentInfo& seg : snap.segments) {
    ASSERT_GE(seg.address, prev_end) << "segments out of order or overlapping";
    prev_end = seg.address + seg.total_size;
    const int type = seg.is_large ? kStatLargePool : kStatSmallPool;
    std::uintptr_t at = seg.address;
    for (const BlockInfo& b : seg.blocks) {
      ASSERT_EQ(b.address, at) << "blocks do not tile the segment";
      at += b.size;
      all_blocks[b.address] = &b;
      block_stream[b.address] = seg.stream;
      const auto n = static_cast<std::int64_t>(b.size);
      for (int t : {int{kStatAll}, type}) {
        if (b.state == BlockState::kActiveAllocated) {
          want.allocation[t].current += 1;
          want.allocated_bytes[t].current += n;
          want.requested_bytes[t].current += static_cast<std::int64_t>(b.requested_size);
        }
        if (b.state != BlockState::kInactive) {
          want.active[t].current += 1;
          want.active_bytes[t].current += n;
        } else if (seg.blocks.size() > 1) {
          want.inactive_split[t].current += 1;
          want.inactive_split_bytes[t].current += n;
        }
      }
      if (b.state == BlockState::kInactive) {
        EXPECT_EQ(b.requested_size, 0u);
        EXPECT_EQ(b.category, Category::kUnknown);
        EXPECT_EQ(b.tag, "");
      }
      if (b.state == BlockState::kActiveAllocated) {
        allocated[b.address] = &b;
        want.category_bytes[category_index(b.category)].current += n;
      }
    }
    ASSERT_EQ(at, seg.address + seg.total_size) << "blocks do not cover the segment";
    for (int t : {int{kStatAll}, type}) {
      want.segment[t].current += 1;
      want.reserved_bytes[t].current += static_cast<std::int64_t>(seg.total_size);
    }
  }
  // The live set.
  ASSERT_EQ(allocated.size(), live.size());
  for (const LiveEntry& e : live) {
    auto it = allocated.find(e.addr());
    ASSERT_NE(it, allocated.end()) << "live block missing from the snapshot";
    EXPECT_EQ(it->second->requested_size, e.requested);
    EXPECT_GE(it->second->size, a.round_size(e.requested));
    EXPECT_EQ(it->second->category, e.category);
    EXPECT_EQ(it->second->tag, e.tag);
    EXPECT_EQ(block_stream[e.addr()], e.stream);
  }
  // Freed blocks whose events have not all completed are still pending, whole.
  for (const PendingRange& p : pending) {
    bool done = true;
    for (EventHandle h = p.first; h < p.last; ++h) done = done && sync.is_done(h);
    if (done) continue;
    auto it = all_blocks.find(p.addr);
    ASSERT_NE(it, all_blocks.end());
    EXPECT_EQ(it->second->state, BlockState::kActivePendingFree);
    EXPECT_EQ(it->second->size, p.size);
  }
  // Stats against the sums.
  const std::pair<const char*, std::pair<const StatArray*, const StatArray*>> arrays[] = {
      {"allocation", {&st.allocation, &want.allocation}},
      {"segment", {&st.segment, &want.segment}},
      {"active", {&st.active, &want.active}},
      {"inactive_split", {&st.inactive_split, &want.inactive_split}},
      {"allocated_bytes", {&st.allocated_bytes, &want.allocated_bytes}},
      {"reserved_bytes", {&st.reserved_bytes, &want.reserved_bytes}},
      {"active_bytes", {&st.active_bytes, &want.active_bytes}},
      {"inactive_split_bytes", {&st.inactive_split_bytes, &want.inactive_split_bytes}},
      {"requested_bytes", {&st.requested_bytes, &want.requested_bytes}},
  };
  for (const auto& [name, pair] : arrays) {
    for (int t = 0; t < kStatTypeCount; ++t) {
      ASSERT_EQ((*pair.first)[t].current, (*pair.second)[t].current) << name << "[" << t << "]";
      ASSERT_GE((*pair.first)[t].peak, (*pair.first)[t].current) << name;
      ASSERT_EQ((*pair.first)[t].allocated - (*pair.first)[t].freed, (*pair.first)[t].current)
          << name << " (accumulated stats never reset in this test)";
    }
  }
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    ASSERT_EQ(st.category_bytes[c].current, want.category_bytes[c].current) << c;
  }
  if (a.budget() != 0) {
    ASSERT_LE(static_cast<std::size_t>(st.reserved_bytes[kStatAll].current), a.budget());
  }
}

struct Scenario {
  const char* name;
  bool host;  // HostProvider (memory written and checked) or NullProvider
  int ops;
  std::size_t small_max, large_max;
  AllocatorConfig config;
  // > 0: the provider fails one of its next few calls (allocate or map) before about one op
  // in `fault_every`, so failures strike part way through growing a range, then the retry.
  int fault_every = 0;
};

Counters run(const Scenario& sc, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostProvider host;
  NullProvider null;
  MemoryProvider& inner = sc.host ? static_cast<MemoryProvider&>(host) : null;
  FaultInjectingProvider faulty(inner);
  MemoryProvider& provider = sc.fault_every > 0 ? static_cast<MemoryProvider&>(faulty) : inner;
  TestSync sync;
  Counters n;
  std::vector<LiveEntry> live;
  std::vector<PendingRange> pending;
  const char* kTags[] = {"", "embed", "block0.attn", "block1.mlp", "head"};
  {
    CachingAllocator a(provider, sc.config, &sync);
    const auto unsafe_overlap = [&](std::uintptr_t at, std::size_t size) {
      for (const PendingRange& p : pending) {
        bool done = true;
        for (EventHandle h = p.first; h < p.last; ++h) done = done && sync.is_done(h);
        if (!done && at < p.addr + p.size && p.addr < at + size) return true;
      }
      return false;
    };
    const auto drop_completed = [&] {
      std::erase_if(pending, [&](const PendingRange& p) {
        for (EventHandle h = p.first; h < p.last; ++h)
          if (!sync.is_done(h)) return false;
        return true;
      });
    };
    int op = 0;
    try {
    for (; op < sc.ops; ++op) {
      if (sc.fault_every > 0 && rng() % static_cast<unsigned>(sc.fault_every) == 0) {
        faulty.fail_call(1 + static_cast<std::int64_t>(rng() % 3));
      }
      const int r = static_cast<int>(rng() % 100);
      const bool want_alloc = live.size() < 40 || (live.size() < 160 && r < 45);
      if (want_alloc && r < 80) {
        LiveEntry e;
        e.requested = random_size(rng, sc.small_max, sc.large_max);
        e.category = static_cast<Category>(rng() % kCategoryCount);
        e.tag = kTags[rng() % 5];
        e.stream = rng() % 2;
        const std::int64_t ooms_before = a.stats().num_ooms;
        try {
          if (rng() & 1) {
            e.raw = a.allocate_raw(e.requested, e.category, e.stream, e.tag);
          } else {
            e.block = a.allocate(e.requested, e.category, e.stream, e.tag);
            EXPECT_EQ(e.block.size(), e.requested);
          }
        } catch (const OutOfMemory& oom) {
          ++n.ooms;
          EXPECT_EQ(a.stats().num_ooms, ooms_before + 1);
          EXPECT_EQ(oom.info().requested_bytes, e.requested);
          continue;
        }
        const std::size_t rounded = a.round_size(e.requested);
        EXPECT_FALSE(unsafe_overlap(e.addr(), rounded)) << "reused before its events completed";
        for (const PendingRange& p : pending)
          if (e.addr() == p.addr) ++n.reuse_after_pending;
        if (sc.host) {
          auto* bytes = reinterpret_cast<unsigned char*>(e.addr());
          std::memset(bytes, static_cast<int>(e.addr() >> 9),
                      std::min<std::size_t>(e.requested, 64));
          bytes[e.requested - 1] = static_cast<unsigned char>(e.requested);
        }
        live.push_back(std::move(e));
        ++n.allocs;
      } else if (r < 80 && !live.empty()) {
        const std::size_t i = rng() % live.size();
        LiveEntry& e = live[i];
        if (sc.host) {  // nobody else wrote into it
          auto* bytes = reinterpret_cast<unsigned char*>(e.addr());
          EXPECT_EQ(bytes[0], static_cast<unsigned char>(e.addr() >> 9));
          EXPECT_EQ(bytes[e.requested - 1], static_cast<unsigned char>(e.requested));
        }
        const EventHandle first = sync.next();
        const std::uintptr_t at = e.addr();
        std::size_t size = 0;
        if (e.used_elsewhere) {
          for (const SegmentInfo& s : a.snapshot().segments)
            for (const BlockInfo& b : s.blocks)
              if (b.address == at) size = b.size;
        }
        if (e.raw != nullptr) {
          a.free(e.raw);
        } else {
          e.block.reset();
        }
        EXPECT_EQ(sync.next() != first, e.used_elsewhere);
        if (sync.next() != first) {
          pending.push_back({at, size, first, sync.next()});
          ++n.pending_frees;
        }
        live[i] = std::move(live.back());
        live.pop_back();
        ++n.frees;
      } else if (r < 88 && !live.empty()) {
        LiveEntry& e = live[rng() % live.size()];
        const StreamId s = rng() % 2;
        e.used_elsewhere = e.used_elsewhere || s != e.stream;
        if (e.raw != nullptr) {
          a.record_stream(e.raw, s);
        } else {
          e.block.record_stream(s);
        }
      } else if (r < 98 || (r == 98 && rng() % 4 != 0)) {
        sync.complete_some(rng);
      } else if (r == 98) {
        a.empty_cache();
        EXPECT_EQ(sync.outstanding(), 0u);
        ++n.empty_caches;
      } else {
        a.reset_peak_stats();
        const AllocatorStats st = a.stats();
        EXPECT_EQ(st.allocated_bytes[kStatAll].peak, st.allocated_bytes[kStatAll].current);
      }
      EXPECT_EQ(a.stats().allocation[kStatAll].current, static_cast<std::int64_t>(live.size()));
      if (op % 16 == 0) {
        drop_completed();
        verify(a, live, pending, sync);
        ++n.checks;
        if (testing::Test::HasFatalFailure() || testing::Test::HasNonfatalFailure()) {
          ADD_FAILURE() << sc.name << ": stopped at op " << op << " (seed " << seed << ")";
          return n;
        }
      }
    }
    } catch (const CheckFailure& e) {
      // A broken invariant: report it, and let go of the blocks without freeing them (the
      // allocator is not trustworthy now) so that they do not outlive it.
      ADD_FAILURE() << sc.name << ": op " << op << " (seed " << seed << "): " << e.what();
      for (LiveEntry& e : live) (void)e.block.release();
      return n;
    }
    drop_completed();
    verify(a, live, pending, sync);
    const AllocatorStats st = a.stats();
    n.provider_failures = faulty.failures();
    std::printf(
        "%s: %d allocs, %d frees (%d pending), %d reuses after events, %d OOMs, "
        "%lld retries, %d empty_cache, %lld segments allocated, %d model checks\n",
        sc.name, n.allocs, n.frees, n.pending_frees, n.reuse_after_pending, n.ooms,
        static_cast<long long>(st.num_alloc_retries), n.empty_caches,
        static_cast<long long>(st.num_device_alloc), n.checks);
    for (LiveEntry& e : live)
      if (e.raw != nullptr) a.free(e.raw);
    live.clear();  // frees every Block
    a.empty_cache();
    EXPECT_EQ(a.stats().reserved_bytes[kStatAll].current, 0);
    EXPECT_EQ(sync.outstanding(), 0u);
  }
  return n;
}

TEST(CachingAllocatorProperty, DefaultConfigNullProvider) {
  Scenario sc{"default/null", false, 100000, kSmallSize, 48 * kMiB, {}};
  sc.config.debug_checks = true;
  sc.config.budget = 1536 * kMiB;  // tight enough for some OOMs and retries
  const Counters n = run(sc, 0x5eed0001);
  EXPECT_GT(n.allocs, 30000);
  EXPECT_GT(n.frees, 30000);
  EXPECT_GT(n.pending_frees, 1000);
  EXPECT_GT(n.reuse_after_pending, 10) << "cross-stream reuse after events never happened";
  EXPECT_GT(n.empty_caches, 100);
  RecordProperty("ooms", n.ooms);
}

TEST(CachingAllocatorProperty, TunedConfigNullProvider) {
  Scenario sc{"tuned/null", false, 40000, kSmallSize, 96 * kMiB, {}};
  sc.config.debug_checks = true;
  sc.config.budget = 1024 * kMiB;
  sc.config.max_split_size = 32 * kMiB;
  sc.config.roundup_power2_divisions = 4;
  sc.config.garbage_collection_threshold = 0.6;
  const Counters n = run(sc, 0x5eed0002);
  EXPECT_GT(n.allocs, 10000);
  EXPECT_GT(n.ooms, 0) << "the budget was never reached: the OOM path went untested";
}

TEST(CachingAllocatorProperty, PyTorchRulesNullProvider) {
  // memfit's two pool policies off: the allocator PyTorch's rules describe.
  Scenario sc{"pytorch_rules/null", false, 40000, kSmallSize, 48 * kMiB, {}};
  sc.config.debug_checks = true;
  sc.config.budget = 1536 * kMiB;
  sc.config.separate_persistent_pools = false;
  sc.config.release_before_growth = false;
  const Counters n = run(sc, 0x5eed0004);
  EXPECT_GT(n.allocs, 10000);
}

// Expandable segments: ranges grow page by page and shrink on empty_cache and on the retry
// after a failure; the budget makes mapping fail part way through growing a block.
TEST(CachingAllocatorProperty, ExpandableSegmentsNullProvider) {
  Scenario sc{"expandable/null", false, 100000, kSmallSize, 48 * kMiB, {}};
  sc.config.debug_checks = true;
  sc.config.expandable_segments = true;
  sc.config.budget = 1024 * kMiB;
  const Counters n = run(sc, 0x5eed0005);
  EXPECT_GT(n.allocs, 30000);
  EXPECT_GT(n.pending_frees, 1000);
  EXPECT_GT(n.empty_caches, 100);
  EXPECT_GT(n.ooms, 0) << "the budget was never reached: the OOM path went untested";
}

// Injected map failures: a grow that maps several page runs fails after some of them.
TEST(CachingAllocatorProperty, ExpandableSegmentsWithFailingMapsNullProvider) {
  Scenario sc{"expandable_faults/null", false, 100000, kSmallSize, 48 * kMiB, {}};
  sc.config.debug_checks = true;
  sc.config.expandable_segments = true;
  sc.config.budget = 1536 * kMiB;
  sc.fault_every = 40;
  const Counters n = run(sc, 0x5eed0008);
  EXPECT_GT(n.allocs, 30000);
  EXPECT_GT(n.provider_failures, 100) << "the injected failures never struck";
  EXPECT_GT(n.empty_caches, 100);
}

TEST(CachingAllocatorProperty, ExpandableSegmentsTunedNullProvider) {
  Scenario sc{"expandable_tuned/null", false, 40000, kSmallSize, 96 * kMiB, {}};
  sc.config.debug_checks = true;
  sc.config.expandable_segments = true;
  sc.config.budget = 768 * kMiB;
  sc.config.max_split_size = 32 * kMiB;
  sc.config.roundup_power2_divisions = 4;
  sc.config.garbage_collection_threshold = 0.6;
  sc.config.separate_persistent_pools = false;
  const Counters n = run(sc, 0x5eed0006);
  EXPECT_GT(n.allocs, 10000);
  EXPECT_GT(n.ooms, 0);
}

TEST(CachingAllocatorProperty, ExpandableSegmentsHostMemoryIsNeverShared) {
  Scenario sc{"expandable/host", true, 20000, 256 * 1024, 12 * kMiB, {}};
  sc.config.debug_checks = true;
  sc.config.expandable_segments = true;
  const Counters n = run(sc, 0x5eed0007);
  EXPECT_GT(n.allocs, 5000);
}

TEST(CachingAllocatorProperty, HostMemoryIsNeverShared) {
  Scenario sc{"host", true, 20000, 256 * 1024, 12 * kMiB, {}};
  sc.config.debug_checks = true;
  const Counters n = run(sc, 0x5eed0003);
  EXPECT_GT(n.allocs, 5000);
}

}  // namespace
}  // namespace memfit
