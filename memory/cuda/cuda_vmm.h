// CUDA virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess,
// cuMemUnmap, cuMemRelease, cuMemAddressFree) for CudaProvider's expandable segments.
//
//   const CudaVmm* vmm = CudaVmm::get();            // nullptr: the driver lacks them
//   std::size_t page = vmm ? vmm->page_size(0) : 0; // the device's granularity (2 MiB)
//
// The driver API is reached through the runtime's cudaGetDriverEntryPointByVersion, so
// libmemfit does not link libcuda: a machine with the toolkit and no driver (CI) still loads
// it, as PyTorch loads its driver calls lazily for the same reason. Pages are mapped one
// handle each (cuMemUnmap cannot unmap part of a mapping; the allocator unmaps any page
// run), and each handle is released right after it is mapped: the memory lives until its
// page is unmapped. Errors other than out-of-memory throw CudaError naming the call. Every
// call acts on the current device's primary context (the caller makes the device current;
// CudaProvider does with a DeviceGuard), created if it does not exist yet.
// CUDA builds only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace memfit::cuda {

class CudaVmm {
 public:
  // Loaded once per process; nullptr when the driver has no VMM entry points.
  static const CudaVmm* get();

  // 0 when `device` does not support virtual memory management.
  std::size_t page_size(int device) const;
  // nullptr when the address space is not there.
  void* reserve(std::size_t bytes, std::size_t alignment) const;
  // Whole pages; false (nothing left mapped) when the device is out of memory.
  bool map(int device, void* addr, std::size_t bytes, std::size_t page) const;
  // Whole pages, each mapped by map(); waits for the device first (queued work may still
  // use them: cuMemUnmap does not order itself after it).
  void unmap(void* addr, std::size_t bytes, std::size_t page) const;
  void release(void* base, std::size_t bytes) const;

  struct Fns;  // the driver's entry points (cuda_vmm.cpp)
  explicit CudaVmm(const Fns* fns) : fns_(fns) {}

 private:
  const Fns* fns_;
};

}  // namespace memfit::cuda
