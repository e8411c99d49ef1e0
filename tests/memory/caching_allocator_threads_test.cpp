// CachingAllocator under concurrent use: allocation, free, record_stream, stats, snapshots,
// config and listeners from several threads at once. Run in the TSan build
// (-DMEMFIT_SANITIZE=thread) to check that every shared access is ordered by the mutex.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/host_provider.h"
#include "memory/size.h"

namespace memfit {
namespace {

constexpr Category kAct = Category::kActivation;

TEST(CachingAllocatorThreads, ManyThreads) {
  HostProvider host;
  CachingAllocator a(host);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&a, t] {
      std::vector<Block> mine;
      for (int i = 0; i < 5000; ++i) {
        mine.push_back(a.allocate(std::size_t(1 + (i * 7919 + t) % 300000), kAct, StreamId(t % 2)));
        mine.back().as<unsigned char>()[0] = static_cast<unsigned char>(t);
        if (i % 3 == 2) {
          mine.erase(mine.begin() + (i % static_cast<int>(mine.size())));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  a.check_invariants();
  EXPECT_EQ(a.stats().allocation[kStatAll].current, 0);
  EXPECT_EQ(a.stats().allocation[kStatAll].allocated, 20000);
}

// Expandable segments under threads: ranges grow, and shrink in empty_cache called from one
// thread while the others allocate, write and free; every byte written is read back.
TEST(CachingAllocatorThreads, ExpandableSegmentsWithEmptyCacheDuringUse) {
  HostProvider host;
  AllocatorConfig config;
  config.expandable_segments = true;
  CachingAllocator a(host, config);
  std::vector<std::thread> threads;
  std::atomic<long> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&a, &bad, t] {
      std::vector<Block> mine;
      for (int i = 0; i < 3000; ++i) {
        const std::size_t n = std::size_t(1 + (i * 7919 + t * 104729) % (3 << 20));
        mine.push_back(a.allocate(n, kAct, StreamId(t % 2)));
        unsigned char* p = mine.back().as<unsigned char>();
        p[0] = p[n - 1] = static_cast<unsigned char>(t + 1);
        if (i % 3 == 2) {
          const std::size_t k = static_cast<std::size_t>(i) % mine.size();
          const unsigned char* q = mine[k].as<unsigned char>();
          if (q[0] != t + 1 || q[mine[k].size() - 1] != t + 1) ++bad;
          mine.erase(mine.begin() + static_cast<long>(k));
        }
        if (t == 0 && i % 250 == 0) a.empty_cache();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0) << "a block's bytes changed under its owner";
  a.check_invariants();
  EXPECT_EQ(a.stats().allocation[kStatAll].current, 0);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes[kStatAll].current, 0);
  EXPECT_GT(a.stats().num_device_free, 0) << "empty_cache never unmapped anything";
}

// Events complete on their third query, so frees after record_stream stay pending for a while
// and complete inside later calls from any thread. The allocator calls its StreamSync only
// under its lock, so this needs no lock of its own (TSan would say otherwise).
class LaggingSync final : public StreamSync {
 public:
  EventHandle record(StreamId) override {
    ++recorded_;
    return reinterpret_cast<EventHandle>(new int(0));
  }
  bool query(EventHandle e) override { return ++*reinterpret_cast<int*>(e) >= 3; }
  void synchronize(EventHandle e) override { *reinterpret_cast<int*>(e) = 3; }
  void release(EventHandle e) override {
    ++released_;
    delete reinterpret_cast<int*>(e);
  }
  long recorded_ = 0, released_ = 0;
};

// Counts what the listeners saw; only ever touched from inside listeners (under the lock) or
// after every thread has joined.
struct Tally {
  long allocs = 0, free_requested = 0, free_completed = 0, segment_allocs = 0, segment_frees = 0;
  void see(const AllocatorEvent& e) {
    switch (e.kind) {
      case EventKind::kAlloc:
        ++allocs;
        break;
      case EventKind::kFreeRequested:
        ++free_requested;
        break;
      case EventKind::kFreeCompleted:
        ++free_completed;
        break;
      case EventKind::kSegmentAlloc:
        ++segment_allocs;
        break;
      case EventKind::kSegmentFree:
        ++segment_frees;
        break;
      case EventKind::kOom:
        break;
    }
  }
};

TEST(CachingAllocatorThreads, StressWithStreamsStatsAndListeners) {
  HostProvider host;
  LaggingSync sync;
  AllocatorConfig config;
  config.debug_checks = false;  // checked once at the end: a per-op check would serialize all
  CachingAllocator a(host, config, &sync);
  Tally tally;
  a.add_listener([&tally](const AllocatorEvent& e) { tally.see(e); });

  constexpr int kThreads = 4;
  constexpr int kOps = 3000;
  std::atomic<long> allocated{0}, freed{0}, transient_listener_events{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::uint64_t rng = 0x9E3779B97F4A7C15ull * std::uint64_t(t + 1);
      const auto next = [&rng] {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
      };
      std::vector<Block> mine;
      for (int i = 0; i < kOps; ++i) {
        const std::uint64_t r = next();
        switch (r % 8) {
          case 0:
          case 1:
          case 2: {  // small, large and persistent-pool blocks on three streams
            static constexpr Category kCats[] = {kAct, Category::kTemporary, Category::kGradient,
                                                 Category::kOptimizerState};
            const std::size_t bytes =
                (r >> 8) % 4 == 0 ? 1 + (r >> 16) % (6 * kMiB) : 1 + (r >> 16) % 200000;
            mine.push_back(a.allocate(bytes, kCats[(r >> 4) % 4], StreamId(t % 3), "stress"));
            mine.back().as<unsigned char>()[bytes - 1] = static_cast<unsigned char>(t);
            ++allocated;
            break;
          }
          case 3:
          case 4:
            if (!mine.empty()) {
              Block& b = mine[(r >> 8) % mine.size()];
              b.record_stream(StreamId((r >> 16) % 3));  // its own stream now and then: no-op
            }
            [[fallthrough]];
          case 5:
            if (!mine.empty()) {
              const std::size_t k = (r >> 24) % mine.size();
              mine[k] = std::move(mine.back());
              mine.pop_back();
              ++freed;
            }
            break;
          case 6: {  // readers
            const AllocatorStats s = a.stats();
            EXPECT_GE(s.reserved_bytes[kStatAll].current, s.active_bytes[kStatAll].current);
            EXPECT_GE(s.active_bytes[kStatAll].current, s.allocated_bytes[kStatAll].current);
            if ((r >> 8) % 16 == 0) EXPECT_FALSE(a.snapshot().segments.empty() && !mine.empty());
            if ((r >> 8) % 16 == 1) a.set_budget(0);
            EXPECT_EQ(a.config().budget, 0u);
            break;
          }
          case 7:  // listeners come and go; caches are emptied under the others' feet
            if ((r >> 8) % 8 == 0) {
              const ListenerId id =
                  a.add_listener([&transient_listener_events](const AllocatorEvent&) {
                    transient_listener_events.fetch_add(1, std::memory_order_relaxed);
                  });
              Block x = a.allocate(4096, kAct, StreamId(t % 3));
              a.remove_listener(id);
              ++allocated;
              ++freed;
            } else if ((r >> 8) % 8 == 1) {
              a.empty_cache();
            }
            break;
        }
      }
      freed += static_cast<long>(mine.size());
    });
  }
  for (auto& th : threads) th.join();

  a.check_invariants();
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocation[kStatAll].current, 0);
  EXPECT_EQ(s.allocation[kStatAll].allocated, allocated.load());
  EXPECT_EQ(allocated.load(), freed.load());
  EXPECT_EQ(tally.allocs, allocated.load());
  EXPECT_EQ(tally.free_requested, freed.load());
  // Some frees wait on events; the rest of them completes on the next call.
  EXPECT_GT(sync.recorded_, 0);
  a.empty_cache();
  EXPECT_EQ(tally.free_completed, freed.load());
  EXPECT_EQ(sync.recorded_, sync.released_);
  EXPECT_EQ(tally.segment_allocs - tally.segment_frees, a.stats().segment[kStatAll].current);
  EXPECT_EQ(a.stats().segment[kStatAll].current, 0);
  EXPECT_GT(transient_listener_events.load(), 0);
  a.check_invariants();
}

}  // namespace
}  // namespace memfit
