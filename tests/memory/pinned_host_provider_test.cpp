// PinnedHostProvider on the CPU: the mlock path in every build, plus whatever mode() the
// default constructor picks (kCudaHostAlloc on a GPU machine in a CUDA build).
#include "memory/pinned_host_provider.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "memory/check.h"
#include "memory/error.h"

namespace memfit {
namespace {

using Mode = PinnedHostProvider::Mode;

std::size_t os_page() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

// Bytes this process has locked, from the kernel's own accounting (/proc/self/status VmLck).
std::size_t locked_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  ADD_FAILURE() << "no VmLck line in /proc/self/status";
  return 0;
}

// Writes a pattern over every byte and reads it back.
bool roundtrip(void* p, std::size_t bytes, unsigned seed) {
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; ++i) b[i] = static_cast<unsigned char>(i * 31 + seed);
  for (std::size_t i = 0; i < bytes; ++i) {
    if (b[i] != static_cast<unsigned char>(i * 31 + seed)) return false;
  }
  return true;
}

TEST(PinnedHostProvider, DescribesItself) {
  PinnedHostProvider p;
  EXPECT_EQ(p.kind(), MemoryKind::kPinnedHost);
  EXPECT_STREQ(p.name(), "pinned_host");
  EXPECT_EQ(p.alignment(),
            p.mode() == Mode::kMlock ? os_page() : PinnedHostProvider::kCudaAlignment);
  EXPECT_EQ(PinnedHostProvider(Mode::kMlock).alignment(), os_page());
#ifndef MEMFIT_HAVE_CUDA
  EXPECT_EQ(p.mode(), Mode::kMlock) << "a CPU-only build has no cudaHostAlloc";
#endif
}

TEST(PinnedHostProvider, AllocatesAlignedWritableMemoryOfManySizes) {
  for (Mode mode : {Mode::kMlock, PinnedHostProvider().mode()}) {
    PinnedHostProvider p(mode);
    const std::size_t page = os_page();
    for (std::size_t bytes : {std::size_t{1}, page - 1, page, page + 1, std::size_t{3} << 20}) {
      void* ptr = p.allocate(bytes);
      ASSERT_NE(ptr, nullptr) << bytes << " bytes";
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ptr) % p.alignment(), 0u) << bytes << " bytes";
      EXPECT_TRUE(roundtrip(ptr, bytes, static_cast<unsigned>(bytes))) << bytes << " bytes";
      p.deallocate(ptr, bytes);
    }
    EXPECT_EQ(p.allocations(), 5);
    EXPECT_LE(p.unlocked_allocations(), p.allocations());
  }
}

TEST(PinnedHostProvider, DistinctLiveAllocationsDoNotOverlap) {
  PinnedHostProvider p(Mode::kMlock);
  const std::size_t bytes = 3 * os_page() + 17;
  void* a = p.allocate(bytes);
  void* b = p.allocate(bytes);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::memset(a, 0xAA, bytes);
  std::memset(b, 0x55, bytes);
  EXPECT_EQ(static_cast<unsigned char*>(a)[bytes - 1], 0xAA);
  EXPECT_EQ(static_cast<unsigned char*>(b)[0], 0x55);
  p.deallocate(a, bytes);
  p.deallocate(b, bytes);
}

TEST(PinnedHostProvider, ZeroBytesIsACallerBug) {
  PinnedHostProvider p;
  EXPECT_THROW(p.allocate(0), CheckFailure);
  PinnedHostProvider m(Mode::kMlock);
  EXPECT_THROW(m.allocate(0), CheckFailure);
  EXPECT_EQ(m.allocations(), 0);
}

// (cudaHostAlloc's answer to absurd sizes is checked in tests/gpu, on a GPU.)
TEST(PinnedHostProvider, ImpossibleSizesReturnNullNotThrow) {
  PinnedHostProvider p(Mode::kMlock);
  EXPECT_EQ(p.allocate(SIZE_MAX), nullptr);              // rounding to pages would overflow
  EXPECT_EQ(p.allocate(std::size_t{1} << 60), nullptr);  // beyond any address space
  EXPECT_EQ(p.allocations(), 0);
}

TEST(PinnedHostProvider, DeallocateOfNullIsANoOp) {
  PinnedHostProvider p(Mode::kMlock);
  p.deallocate(nullptr, 4096);
  SUCCEED();
}

// The kernel's VmLck counter grows by the allocation while it is live and drops after, or,
// when this process may not lock (no CAP_IPC_LOCK and RLIMIT_MEMLOCK exhausted), the
// provider says so and VmLck does not move.
TEST(PinnedHostProvider, MlockPathLocksPagesOrReportsWhyNot) {
  PinnedHostProvider p(Mode::kMlock);
  const std::size_t bytes = 4 * os_page();
  const std::size_t before = locked_bytes();
  void* ptr = p.allocate(bytes);
  ASSERT_NE(ptr, nullptr);
  const std::size_t during = locked_bytes();
  if (p.locked_last()) {
    EXPECT_EQ(p.unlocked_allocations(), 0);
    EXPECT_GE(during, before + bytes);
  } else {
    EXPECT_EQ(p.unlocked_allocations(), 1);
    if (PinnedHostProvider::mlock_available()) {
      EXPECT_TRUE(p.last_lock_errno() == ENOMEM || p.last_lock_errno() == EPERM ||
                  p.last_lock_errno() == EAGAIN)
          << "errno " << p.last_lock_errno();
    } else {
      EXPECT_EQ(p.last_lock_errno(), ENOTSUP);
    }
    EXPECT_EQ(during, before);
  }
  EXPECT_TRUE(roundtrip(ptr, bytes, 7));
  p.deallocate(ptr, bytes);
  EXPECT_EQ(locked_bytes(), before);
}

// Runs in a forked child (gtest death-test machinery): drop CAP_IPC_LOCK, shrink
// RLIMIT_MEMLOCK to one page, allocate more than that. The memory must still come back,
// usable, and be reported as unlocked. Exit code 0 = as specified.
[[noreturn]] void over_memlock_limit_child() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps[2] = {};
  if (syscall(SYS_capget, &hdr, caps) != 0) std::_Exit(10);
  caps[0].effective &= ~(1u << CAP_IPC_LOCK);
  if (syscall(SYS_capset, &hdr, caps) != 0) std::_Exit(11);
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0) std::_Exit(12);
  lim.rlim_cur = os_page();
  if (setrlimit(RLIMIT_MEMLOCK, &lim) != 0) std::_Exit(13);

  PinnedHostProvider p(Mode::kMlock);
  const std::size_t bytes = 16 * os_page();
  void* ptr = p.allocate(bytes);
  if (ptr == nullptr) std::_Exit(20);
  if (p.locked_last()) std::_Exit(21);
  if (p.unlocked_allocations() != 1 || p.allocations() != 1) std::_Exit(22);
  const int err = p.last_lock_errno();
  if (err != ENOMEM && err != EPERM && err != EAGAIN && err != ENOTSUP) std::_Exit(23);
  if (!roundtrip(ptr, bytes, 3)) std::_Exit(24);
  p.deallocate(ptr, bytes);
  // A single page fits under the limit: locked again, and the flag follows (a sanitizer
  // build never locks; see mlock_available()).
  void* small = p.allocate(1);
  if (small == nullptr) std::_Exit(25);
  if (PinnedHostProvider::mlock_available() &&
      (!p.locked_last() || p.unlocked_allocations() != 1)) {
    std::_Exit(26);
  }
  p.deallocate(small, 1);
  std::_Exit(0);
}

TEST(PinnedHostProviderDeathTest, OverMemlockLimitStillReturnsUsableMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(over_memlock_limit_child(), ::testing::ExitedWithCode(0), "");
}

TEST(PinnedHostProvider, ForcingCudaHostAllocWithoutADeviceIsAnError) {
#ifdef MEMFIT_HAVE_CUDA
  if (PinnedHostProvider().mode() == Mode::kCudaHostAlloc) {
    PinnedHostProvider p(Mode::kCudaHostAlloc);  // a device is here: must construct
    EXPECT_EQ(p.mode(), Mode::kCudaHostAlloc);
    return;
  }
#endif
  try {
    PinnedHostProvider p(Mode::kCudaHostAlloc);
    FAIL() << "constructed a cudaHostAlloc provider without a CUDA device";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("kMlock"), std::string::npos) << e.what();
  }
}

TEST(PinnedHostProvider, ConcurrentAllocationsAreCountedExactly) {
  PinnedHostProvider p(Mode::kMlock);
  constexpr int kThreads = 4;
  constexpr int kEach = 50;
  std::vector<std::thread> threads;
  std::vector<int> bad(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const std::size_t bytes = 1 + static_cast<std::size_t>((t * kEach + i) * 97 % 20000);
        void* ptr = p.allocate(bytes);
        if (ptr == nullptr || !roundtrip(ptr, bytes, static_cast<unsigned>(t))) ++bad[t];
        if (ptr) p.deallocate(ptr, bytes);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
  EXPECT_EQ(p.allocations(), kThreads * kEach);
}

}  // namespace
}  // namespace memfit
