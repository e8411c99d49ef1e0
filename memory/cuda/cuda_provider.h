// CudaProvider: device memory from cudaMalloc/cudaFree on one CUDA device, for the caching
// allocator (the CUDA backend's MemoryProvider). CUDA builds only.
//
//   if (CudaProvider::cuda_device_count() == 0) { /* CPU backend */ }
//   CudaProvider gpu(/*device=*/0);
//   CudaStreamSync sync(0);
//   CachingAllocator alloc(gpu, alloc_conf_from_env(), &sync);
//
// Contract (memory/provider.h):
// - allocate() returns nullptr when the device is out of memory (cudaErrorMemoryAllocation);
//   that error does not corrupt the context, and the provider clears it from the runtime's
//   per-thread last error (cudaGetLastError) so later error checks do not see it. Any other
//   failure (a corrupted context, a bad device) throws CudaError: it is not something the
//   allocator's free-cache-and-retry path can fix.
// - Memory is aligned to 256 bytes: the CUDA programming guide guarantees that alignment for
//   every address the runtime's allocation routines return, and no more.
// - Each call makes `device` current for its duration and restores the caller's device, so
//   the provider is safe on any thread whatever that thread's current device is.
// - cudaFree synchronizes the device; this is why the caching allocator exists.
// - Virtual memory for expandable segments (memory/provider.h): CUDA VMM (cuda_vmm.h) in the
//   device's granularity (2 MiB on current GPUs); page_size() is 0 where the driver or the
//   device lacks it. unmap() waits for the device first.
// Thread-safe (the runtime's allocation calls are).
#pragma once

#include <cstddef>
#include <string>

#include "memory/provider.h"

namespace memfit {

// What cudaMemGetInfo says once a context exists. See measure_context_overhead().
struct ContextOverhead {
  int device = 0;
  std::size_t total_bytes = 0;            // device memory the context can see
  std::size_t free_bytes = 0;             // free according to the driver, now
  std::size_t used_bytes = 0;             // total - free
  std::size_t known_allocated_bytes = 0;  // what the caller said it holds (see below)
  std::size_t overhead_bytes = 0;         // used - known, 0 if negative
};

class CudaProvider final : public MemoryProvider {
 public:
  // Throws InvalidArgument when `device` is not in [0, cuda_device_count()), naming the count
  // and, when there is no device at all, the runtime's reason.
  explicit CudaProvider(int device = 0);

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) override;
  const char* name() const override { return "cuda"; }
  MemoryKind kind() const override { return MemoryKind::kDevice; }
  std::size_t alignment() const override { return 256; }
  std::size_t page_size() const override { return page_; }
  void* reserve(std::size_t bytes) override;
  bool map(void* addr, std::size_t bytes) override;
  void unmap(void* addr, std::size_t bytes) override;
  void release(void* base, std::size_t bytes) override;

  int device() const { return device_; }

  // Number of usable CUDA devices; 0 (never an exception) when there is no driver, no device,
  // or the driver is older than the runtime. When it returns 0 and `why` is given, *why is
  // set to the runtime's description ("no CUDA-capable device is detected", ...) or to
  // "cudaGetDeviceCount returned 0" when the call succeeded with no device.
  static int cuda_device_count(std::string* why = nullptr);

  // How much device memory is not free once the CUDA context of `device` exists.
  //
  // The honest figure a single process can get: the context's own cost cannot be measured as
  // "free before minus free after creating it", because cudaMemGetInfo needs a context, and a
  // process gets its primary context only once. So this creates the context if needed
  // (cudaFree(nullptr)), reads cudaMemGetInfo, and reports
  //   used_bytes     = total - free
  //   overhead_bytes = used_bytes - known_allocated_bytes
  // where `known_allocated_bytes` is what the caller knows it holds on the device (e.g. the
  // caching allocator's reserved_bytes). overhead_bytes therefore counts this process's
  // context, memory other libraries in this process allocated behind memfit's back, and
  // every other process on the GPU. On a dedicated GPU with nothing else running it is the
  // context's cost (an upper bound); the planner subtracts it from the budget either way,
  // because memory that is not free is not available, whoever holds it.
  static ContextOverhead measure_context_overhead(int device = 0,
                                                  std::size_t known_allocated_bytes = 0);

 private:
  const int device_;
  std::size_t page_ = 0;  // VMM granularity; 0: none
};

}  // namespace memfit
