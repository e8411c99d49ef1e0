// PinnedHostProvider: page-locked host memory, for staging buffers and offloaded FP32 masters
// that the GPU copies to and from asynchronously. Same API in every build.
//
//   PinnedHostProvider pinned;
//   CachingAllocator host_cache(pinned);     // offload buffers, cached like device memory
//   void* p = pinned.allocate(64 << 20);
//   if (!pinned.locked_last()) { /* memory is usable but may be paged out; see below */ }
//   pinned.deallocate(p, 64 << 20);
//
// How the memory is pinned, decided once at construction (mode()):
// - kCudaHostAlloc: CUDA builds where cudaGetDeviceCount() > 0. cudaHostAlloc with
//   cudaHostAllocDefault (what cudaMallocHost does): the driver pins the pages and knows them,
//   so cudaMemcpyAsync from/to them is truly asynchronous. Freed with cudaFreeHost.
// - kMlock: CPU-only builds, and CUDA builds with no usable device. Anonymous mmap (page
//   aligned, whole pages) locked with mlock, freed with munmap (which also unlocks).
//
// When mlock fails (an unprivileged process may lock only RLIMIT_MEMLOCK bytes, 64 KiB on
// older distributions and 8 MiB on this project's dev machine; `ulimit -l` shows it), the
// memory is still returned, not nullptr, and the failure is counted:
// locked_last() turns false, unlocked_allocations() grows, last_lock_errno() says why. Why
// not fail: without a GPU nothing DMAs from this memory, so locking only buys "never swapped",
// and returning nullptr would make the caching allocator report OutOfMemory on a machine
// with plenty of memory, which is the wrong diagnosis. Callers that need the guarantee (a
// benchmark of pinned copies) check the counters. In kCudaHostAlloc mode memory is always
// locked (a failure of cudaHostAlloc is a nullptr, as for any provider).
//
// Errors: allocate(0) is a caller bug (MEMFIT_CHECK, as for every provider); out of memory
// returns nullptr; a CUDA failure other than out-of-memory throws CudaError.
// Thread-safe. Freshly allocated memory is not guaranteed to be zeroed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "memory/provider.h"

namespace memfit {

class PinnedHostProvider final : public MemoryProvider {
 public:
  enum class Mode { kCudaHostAlloc, kMlock };
  static constexpr std::size_t kCudaAlignment = 256;

  // Picks kCudaHostAlloc when this is a CUDA build and a device is usable, else kMlock.
  PinnedHostProvider();
  // Forces a mode (tests of the mlock path on a GPU machine, a benchmark comparing both).
  // kCudaHostAlloc without a CUDA build or a usable device throws InvalidArgument.
  explicit PinnedHostProvider(Mode mode);

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) override;
  const char* name() const override { return "pinned_host"; }
  MemoryKind kind() const override { return MemoryKind::kPinnedHost; }
  // kMlock: the OS page size (mmap hands out whole pages). kCudaHostAlloc: 256 bytes, the
  // alignment the CUDA programming guide promises for every address its allocation routines
  // return; the pages cudaHostAlloc hands out are whole pages in practice, but that is not
  // documented, and the caching allocator treats a pointer below alignment() as a broken
  // invariant, so only the promise is reported.
  std::size_t alignment() const override {
    return mode_ == Mode::kCudaHostAlloc ? kCudaAlignment : page_size_;
  }

  Mode mode() const { return mode_; }
  // Whether the most recent successful allocate() (by any thread) returned locked memory.
  bool locked_last() const { return locked_last_.load(std::memory_order_relaxed); }
  // Successful allocations since construction, and how many of them are not locked.
  std::int64_t allocations() const { return allocations_.load(std::memory_order_relaxed); }
  std::int64_t unlocked_allocations() const { return unlocked_.load(std::memory_order_relaxed); }
  // errno of the most recent mlock failure (ENOMEM: over RLIMIT_MEMLOCK; EPERM: not
  // permitted; ENOTSUP: this build cannot lock, see below), 0 if none failed.
  int last_lock_errno() const { return last_errno_.load(std::memory_order_relaxed); }

  // False in sanitizer builds (ASan/TSan/MSan): their runtimes replace mlock with a no-op that
  // reports success, so the kMlock path there counts every allocation as unlocked (ENOTSUP)
  // instead of claiming a lock the kernel never made.
  static bool mlock_available();

 private:
  void* allocate_mlock(std::size_t bytes);

  Mode mode_ = Mode::kMlock;
  std::size_t page_size_ = 4096;
  std::atomic<bool> locked_last_{true};
  std::atomic<std::int64_t> allocations_{0};
  std::atomic<std::int64_t> unlocked_{0};
  std::atomic<int> last_errno_{0};
};

}  // namespace memfit
