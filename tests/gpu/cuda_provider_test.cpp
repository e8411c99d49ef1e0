// CudaProvider, CudaStreamSync, PinnedHostProvider's cudaHostAlloc mode and MEMFIT_CUDA_CHECK.
//
// Tests that need a GPU start with MEMFIT_REQUIRE_GPU(), which skips with
// "no CUDA device: <the runtime's reason>". The message-format CudaCheck tests and the
// *WithoutDevice* tests need no GPU on purpose: error formatting and argument checking must
// work on CI machines too.
#include "memory/cuda/cuda_provider.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "memory/cuda/cuda_check.h"
#include "memory/cuda/cuda_stream_sync.h"
#include "memory/error.h"
#include "memory/pinned_host_provider.h"
#include "memory/size.h"
#include "tests/gpu/gpu_testutil.h"

namespace memfit {
namespace {

using testing::Gate;
using testing::GateOpener;
using testing::print_figure;

cudaError_t returns(cudaError_t e) { return e; }

// ---- no GPU needed -------------------------------------------------------------------------

TEST(CudaCheck, MessageNamesTheCallTheErrorAndThePlace) {
  int line = 0;
  try {
    line = __LINE__ + 1;
    MEMFIT_CUDA_CHECK(returns(cudaErrorInvalidValue));
    FAIL() << "no exception";
  } catch (const CudaError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("returns(cudaErrorInvalidValue) failed"), std::string::npos) << what;
    EXPECT_NE(what.find(std::string(cudaGetErrorName(cudaErrorInvalidValue))), std::string::npos)
        << what;
    EXPECT_NE(what.find(std::string(cudaGetErrorString(cudaErrorInvalidValue))), std::string::npos)
        << what;
    EXPECT_NE(what.find(std::string(__FILE__) + ":" + std::to_string(line)), std::string::npos)
        << what;
  }
}

TEST(CudaCheck, SuccessPassesAndTheCallRunsOnce) {
  int calls = 0;
  auto counted = [&] {
    ++calls;
    return cudaSuccess;
  };
  MEMFIT_CUDA_CHECK(counted());
  EXPECT_EQ(calls, 1);
}

TEST(CudaProviderWithoutDevice, DeviceCountNeverThrowsAndExplainsZero) {
  std::string why;
  int count = -1;
  ASSERT_NO_THROW(count = CudaProvider::cuda_device_count(&why));
  EXPECT_GE(count, 0);
  if (count == 0) {
    EXPECT_FALSE(why.empty());
    std::printf("cuda_device_count() = 0: %s\n", why.c_str());
  }
}

TEST(CudaProviderWithoutDevice, BadDeviceOrdinalsAreInvalidArguments) {
  const int count = CudaProvider::cuda_device_count();
  EXPECT_THROW((void)CudaProvider{-1}, InvalidArgument);
  EXPECT_THROW((void)CudaProvider{count}, InvalidArgument);
  EXPECT_THROW((void)CudaStreamSync{count}, InvalidArgument);
  try {
    CudaProvider p(count);
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(count == 0 ? "no usable CUDA device" : "valid devices are"),
              std::string::npos)
        << what;
  }
}

// ---- GPU -----------------------------------------------------------------------------------

TEST(CudaCheck, ARealFailureThrowsAndLeavesNoLastError) {
  MEMFIT_REQUIRE_GPU();
  const int count = CudaProvider::cuda_device_count();
  // cudaErrorInvalidDevice is not sticky: after the throw the thread's last error is clear,
  // so a later cudaGetLastError() check does not report this stale failure.
  EXPECT_THROW(MEMFIT_CUDA_CHECK(cudaSetDevice(count)), CudaError);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  int device = -1;
  MEMFIT_CUDA_CHECK(cudaGetDevice(&device));
  EXPECT_EQ(device, 0) << "a failed cudaSetDevice leaves the current device alone";
}

TEST(CudaProvider, AllocatesWritableAlignedDeviceMemory) {
  MEMFIT_REQUIRE_GPU();
  CudaProvider gpu(0);
  EXPECT_EQ(gpu.kind(), MemoryKind::kDevice);
  EXPECT_STREQ(gpu.name(), "cuda");
  for (std::size_t bytes : {std::size_t{1}, std::size_t{4097}, std::size_t{3} * kMiB}) {
    void* p = gpu.allocate(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % gpu.alignment(), 0u);
    cudaPointerAttributes attr{};
    MEMFIT_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
    EXPECT_EQ(attr.device, 0);
    MEMFIT_CUDA_CHECK(cudaMemset(p, 0x5A, bytes));
    std::vector<unsigned char> host(bytes, 0);
    MEMFIT_CUDA_CHECK(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(host.front(), 0x5A);
    EXPECT_EQ(host.back(), 0x5A);
    gpu.deallocate(p, bytes);
  }
}

TEST(CudaProvider, FreeMemoryDropsByWhatWasAllocated) {
  MEMFIT_REQUIRE_GPU();
  CudaProvider gpu(0);
  gpu.deallocate(gpu.allocate(kMiB), kMiB);  // context and allocator warm
  std::size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
  MEMFIT_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  const std::size_t bytes = 256 * kMiB;
  void* p = gpu.allocate(bytes);
  ASSERT_NE(p, nullptr);
  MEMFIT_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  gpu.deallocate(p, bytes);
  MEMFIT_CUDA_CHECK(cudaMemGetInfo(&free2, &total));
  // The driver maps device memory in 2 MiB pages; 256 MiB is a multiple of that.
  ASSERT_GE(free0, free1 + bytes);  // (unsigned: no subtraction that could wrap)
  EXPECT_LE(free0, free1 + bytes + 2 * kMiB);
  EXPECT_GE(free2 + 2 * kMiB, free0);
}

TEST(CudaProvider, OutOfMemoryIsNullAndLeavesNoStickyError) {
  MEMFIT_REQUIRE_GPU();
  CudaProvider gpu(0);
  std::size_t free = 0, total = 0;
  MEMFIT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  EXPECT_EQ(gpu.allocate(total * 2), nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  void* p = gpu.allocate(kMiB);  // the context is still usable
  ASSERT_NE(p, nullptr);
  gpu.deallocate(p, kMiB);
}

TEST(CudaProvider, ContextOverheadIsReportedHonestly) {
  MEMFIT_REQUIRE_GPU();
  const ContextOverhead o = CudaProvider::measure_context_overhead(0);
  EXPECT_GT(o.total_bytes, 0u);
  EXPECT_LE(o.free_bytes, o.total_bytes);
  EXPECT_EQ(o.used_bytes, o.total_bytes - o.free_bytes);
  EXPECT_EQ(o.overhead_bytes, o.used_bytes);
  const ContextOverhead all_known = CudaProvider::measure_context_overhead(0, o.total_bytes);
  EXPECT_EQ(all_known.overhead_bytes, 0u);
  print_figure("device 0 memory",
               "total " + format_bytes(o.total_bytes) + ", free " + format_bytes(o.free_bytes) +
                   ", not free (context + others) " + format_bytes(o.used_bytes));
  RecordProperty("context_overhead_bytes", std::to_string(o.overhead_bytes));
}

TEST(CudaStreamSync, EventCompletesOnlyAfterTheStreamsWorkAndIsPooled) {
  MEMFIT_REQUIRE_GPU();
  CudaStreamSync sync(0);
  cudaStream_t s = nullptr;
  MEMFIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Gate gate;
  GateOpener opener{gate};
  MEMFIT_CUDA_CHECK(cudaLaunchHostFunc(s, &Gate::wait, &gate));
  const EventHandle e = sync.record(to_stream_id(s));
  EXPECT_FALSE(sync.query(e)) << "the stream is held by the gate";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "cudaErrorNotReady must not linger";
  gate.open();
  sync.synchronize(e);
  EXPECT_TRUE(sync.query(e));
  sync.release(e);
  EXPECT_EQ(sync.created(), 1);
  EXPECT_EQ(sync.pooled(), 1u);
  for (int i = 0; i < 100; ++i) {  // steady state: the pooled event is reused
    const EventHandle r = sync.record(i % 2 ? to_stream_id(s) : kDefaultStream);
    sync.synchronize(r);
    sync.release(r);
  }
  EXPECT_EQ(sync.created(), 1);
  MEMFIT_CUDA_CHECK(cudaStreamDestroy(s));
}

TEST(CudaStreamSync, ThreadsShareThePoolSafely) {
  MEMFIT_REQUIRE_GPU();
  CudaStreamSync sync(0);
  constexpr int kThreads = 8, kRounds = 200;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      try {
        cudaStream_t s = nullptr;
        MEMFIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        for (int i = 0; i < kRounds; ++i) {
          const EventHandle e = sync.record(to_stream_id(s));
          (void)sync.query(e);
          sync.synchronize(e);
          if (!sync.query(e)) failures.fetch_add(1);
          sync.release(e);
        }
        MEMFIT_CUDA_CHECK(cudaStreamDestroy(s));
      } catch (const std::exception& ex) {
        std::printf("thread failed: %s\n", ex.what());
        failures.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  // At most one event per thread was ever outstanding, and every one came back to the pool.
  EXPECT_LE(sync.created(), kThreads);
  EXPECT_EQ(sync.pooled(), static_cast<std::size_t>(sync.created()));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(PinnedHostProviderOnGpu, UsesCudaHostAllocAndTheDriverKnowsThePages) {
  MEMFIT_REQUIRE_GPU();
  PinnedHostProvider pinned;
  ASSERT_EQ(pinned.mode(), PinnedHostProvider::Mode::kCudaHostAlloc);
  const std::size_t bytes = 8 * kMiB;
  auto* host = static_cast<unsigned char*>(pinned.allocate(bytes));
  ASSERT_NE(host, nullptr);
  EXPECT_TRUE(pinned.locked_last());
  const auto addr = reinterpret_cast<std::uintptr_t>(host);
  EXPECT_EQ(addr % pinned.alignment(), 0u);
  print_figure("cudaHostAlloc address alignment (observed)",
               std::to_string(addr & (~addr + 1)) +
                   " bytes (reported: " + std::to_string(pinned.alignment()) + ")");
  cudaPointerAttributes attr{};
  MEMFIT_CUDA_CHECK(cudaPointerGetAttributes(&attr, host));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost) << "pinned (registered) host memory";

  CudaProvider gpu(0);
  void* dev = gpu.allocate(bytes);
  ASSERT_NE(dev, nullptr);
  cudaStream_t s = nullptr;
  MEMFIT_CUDA_CHECK(cudaStreamCreate(&s));
  MEMFIT_CUDA_CHECK(cudaMemsetAsync(dev, 0x3C, bytes, s));
  MEMFIT_CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s));
  MEMFIT_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(host[0], 0x3C);
  EXPECT_EQ(host[bytes - 1], 0x3C);
  MEMFIT_CUDA_CHECK(cudaStreamDestroy(s));
  gpu.deallocate(dev, bytes);
  pinned.deallocate(host, bytes);

  // More than any host has: nullptr, and the runtime is left without a sticky error.
  EXPECT_EQ(pinned.allocate(std::size_t{1} << 50), nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace memfit
