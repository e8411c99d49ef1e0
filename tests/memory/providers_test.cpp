// HostProvider, NullProvider and FaultInjectingProvider against the MemoryProvider contract.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "memory/check.h"
#include "memory/fault_injecting_provider.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"
#include "memory/size.h"

namespace memfit {
namespace {

TEST(HostProvider, AlignedWritableMemory) {
  HostProvider host;
  EXPECT_EQ(host.kind(), MemoryKind::kHost);
  for (std::size_t n : {std::size_t{1}, std::size_t{4097}, 2 * kMiB + 3}) {
    void* p = host.allocate(n);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % host.alignment(), 0u);
    std::memset(p, 0xab, n);
    EXPECT_EQ(static_cast<unsigned char*>(p)[n - 1], 0xab);
    host.deallocate(p, n);
  }
}

TEST(HostProvider, AbsurdSizeIsNullNotCrash) {
  HostProvider host;
  EXPECT_EQ(host.allocate(SIZE_MAX - 10), nullptr);
  EXPECT_THROW(host.allocate(0), CheckFailure);
}

TEST(NullProvider, DistinctAlignedAddressesAndCounters) {
  NullProvider null;
  std::vector<std::pair<void*, std::size_t>> got;
  for (std::size_t n : {std::size_t{100}, kMiB, std::size_t{80} * kGiB, std::size_t{513}}) {
    void* p = null.allocate(n);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % null.alignment(), 0u);
    for (auto& [q, m] : got) {
      const auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(q);
      EXPECT_TRUE(a + n <= b || b + m <= a) << "ranges overlap";
    }
    got.emplace_back(p, n);
  }
  EXPECT_EQ(null.num_allocs(), 4);
  EXPECT_EQ(null.in_use(), 100 + kMiB + 80 * kGiB + 513);
  for (auto& [p, n] : got) null.deallocate(p, n);
  EXPECT_EQ(null.in_use(), 0u);
  EXPECT_EQ(null.peak_in_use(), 100 + kMiB + 80 * kGiB + 513);
  EXPECT_EQ(null.num_frees(), 4);
}

TEST(NullProvider, CapacityAndForeignFree) {
  NullProvider null(10 * kMiB);
  void* a = null.allocate(6 * kMiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(null.allocate(5 * kMiB), nullptr);  // would exceed the capacity
  void* b = null.allocate(4 * kMiB);
  ASSERT_NE(b, nullptr);
  EXPECT_THROW(null.deallocate(reinterpret_cast<void*>(0x1000), 64), CheckFailure);
  EXPECT_THROW(null.deallocate(a, 5 * kMiB), CheckFailure);  // wrong size
  null.deallocate(a, 6 * kMiB);
  null.deallocate(b, 4 * kMiB);
  EXPECT_EQ(null.in_use(), 0u);
}

TEST(FaultInjectingProvider, FailsNthCallOnce) {
  HostProvider host;
  FaultInjectingProvider faulty(host);
  faulty.fail_call(2);
  void* a = faulty.allocate(64);
  EXPECT_NE(a, nullptr);
  EXPECT_EQ(faulty.allocate(64), nullptr);
  void* c = faulty.allocate(64);
  EXPECT_NE(c, nullptr);
  EXPECT_EQ(faulty.failures(), 1);
  EXPECT_EQ(faulty.live_allocations(), 2);
  faulty.deallocate(a, 64);
  faulty.deallocate(c, 64);
  EXPECT_EQ(faulty.live_allocations(), 0);
  EXPECT_EQ(faulty.bytes_in_use(), 0u);
}

TEST(FaultInjectingProvider, ByteLimitAndFailAll) {
  NullProvider null;
  FaultInjectingProvider faulty(null);
  faulty.set_byte_limit(3 * kMiB);
  void* a = faulty.allocate(2 * kMiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(faulty.allocate(2 * kMiB), nullptr);
  void* b = faulty.allocate(kMiB);
  ASSERT_NE(b, nullptr);
  faulty.fail_every_call(true);
  EXPECT_EQ(faulty.allocate(1), nullptr);
  faulty.fail_every_call(false);
  faulty.deallocate(a, 2 * kMiB);
  faulty.deallocate(b, kMiB);
  EXPECT_EQ(faulty.failures(), 2);
  EXPECT_EQ(null.in_use(), 0u);
}

}  // namespace
}  // namespace memfit
