// The caching allocator from a user's side: categories and tags, a budget, what an
// out-of-memory error tells you, listening to events, and a snapshot.
//
//   build/examples/example_allocator_basics
#include <cstdio>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "memory/size.h"

using namespace memfit;

int main() {
  HostProvider host;
  AllocatorConfig config = alloc_conf_from_env();  // MEMFIT_ALLOC_CONF, if set
  config.budget = 64 * kMiB;
  CachingAllocator alloc(host, config);

  // Count segment traffic: in steady state a caching allocator makes no provider calls.
  int segment_allocs = 0;
  const ListenerId id = alloc.add_listener([&](const AllocatorEvent& e) {
    if (e.kind == EventKind::kSegmentAlloc) ++segment_allocs;
  });

  // Parameters live for the whole run; activations come and go every step.
  Block weights = alloc.allocate(8 * kMiB, Category::kParameter, kDefaultStream, "fc.weight");
  for (int step = 0; step < 3; ++step) {
    std::vector<Block> saved;
    for (int layer = 0; layer < 4; ++layer) {
      saved.push_back(alloc.allocate(6 * kMiB, Category::kActivation, kDefaultStream, "layer"));
    }
    std::printf("step %d: segment allocations so far %d\n", step, segment_allocs);
  }  // activations freed here, cached for the next step

  // Ask for more than the budget allows: the error says what was asked, what is held, and
  // which categories hold it. The allocator stays usable afterwards.
  try {
    Block too_big = alloc.allocate(100 * kMiB, Category::kActivation, kDefaultStream, "huge");
  } catch (const OutOfMemory& e) {
    std::printf("\nOutOfMemory, as a user sees it:\n  %s\n", e.what());
    std::printf("  (largest free block %s)\n\n", format_bytes(e.info().largest_free_block).c_str());
  }
  Block after = alloc.allocate(kMiB, Category::kTemporary);

  const AllocatorStats s = alloc.stats();
  std::printf("allocated now %s, peak %s; reserved %s; parameter peak %s\n",
              format_bytes(s.allocated_bytes[kStatAll].current).c_str(),
              format_bytes(s.allocated_bytes[kStatAll].peak).c_str(),
              format_bytes(s.reserved_bytes[kStatAll].current).c_str(),
              format_bytes(s.category_bytes[category_index(Category::kParameter)].peak).c_str());

  const Snapshot snap = alloc.snapshot();
  for (const SegmentInfo& seg : snap.segments) {
    std::printf("segment %s (%s pool):", format_bytes(seg.total_size).c_str(),
                seg.is_large ? "large" : "small");
    for (const BlockInfo& b : seg.blocks) {
      std::printf(" [%s %s%s%s]", format_bytes(b.size).c_str(), block_state_name(b.state),
                  b.tag.empty() ? "" : " ", b.tag.c_str());
    }
    std::printf("\n");
  }
  alloc.remove_listener(id);
  return 0;
}
