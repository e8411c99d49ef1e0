// The CachingAllocator on a real GPU: CudaProvider underneath, CudaStreamSync for events.
// Checks that what the allocator reports is what the driver sees, that running out of memory
// (under a budget, or on the device) is recoverable, and that a block used on another stream
// is not handed out again before that stream's work is done.
//
// Every test starts with MEMFIT_REQUIRE_GPU(): without a device it skips, printing
// "no CUDA device: <the runtime's reason>".
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/cuda_provider.h"
#include "memory/cuda/cuda_stream_sync.h"
#include "memory/error.h"
#include "memory/pinned_host_provider.h"
#include "memory/size.h"
#include "tests/gpu/gpu_testutil.h"

namespace memfit {
namespace {

// The driver maps device memory in 2 MiB pages, so a segment can cost up to one page more
// than its size in cudaMemGetInfo's view.
constexpr std::size_t kDriverGranule = 2 * kMiB;

std::size_t free_device_bytes() {
  std::size_t free = 0, total = 0;
  MEMFIT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

std::int64_t abs_diff(std::size_t a, std::size_t b) {
  return a > b ? static_cast<std::int64_t>(a - b) : static_cast<std::int64_t>(b - a);
}

std::uintptr_t addr_of(const Block& b) { return reinterpret_cast<std::uintptr_t>(b.data()); }

using testing::Gate;
using testing::GateOpener;
using testing::print_figure;

class AllocatorGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (CudaProvider::cuda_device_count(&why) == 0) return;
    // Context and the driver's own bookkeeping exist before anything is measured.
    CudaProvider warm(0);
    warm.deallocate(warm.allocate(kMiB), kMiB);
  }
};

TEST_F(AllocatorGpu, ReservedBytesMatchTheDriversFreeMemoryDrop) {
  MEMFIT_REQUIRE_GPU();
  CudaProvider gpu(0);
  CudaStreamSync sync(0);
  const std::size_t free0 = free_device_bytes();
  {
    CachingAllocator alloc(gpu, {}, &sync);
    // One block per segment shape: small pool, a large block under 10 MiB (20 MiB segment),
    // large blocks on and off a 2 MiB boundary.
    const std::vector<std::size_t> sizes = {1000, 5 * kMiB, 64 * kMiB, 100 * kMiB + 1};
    std::vector<Block> blocks;
    std::size_t rounded = 0;
    for (std::size_t n : sizes) {
      blocks.push_back(alloc.allocate(n, Category::kActivation));
      rounded += alloc.round_size(n);
    }
    const AllocatorStats s = alloc.stats();
    const auto reserved = static_cast<std::size_t>(s.reserved_bytes[kStatAll].current);
    const auto segments = static_cast<std::size_t>(s.segment[kStatAll].current);
    const std::size_t drop = free0 - free_device_bytes();
    print_figure("allocator reserved vs driver free-memory drop",
                 format_bytes(reserved) + " in " + std::to_string(segments) + " segments vs " +
                     format_bytes(drop));
    EXPECT_GE(reserved, rounded);
    EXPECT_EQ(s.allocated_bytes[kStatAll].current, static_cast<std::int64_t>(rounded));
    EXPECT_EQ(s.num_device_alloc, static_cast<std::int64_t>(segments));
    EXPECT_LE(abs_diff(drop, reserved), static_cast<std::int64_t>(segments * kDriverGranule));

    blocks.clear();  // back to the cache, not to the driver
    EXPECT_EQ(alloc.stats().reserved_bytes[kStatAll].current, static_cast<std::int64_t>(reserved));
    EXPECT_LE(abs_diff(free0 - free_device_bytes(), reserved),
              static_cast<std::int64_t>(segments * kDriverGranule));
    alloc.empty_cache();
    EXPECT_EQ(alloc.stats().reserved_bytes[kStatAll].current, 0);
  }
  EXPECT_LE(abs_diff(free0, free_device_bytes()), static_cast<std::int64_t>(kDriverGranule));
}

TEST_F(AllocatorGpu, OutOfMemoryUnderABudgetIsRecoverable) {
  MEMFIT_REQUIRE_GPU();
  CudaProvider gpu(0);
  CudaStreamSync sync(0);
  AllocatorConfig cfg;
  cfg.budget = 64 * kMiB;
  CachingAllocator alloc(gpu, cfg, &sync);
  const std::size_t free0 = free_device_bytes();
  Block a = alloc.allocate(40 * kMiB, Category::kParameter, kDefaultStream, "a");
  try {
    Block b = alloc.allocate(40 * kMiB, Category::kActivation, kDefaultStream, "b");
    FAIL() << "80 MiB fit under a 64 MiB budget";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.info().budget_bytes, 64 * kMiB);
    EXPECT_EQ(e.info().requested_bytes, 40 * kMiB);
    EXPECT_EQ(e.info().allocated_bytes, alloc.round_size(40 * kMiB));
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(alloc.stats().num_ooms, 1);
  // The failed request took nothing from the device, and smaller requests still work.
  const auto reserved = static_cast<std::size_t>(alloc.stats().reserved_bytes[kStatAll].current);
  EXPECT_LE(abs_diff(free0 - free_device_bytes(), reserved),
            static_cast<std::int64_t>(kDriverGranule));
  Block c = alloc.allocate(16 * kMiB, Category::kActivation, kDefaultStream, "c");
  ASSERT_TRUE(c);
  MEMFIT_CUDA_CHECK(cudaMemset(c.data(), 1, c.size()));
  MEMFIT_CUDA_CHECK(cudaMemset(a.data(), 2, a.size()));
  MEMFIT_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_F(AllocatorGpu, DeviceOutOfMemoryIsRecoverable) {
  MEMFIT_REQUIRE_GPU();
  CudaProvider gpu(0);
  CudaStreamSync sync(0);
  CachingAllocator alloc(gpu, {}, &sync);
  std::size_t free = 0, total = 0;
  MEMFIT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  EXPECT_THROW(alloc.allocate(2 * total, Category::kActivation), OutOfMemory);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "cudaErrorMemoryAllocation must be cleared";
  EXPECT_EQ(alloc.stats().num_ooms, 1);
  Block b = alloc.allocate(kMiB, Category::kActivation);
  ASSERT_TRUE(b);
  MEMFIT_CUDA_CHECK(cudaMemset(b.data(), 0, b.size()));
  MEMFIT_CUDA_CHECK(cudaDeviceSynchronize());
}

// Cached free memory is released to the driver when a request does not fit otherwise.
TEST_F(AllocatorGpu, CachedSegmentsAreReleasedToSatisfyADeviceOom) {
  MEMFIT_REQUIRE_GPU();
  CudaProvider gpu(0);
  CudaStreamSync sync(0);
  CachingAllocator alloc(gpu, {}, &sync);
  const std::size_t free = free_device_bytes();
  const std::size_t big = free / 10 * 4 / kRoundLarge * kRoundLarge;     // 40% of free
  const std::size_t bigger = free / 10 * 7 / kRoundLarge * kRoundLarge;  // 70%: both won't fit
  alloc.allocate(big, Category::kActivation).reset();                    // cached, not returned
  EXPECT_EQ(alloc.stats().reserved_bytes[kStatAll].current, static_cast<std::int64_t>(big));
  Block b = alloc.allocate(bigger, Category::kActivation);
  ASSERT_TRUE(b);
  const AllocatorStats s = alloc.stats();
  EXPECT_GE(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.reserved_bytes[kStatAll].current, static_cast<std::int64_t>(bigger));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(AllocatorGpu, BlockUsedOnAnotherStreamWaitsForThatStream) {
  MEMFIT_REQUIRE_GPU();
  CudaProvider gpu(0);
  CudaStreamSync sync(0);
  cudaStream_t s1 = nullptr, s2 = nullptr;
  MEMFIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  MEMFIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  {
    CachingAllocator alloc(gpu, {}, &sync);
    Gate gate;
    GateOpener opener{gate};
    std::uintptr_t addr_a = 0;
    int completed_a = 0;
    alloc.add_listener([&](const AllocatorEvent& e) {
      if (e.kind == EventKind::kFreeCompleted && e.addr == addr_a) ++completed_a;
    });
    const std::size_t n = 32 * kMiB;

    Block a = alloc.allocate(n, Category::kActivation, to_stream_id(s1), "a");
    addr_a = reinterpret_cast<std::uintptr_t>(a.data());
    // Work on s2 that uses a, held back by the gate: a's memory is busy until it runs.
    MEMFIT_CUDA_CHECK(cudaLaunchHostFunc(s2, &Gate::wait, &gate));
    MEMFIT_CUDA_CHECK(cudaMemsetAsync(a.data(), 0x11, n, s2));
    a.record_stream(to_stream_id(s2));
    a.reset();
    EXPECT_EQ(completed_a, 0) << "freed while s2 still uses it";
    EXPECT_GE(alloc.stats().active_bytes[kStatAll].current,
              static_cast<std::int64_t>(alloc.round_size(n)));

    Block b = alloc.allocate(n, Category::kActivation, to_stream_id(s1), "b");
    EXPECT_NE(reinterpret_cast<std::uintptr_t>(b.data()), addr_a)
        << "a's memory was reused while s2's memset on it had not run";
    EXPECT_EQ(completed_a, 0);

    gate.open();
    MEMFIT_CUDA_CHECK(cudaStreamSynchronize(s2));
    Block c = alloc.allocate(n, Category::kActivation, to_stream_id(s1), "c");
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(c.data()), addr_a)
        << "a's memory should be reusable once s2 is done";
    EXPECT_EQ(completed_a, 1);
    EXPECT_EQ(alloc.stats().segment[kStatAll].current, 2);
    EXPECT_LE(sync.created(), 2) << "events come from the pool";
  }
  MEMFIT_CUDA_CHECK(cudaStreamDestroy(s1));
  MEMFIT_CUDA_CHECK(cudaStreamDestroy(s2));
}

TEST_F(AllocatorGpu, PinnedHostCacheServesAsyncCopies) {
  MEMFIT_REQUIRE_GPU();
  PinnedHostProvider pinned;
  ASSERT_EQ(pinned.mode(), PinnedHostProvider::Mode::kCudaHostAlloc);
  CachingAllocator host_cache(pinned);
  CudaProvider gpu(0);
  CudaStreamSync sync(0);
  CachingAllocator dev_cache(gpu, {}, &sync);
  const std::size_t n = 4 * kMiB;
  Block h = host_cache.allocate(n, Category::kOptimizerState, kDefaultStream, "masters");
  Block d = dev_cache.allocate(n, Category::kParameter, kDefaultStream, "weights");
  cudaPointerAttributes attr{};
  MEMFIT_CUDA_CHECK(cudaPointerGetAttributes(&attr, h.data()));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  MEMFIT_CUDA_CHECK(cudaMemsetAsync(d.data(), 0x7E, n, nullptr));
  MEMFIT_CUDA_CHECK(cudaMemcpyAsync(h.data(), d.data(), n, cudaMemcpyDeviceToHost, nullptr));
  MEMFIT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  EXPECT_EQ(h.as<unsigned char>()[0], 0x7E);
  EXPECT_EQ(h.as<unsigned char>()[n - 1], 0x7E);
}

// Expandable segments on the device: CUDA VMM pages (cuMemCreate + cuMemMap), written and read
// by the device, counted in cudaMemGetInfo as the allocator counts them, unmapped by
// empty_cache, and mapped again after.
TEST_F(AllocatorGpu, ExpandableSegmentsMapDevicePagesAndGiveThemBack) {
  MEMFIT_REQUIRE_GPU();
  CudaProvider gpu(0);
  ASSERT_EQ(gpu.page_size(), kDriverGranule) << "the device's VMM granularity";
  CudaStreamSync sync(0);
  AllocatorConfig cfg;
  cfg.expandable_segments = true;
  cfg.debug_checks = true;
  const std::size_t free0 = free_device_bytes();
  {
    CachingAllocator alloc(gpu, cfg, &sync);
    std::vector<Block> blocks;
    for (std::size_t n : {3 * kMiB, 3 * kMiB, 100 * kKiB, 33 * kMiB}) {
      blocks.push_back(alloc.allocate(n, Category::kActivation));
      MEMFIT_CUDA_CHECK(cudaMemset(blocks.back().data(), 0x5A, n));
    }
    EXPECT_EQ(addr_of(blocks[1]), addr_of(blocks[0]) + 3 * kMiB) << "one range, side by side";
    std::vector<unsigned char> back(3 * kMiB);
    MEMFIT_CUDA_CHECK(cudaMemcpy(back.data(), blocks[1].data(), back.size(), cudaMemcpyDefault));
    EXPECT_EQ(back.front(), 0x5A);
    EXPECT_EQ(back.back(), 0x5A);
    const auto reserved = static_cast<std::size_t>(alloc.stats().reserved_bytes[kStatAll].current);
    const std::size_t drop = free0 - free_device_bytes();
    print_figure("expandable: reserved vs driver free-memory drop",
                 format_bytes(reserved) + " vs " + format_bytes(drop));
    EXPECT_EQ(reserved % kDriverGranule, 0u);
    EXPECT_LE(abs_diff(drop, reserved), static_cast<std::int64_t>(kDriverGranule));
    blocks.erase(blocks.begin());  // the first 3 MiB: one whole page inside it is free
    alloc.empty_cache();
    EXPECT_EQ(static_cast<std::size_t>(alloc.stats().reserved_bytes[kStatAll].current),
              reserved - kDriverGranule);
    Block again = alloc.allocate(2 * kMiB, Category::kActivation);  // maps that page again
    MEMFIT_CUDA_CHECK(cudaMemset(again.data(), 1, again.size()));
    MEMFIT_CUDA_CHECK(cudaDeviceSynchronize());
    again.reset();
    blocks.clear();
    alloc.empty_cache();
    EXPECT_EQ(alloc.stats().reserved_bytes[kStatAll].current, 0);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_LE(abs_diff(free0, free_device_bytes()), static_cast<std::int64_t>(kDriverGranule));
}

}  // namespace
}  // namespace memfit
