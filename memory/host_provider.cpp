#include "memory/host_provider.h"

#include <cstdlib>

#include "memory/check.h"

namespace memfit {

void* HostProvider::allocate(std::size_t bytes) {
  MEMFIT_CHECK(bytes > 0);
  const std::size_t a = alignment();
  if (bytes > SIZE_MAX - (a - 1)) return nullptr;
  return std::aligned_alloc(a, (bytes + a - 1) / a * a);
}

void HostProvider::deallocate(void* ptr, std::size_t) { std::free(ptr); }

}  // namespace memfit
