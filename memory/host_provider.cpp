#include "memory/host_provider.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "memory/check.h"

namespace memfit {

void* HostProvider::allocate(std::size_t bytes) {
  MEMFIT_CHECK(bytes > 0);
  const std::size_t a = alignment();
  if (bytes > SIZE_MAX - (a - 1)) return nullptr;
  return std::aligned_alloc(a, (bytes + a - 1) / a * a);
}

void HostProvider::deallocate(void* ptr, std::size_t) { std::free(ptr); }

void* HostProvider::reserve(std::size_t bytes) {
  MEMFIT_CHECK(bytes > 0 && bytes % page_size() == 0) << "reserve(" << bytes << ")";
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

bool HostProvider::map(void* addr, std::size_t bytes) {
  MEMFIT_CHECK(bytes > 0 && bytes % page_size() == 0) << "map(" << bytes << ")";
  // MAP_FIXED replaces the PROT_NONE pages of our own reservation, nothing else.
  void* p = ::mmap(addr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                   -1, 0);
  if (p == MAP_FAILED) {
    MEMFIT_CHECK(errno == ENOMEM || errno == EAGAIN)
        << "mmap(MAP_FIXED) of a reserved range failed: " << std::strerror(errno);
    return false;  // the reservation is unchanged
  }
  MEMFIT_CHECK(p == addr);
  return true;
}

void HostProvider::unmap(void* addr, std::size_t bytes) {
  // A fresh PROT_NONE mapping over the range frees its pages and keeps the addresses ours.
  void* p = ::mmap(addr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                   -1, 0);
  MEMFIT_CHECK(p == addr) << "unmap: mmap(PROT_NONE) failed: " << std::strerror(errno);
}

void HostProvider::release(void* base, std::size_t bytes) {
  MEMFIT_CHECK(::munmap(base, bytes) == 0) << "munmap failed: " << std::strerror(errno);
}

}  // namespace memfit
