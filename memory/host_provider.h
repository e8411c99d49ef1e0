// HostProvider: page-aligned host memory from the OS (aligned_alloc).
//
//   HostProvider host;
//   CachingAllocator alloc(host);   // the CPU backend's "device" memory
//
// Thread-safe. Freshly allocated memory is not zeroed.
#pragma once

#include "memory/provider.h"

namespace memfit {

class HostProvider final : public MemoryProvider {
 public:
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) override;
  const char* name() const override { return "host"; }
  MemoryKind kind() const override { return MemoryKind::kHost; }
};

}  // namespace memfit
