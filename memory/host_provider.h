// HostProvider: page-aligned host memory from the OS (aligned_alloc), and virtual memory for
// expandable segments: reserve = mmap(PROT_NONE, MAP_NORESERVE), map = a read-write anonymous
// mapping over those pages (MAP_FIXED inside our own reservation), unmap = PROT_NONE again
// (the kernel drops the pages), release = munmap. Pages are 2 MiB, the CUDA granularity, so
// that a CPU run makes exactly the choices of a dry run planned for a GPU.
//
//   HostProvider host;
//   CachingAllocator alloc(host);   // the CPU backend's "device" memory
//
// Thread-safe. Freshly allocated memory is not zeroed.
#pragma once

#include <cstddef>

#include "memory/provider.h"

namespace memfit {

class HostProvider final : public MemoryProvider {
 public:
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) override;
  const char* name() const override { return "host"; }
  MemoryKind kind() const override { return MemoryKind::kHost; }
  std::size_t page_size() const override { return std::size_t{2} << 20; }
  void* reserve(std::size_t bytes) override;
  bool map(void* addr, std::size_t bytes) override;
  void unmap(void* addr, std::size_t bytes) override;
  void release(void* base, std::size_t bytes) override;
};

}  // namespace memfit
