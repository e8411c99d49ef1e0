// MemoryProvider: the narrow boundary between memfit and the OS or driver (LevelDB's `Env`,
// mimalloc's `prim.h`). The caching allocator asks a provider for whole segments and gives
// them back; nothing else in memfit talks to malloc/mmap/cudaMalloc directly.
//
//   HostProvider host;                       // page-aligned host memory
//   void* p = host.allocate(2 << 20);        // nullptr when the memory is not there
//   host.deallocate(p, 2 << 20);             // the size given to allocate
//
// Contract for every implementation:
// - allocate(bytes) returns memory aligned to at least alignment(), or nullptr when the
//   request cannot be met (out of memory, injected fault). It never throws for lack of
//   memory; the caching allocator turns nullptr into its retry-then-OutOfMemory path.
//   bytes == 0 is a caller bug (the allocator never asks for it).
// - deallocate(p, bytes) takes exactly a pointer this provider returned and its size.
// - Implementations are thread-safe unless their header says otherwise.
//
// Implementations: HostProvider, PinnedHostProvider, NullProvider, FaultInjectingProvider
// (memory/), CudaProvider (memory/cuda/, CUDA builds).
#pragma once

#include <cstddef>

namespace memfit {

// Where the memory lives, so reports and copies know what they are looking at.
enum class MemoryKind { kHost, kPinnedHost, kDevice, kNone /* NullProvider: addresses only */ };

class MemoryProvider {
 public:
  virtual ~MemoryProvider() = default;
  MemoryProvider() = default;
  MemoryProvider(const MemoryProvider&) = delete;
  MemoryProvider& operator=(const MemoryProvider&) = delete;

  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes) = 0;

  virtual const char* name() const = 0;          // "host", "pinned_host", "cuda", "null", ...
  virtual MemoryKind kind() const = 0;
  virtual std::size_t alignment() const { return 4096; }
};

}  // namespace memfit
