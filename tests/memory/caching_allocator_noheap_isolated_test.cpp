// The caching allocator's fast path makes no heap allocation once warm.
//
// This file replaces the global operator new/delete to count calls, which changes them for the
// whole process; that is why it is an *_isolated_test.cpp, built as its own binary
// (memfit_caching_allocator_noheap_isolated_test): in the module binary the replacement would
// hide new/delete mismatches from the sanitizers in every other memory test.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "memory/caching_allocator.h"
#include "memory/host_provider.h"
#include "memory/size.h"

// Counts heap allocations in this test binary (the replacement also serves libmemfit). Every
// unaligned form of new and delete is replaced, so that each pair meets the same malloc/free.
namespace {
std::atomic<long> g_operator_new_calls{0};
void* counted_new(std::size_t n) noexcept {
  g_operator_new_calls.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n != 0 ? n : 1);
}
}  // namespace
void* operator new(std::size_t n) {
  if (void* p = counted_new(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted_new(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_new(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace memfit {
namespace {

// One round of the patterns the fast path serves: a small block (split from and merged back
// into its 2 MiB segment), a large one on another stream, and a persistent-category block.
void one_round(CachingAllocator& a) {
  Block b = a.allocate(4096, Category::kActivation, 0, "layer3.mlp");
  void* p = a.allocate_raw(3 * kMiB, Category::kGradient, 1, "layer3.mlp.grad");
  Block w = a.allocate(5 * kMiB, Category::kParameter, 0, "layer3.mlp.w.half");
  a.free(p);
}

TEST(CachingAllocatorNoHeap, FastPathMakesNoHeapAllocation) {
  for (bool listener : {false, true}) {
    SCOPED_TRACE(listener ? "with a listener" : "without listeners");
    HostProvider host;
    CachingAllocator a(host);
    long events = 0;
    if (listener) a.add_listener([&events](const AllocatorEvent&) { ++events; });
    one_round(a);  // warm: segments, tags, tree nodes, spare block nodes exist now
    const std::int64_t segments = a.stats().num_device_alloc;
    const long before = g_operator_new_calls.load();
    for (int i = 0; i < 1000; ++i) one_round(a);
    EXPECT_EQ(g_operator_new_calls.load() - before, 0);
    EXPECT_EQ(a.stats().num_device_alloc, segments);
    if (listener) EXPECT_GT(events, 1000 * 6);
  }
  // The counter does see allocations made inside libmemfit.
  const long before = g_operator_new_calls.load();
  {
    HostProvider host;
    CachingAllocator other(host);
  }
  EXPECT_GT(g_operator_new_calls.load() - before, 0);
}

}  // namespace
}  // namespace memfit
