#include "memory/cuda/cuda_provider.h"

#include <cuda_runtime_api.h>

#include <string>

#include "memory/check.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/cuda_vmm.h"
#include "memory/error.h"

namespace memfit {
namespace {

void check_device(int device, const char* who) {
  std::string why;
  const int count = CudaProvider::cuda_device_count(&why);
  if (count == 0) {
    throw InvalidArgument(std::string(who) + ": device " + std::to_string(device) +
                          " requested but there is no usable CUDA device (" + why + ")");
  }
  if (device < 0 || device >= count) {
    throw InvalidArgument(std::string(who) + ": device " + std::to_string(device) +
                          " does not exist; valid devices are 0.." + std::to_string(count - 1));
  }
}

}  // namespace

CudaProvider::CudaProvider(int device) : device_(device) {
  check_device(device, "CudaProvider");
  if (const cuda::CudaVmm* vmm = cuda::CudaVmm::get()) page_ = vmm->page_size(device);
}

void* CudaProvider::reserve(std::size_t bytes) {
  MEMFIT_CHECK(page_ != 0 && bytes % page_ == 0) << "reserve(" << bytes << ")";
  cuda::DeviceGuard guard(device_);
  return cuda::CudaVmm::get()->reserve(bytes, page_);
}

bool CudaProvider::map(void* addr, std::size_t bytes) {
  MEMFIT_CHECK(page_ != 0 && bytes % page_ == 0) << "map(" << bytes << ")";
  return cuda::CudaVmm::get()->map(device_, addr, bytes, page_);
}

namespace {
// At exit, static destructors may run after the runtime began to unload: the driver returns
// the memory with the process (as deallocate() says), and throwing would only terminate.
bool runtime_unloading() {
  int current = 0;
  if (cudaGetDevice(&current) != cudaErrorCudartUnloading) return false;
  (void)cudaGetLastError();
  return true;
}
}  // namespace

void CudaProvider::unmap(void* addr, std::size_t bytes) {
  if (runtime_unloading()) return;
  cuda::DeviceGuard guard(device_);
  cuda::CudaVmm::get()->unmap(addr, bytes, page_);
}

void CudaProvider::release(void* base, std::size_t bytes) {
  if (runtime_unloading()) return;
  cuda::DeviceGuard guard(device_);
  cuda::CudaVmm::get()->release(base, bytes);
}

int CudaProvider::cuda_device_count(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // cudaErrorNoDevice, cudaErrorInsufficientDriver, ...: the runtime failed to initialise.
    // That state persists for the process, but the thread's last error is cleared so code
    // that checks cudaGetLastError later does not trip over this probe.
    (void)cudaGetLastError();
    if (why) *why = std::string(cudaGetErrorString(err)) + " (" + cudaGetErrorName(err) + ")";
    return 0;
  }
  if (count == 0 && why) *why = "cudaGetDeviceCount returned 0";
  return count;
}

void* CudaProvider::allocate(std::size_t bytes) {
  MEMFIT_CHECK(bytes > 0) << "the caching allocator never asks a provider for 0 bytes";
  cuda::DeviceGuard guard(device_);
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err == cudaErrorMemoryAllocation) {
    // Not a sticky error: the context stays usable. Clear it from the thread's last error,
    // as PyTorch's allocator does, so a later unrelated check does not report a stale OOM.
    (void)cudaGetLastError();
    return nullptr;
  }
  if (err != cudaSuccess) {
    const std::string call =
        "cudaMalloc(" + std::to_string(bytes) + " bytes) on device " + std::to_string(device_);
    cuda::throw_cuda_error(err, call.c_str(), __FILE__, __LINE__);
  }
  return ptr;
}

void CudaProvider::deallocate(void* ptr, std::size_t) {
  if (ptr == nullptr) return;
  int current = 0;
  const cudaError_t probe = cudaGetDevice(&current);
  if (probe == cudaErrorCudartUnloading) {
    // Static destructors at exit run after the runtime began to unload; the driver returns
    // the memory with the process, and throwing here would only turn exit into terminate().
    (void)cudaGetLastError();
    return;
  }
  MEMFIT_CUDA_CHECK(probe);
  cuda::DeviceGuard guard(device_);
  const cudaError_t err = cudaFree(ptr);
  if (err == cudaErrorCudartUnloading) {
    (void)cudaGetLastError();
    return;
  }
  MEMFIT_CUDA_CHECK(err);
}

ContextOverhead CudaProvider::measure_context_overhead(int device,
                                                       std::size_t known_allocated_bytes) {
  check_device(device, "CudaProvider::measure_context_overhead");
  cuda::DeviceGuard guard(device);
  // A runtime call that needs the context creates it; cudaFree(nullptr) is the customary
  // one that does nothing else (freeing a null pointer is a no-op).
  MEMFIT_CUDA_CHECK(cudaFree(nullptr));
  ContextOverhead o;
  o.device = device;
  MEMFIT_CUDA_CHECK(cudaMemGetInfo(&o.free_bytes, &o.total_bytes));
  o.used_bytes = o.total_bytes >= o.free_bytes ? o.total_bytes - o.free_bytes : 0;
  o.known_allocated_bytes = known_allocated_bytes;
  o.overhead_bytes =
      o.used_bytes >= known_allocated_bytes ? o.used_bytes - known_allocated_bytes : 0;
  return o;
}

}  // namespace memfit
