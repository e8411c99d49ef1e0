// Uses the installed headers and library the way a user would.
#include <cstdio>

#include "core/dtype.h"
#include "memory/caching_allocator.h"
#include "memory/host_provider.h"

int main() {
  memfit::HostProvider host;
  memfit::CachingAllocator alloc(host);
  {
    memfit::Block b = alloc.allocate(1000, memfit::Category::kActivation, memfit::kDefaultStream,
                                     "consumer");
    float* x = b.as<float>();
    x[0] = 1.5f;
    if (memfit::f16_to_f32(memfit::f32_to_f16(x[0])) != 1.5f) return 1;
  }
  const auto stats = alloc.stats();
  if (stats.allocated_bytes[memfit::kStatAll].peak != 1024) return 2;
  if (stats.allocated_bytes[memfit::kStatAll].current != 0) return 3;
  std::printf("memfit consumer ok\n");
  return 0;
}
