// CudaProvider, CudaStreamSync, PinnedHostProvider's cudaHostAlloc mode and MEMFIT_CUDA_CHECK.
//
// Tests that need a GPU start with MEMFIT_REQUIRE_GPU(), which skips with
// "no CUDA device: <the runtime's reason>". The CudaCheck and *WithoutDevice* tests need no
// GPU on purpose: error formatting and argument checking must work on CI machines too.
#include "memory/cuda/cuda_provider.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
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

#define MEMFIT_REQUIRE_GPU()                                            \
  do {                                                                  \
    std::string memfit_why_;                                            \
    if (::memfit::CudaProvider::cuda_device_count(&memfit_why_) == 0) { \
      GTEST_SKIP() << "no CUDA device: " << memfit_why_;                \
    }                                                                   \
  } while (0)

namespace memfit {
namespace {

cudaError_t returns(cudaError_t e) { return e; }

// Holds a stream's queue shut until open() (or the deadline, so a failing test cannot hang
// the suite): a host function enqueued with cudaLaunchHostFunc spins on it.
struct Gate {
  std::atomic<bool> is_open{false};
  void open() { is_open.store(true); }
  static void CUDART_CB wait(void* self) {
    auto* g = static_cast<Gate*>(self);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!g->is_open.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
};

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
  EXPECT_GE(free0 - free1, bytes);
  EXPECT_LE(free0 - free1, bytes + 2 * kMiB);
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
  std::printf("device 0: total %s, free %s, not free (context + others) %s\n",
              format_bytes(o.total_bytes).c_str(), format_bytes(o.free_bytes).c_str(),
              format_bytes(o.used_bytes).c_str());
  RecordProperty("context_overhead_bytes", std::to_string(o.overhead_bytes));
}

TEST(CudaStreamSync, EventCompletesOnlyAfterTheStreamsWorkAndIsPooled) {
  MEMFIT_REQUIRE_GPU();
  CudaStreamSync sync(0);
  cudaStream_t s = nullptr;
  MEMFIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Gate gate;
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

TEST(PinnedHostProviderOnGpu, UsesCudaHostAllocAndTheDriverKnowsThePages) {
  MEMFIT_REQUIRE_GPU();
  PinnedHostProvider pinned;
  ASSERT_EQ(pinned.mode(), PinnedHostProvider::Mode::kCudaHostAlloc);
  const std::size_t bytes = 8 * kMiB;
  auto* host = static_cast<unsigned char*>(pinned.allocate(bytes));
  ASSERT_NE(host, nullptr);
  EXPECT_TRUE(pinned.locked_last());
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
