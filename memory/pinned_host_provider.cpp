#include "memory/pinned_host_provider.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "memory/check.h"
#include "memory/error.h"

#ifdef MEMFIT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "memory/cuda/cuda_check.h"
#include "memory/cuda/cuda_provider.h"
#endif

namespace memfit {

namespace {

std::size_t os_page_size() {
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<std::size_t>(page) : 4096;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
constexpr bool kSanitizerBuild = true;
#else
constexpr bool kSanitizerBuild = false;
#endif
#else
constexpr bool kSanitizerBuild = false;
#endif

}  // namespace

bool PinnedHostProvider::mlock_available() { return !kSanitizerBuild; }

PinnedHostProvider::PinnedHostProvider() : page_size_(os_page_size()) {
#ifdef MEMFIT_HAVE_CUDA
  if (CudaProvider::cuda_device_count() > 0) mode_ = Mode::kCudaHostAlloc;
#endif
}

PinnedHostProvider::PinnedHostProvider(Mode mode) : mode_(mode), page_size_(os_page_size()) {
  if (mode != Mode::kCudaHostAlloc) return;
#ifdef MEMFIT_HAVE_CUDA
  std::string why;
  if (CudaProvider::cuda_device_count(&why) > 0) return;
  throw InvalidArgument("PinnedHostProvider: Mode::kCudaHostAlloc needs a usable CUDA device (" +
                        why + "); Mode::kMlock works everywhere");
#else
  throw InvalidArgument(
      "PinnedHostProvider: Mode::kCudaHostAlloc needs a CUDA build (this build has "
      "MEMFIT_CUDA off); Mode::kMlock works everywhere");
#endif
}

void* PinnedHostProvider::allocate(std::size_t bytes) {
  MEMFIT_CHECK(bytes > 0) << "the caching allocator never asks a provider for 0 bytes";
  void* ptr = nullptr;
#ifdef MEMFIT_HAVE_CUDA
  if (mode_ == Mode::kCudaHostAlloc) {
    const cudaError_t err = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky; keep it out of later error checks
      return nullptr;
    }
    if (err != cudaSuccess) {
      const std::string call = "cudaHostAlloc(" + std::to_string(bytes) + " bytes)";
      cuda::throw_cuda_error(err, call.c_str(), __FILE__, __LINE__);
    }
    allocations_.fetch_add(1, std::memory_order_relaxed);
    locked_last_.store(true, std::memory_order_relaxed);
    return ptr;
  }
#endif
  ptr = allocate_mlock(bytes);
  return ptr;
}

void* PinnedHostProvider::allocate_mlock(std::size_t bytes) {
  const std::size_t page = page_size_;
  if (bytes > SIZE_MAX - (page - 1)) return nullptr;
  const std::size_t length = (bytes + page - 1) / page * page;
  void* ptr = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ptr == MAP_FAILED) return nullptr;
  allocations_.fetch_add(1, std::memory_order_relaxed);
  const int rc = kSanitizerBuild ? -1 : mlock(ptr, length);
  if (rc == 0) {
    locked_last_.store(true, std::memory_order_relaxed);
  } else {
    // See the header: usable memory beats a false out-of-memory; the counters tell.
    last_errno_.store(kSanitizerBuild ? ENOTSUP : errno, std::memory_order_relaxed);
    unlocked_.fetch_add(1, std::memory_order_relaxed);
    locked_last_.store(false, std::memory_order_relaxed);
  }
  return ptr;
}

void PinnedHostProvider::deallocate(void* ptr, std::size_t bytes) {
  if (ptr == nullptr) return;
#ifdef MEMFIT_HAVE_CUDA
  if (mode_ == Mode::kCudaHostAlloc) {
    const cudaError_t err = cudaFreeHost(ptr);
    if (err == cudaErrorCudartUnloading) {
      // At exit, after the runtime began unloading: the memory goes with the process.
      (void)cudaGetLastError();
      return;
    }
    MEMFIT_CUDA_CHECK(err);
    return;
  }
#endif
  MEMFIT_CHECK(bytes > 0) << "deallocate needs the size given to allocate";
  const std::size_t length = (bytes + page_size_ - 1) / page_size_ * page_size_;
  // munmap also drops the lock, so there is no munlock to pair with the mlock.
  const int rc = munmap(ptr, length);
  MEMFIT_CHECK(rc == 0) << "munmap(" << ptr << ", " << length << ") failed, errno " << errno
                        << ": not a pointer/size pair from this provider";
}

}  // namespace memfit
