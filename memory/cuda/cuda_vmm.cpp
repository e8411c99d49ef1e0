#include "memory/cuda/cuda_vmm.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

#include "memory/cuda/cuda_check.h"
#include "memory/error.h"

namespace memfit::cuda {

struct CudaVmm::Fns {
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemAddressReserve) address_reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
};

namespace {

// The driver ABI these entry points have had since CUDA 12.0 (cuMemCreate and friends are
// from 10.2 and unchanged since).
constexpr unsigned int kDriverApiVersion = 12000;

template <typename F>
bool load(const char* symbol, F* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &p, kDriverApiVersion, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  *fn = reinterpret_cast<F>(p);
  return true;
}

[[noreturn]] void fail(const CudaVmm::Fns& f, CUresult r, const std::string& call) {
  const char* name = nullptr;
  if (f.get_error_name == nullptr || f.get_error_name(r, &name) != CUDA_SUCCESS) name = nullptr;
  throw CudaError(call + " failed: " + (name != nullptr ? name : "CUresult ") +
                  (name != nullptr ? "" : std::to_string(static_cast<int>(r))));
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// The driver calls act on the current context: the device's primary one, made current (the
// caller's DeviceGuard) and created if it does not exist yet, the runtime's way.
void enter() { MEMFIT_CUDA_CHECK(cudaFree(nullptr)); }

}  // namespace

const CudaVmm* CudaVmm::get() {
  static Fns fns;
  static const CudaVmm* vmm = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    const bool ok = load("cuGetErrorName", &fns.get_error_name) &&
                    load("cuDeviceGet", &fns.device_get) &&
                    load("cuDeviceGetAttribute", &fns.device_get_attribute) &&
                    load("cuMemGetAllocationGranularity", &fns.granularity) &&
                    load("cuMemAddressReserve", &fns.address_reserve) &&
                    load("cuMemAddressFree", &fns.address_free) &&
                    load("cuMemCreate", &fns.create) && load("cuMemRelease", &fns.release) &&
                    load("cuMemMap", &fns.map) && load("cuMemUnmap", &fns.unmap) &&
                    load("cuMemSetAccess", &fns.set_access);
    static const CudaVmm loaded(&fns);
    if (ok) vmm = &loaded;
  });
  return vmm;
}

std::size_t CudaVmm::page_size(int device) const {
  DeviceGuard guard(device);
  enter();
  CUdevice dev = 0;
  if (const CUresult r = fns_->device_get(&dev, device); r != CUDA_SUCCESS) {
    fail(*fns_, r, "cuDeviceGet(" + std::to_string(device) + ")");
  }
  int supported = 0;
  const CUresult r = fns_->device_get_attribute(
      &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
  if (r != CUDA_SUCCESS) fail(*fns_, r, "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT)");
  if (supported == 0) return 0;
  const CUmemAllocationProp prop = device_prop(device);
  std::size_t granularity = 0;
  const CUresult g =
      fns_->granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (g != CUDA_SUCCESS) fail(*fns_, g, "cuMemGetAllocationGranularity");
  return granularity;
}

void* CudaVmm::reserve(std::size_t bytes, std::size_t alignment) const {
  enter();  // the caller's DeviceGuard chose the device
  CUdeviceptr ptr = 0;
  const CUresult r = fns_->address_reserve(&ptr, bytes, alignment, 0, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
  if (r != CUDA_SUCCESS) fail(*fns_, r, "cuMemAddressReserve(" + std::to_string(bytes) + ")");
  return reinterpret_cast<void*>(ptr);
}

bool CudaVmm::map(int device, void* addr, std::size_t bytes, std::size_t page) const {
  DeviceGuard guard(device);
  enter();
  const CUmemAllocationProp prop = device_prop(device);
  const auto base = reinterpret_cast<CUdeviceptr>(addr);
  std::size_t done = 0;
  const auto undo = [&] {
    for (std::size_t off = 0; off < done; off += page) (void)fns_->unmap(base + off, page);
  };
  for (; done < bytes; done += page) {
    CUmemGenericAllocationHandle h = 0;
    const CUresult c = fns_->create(&h, page, &prop, 0);
    if (c == CUDA_ERROR_OUT_OF_MEMORY) {
      undo();
      return false;
    }
    if (c != CUDA_SUCCESS) {
      undo();
      fail(*fns_, c, "cuMemCreate(" + std::to_string(page) + ")");
    }
    const CUresult m = fns_->map(base + done, page, 0, h, 0);
    // The mapping keeps the memory; the handle is not needed after it (cuMemRelease frees
    // the memory only once every mapping of it is gone).
    const CUresult rel = fns_->release(h);
    if (m != CUDA_SUCCESS || rel != CUDA_SUCCESS) {
      if (m == CUDA_SUCCESS) (void)fns_->unmap(base + done, page);
      undo();
      if (m == CUDA_ERROR_OUT_OF_MEMORY) return false;
      fail(*fns_, m != CUDA_SUCCESS ? m : rel, m != CUDA_SUCCESS ? "cuMemMap" : "cuMemRelease");
    }
  }
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult a = fns_->set_access(base, bytes, &access, 1);
  if (a != CUDA_SUCCESS) {
    undo();
    if (a == CUDA_ERROR_OUT_OF_MEMORY) return false;
    fail(*fns_, a, "cuMemSetAccess");
  }
  return true;
}

void CudaVmm::unmap(void* addr, std::size_t bytes, std::size_t page) const {
  // Kernels queued before the free may still read these pages.
  enter();
  MEMFIT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto base = reinterpret_cast<CUdeviceptr>(addr);
  for (std::size_t off = 0; off < bytes; off += page) {
    const CUresult r = fns_->unmap(base + off, page);
    if (r != CUDA_SUCCESS) fail(*fns_, r, "cuMemUnmap");
  }
}

void CudaVmm::release(void* base, std::size_t bytes) const {
  enter();
  const CUresult r = fns_->address_free(reinterpret_cast<CUdeviceptr>(base), bytes);
  if (r != CUDA_SUCCESS) fail(*fns_, r, "cuMemAddressFree");
}

}  // namespace memfit::cuda
