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
// Virtual memory, for expandable segments (optional; alloc_conf.h's expandable_segments):
//   void* base = p.reserve(1 << 30);          // address space only, nothing behind it
//   bool ok = p.map(base, 4 << 20);           // back its first two pages with memory
//   p.unmap(base, 4 << 20);                   // give that memory back, keep the addresses
//   p.release(base, 1 << 30);                 // give the addresses back (all unmapped)
// - page_size() is the granularity of map/unmap (2 MiB on CUDA and here); 0 means the
//   provider has no virtual memory and the other four are never called.
// - reserve(bytes) takes a multiple of page_size(); it returns an address aligned to at least
//   alignment(), or nullptr when the address space is not there. Reserving costs no memory.
// - map(addr, bytes) takes page multiples inside one reservation that are not mapped; false
//   when the memory is not there, in which case nothing of the range stays mapped. It never
//   throws for lack of memory (like allocate).
// - unmap(addr, bytes) takes mapped page multiples; release(base, bytes) a whole reservation
//   with nothing mapped, and its size.
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

  virtual std::size_t page_size() const { return 0; }
  virtual void* reserve(std::size_t /*bytes*/) { return nullptr; }
  virtual bool map(void* /*addr*/, std::size_t /*bytes*/) { return false; }
  virtual void unmap(void* /*addr*/, std::size_t /*bytes*/) {}
  virtual void release(void* /*base*/, std::size_t /*bytes*/) {}
};

}  // namespace memfit
