// The caching allocator giving segments back to its provider: one segment, every wholly free
// one (empty_cache, the retry after a failure), the oldest beyond a threshold (garbage
// collection) and the unfit ones before growth (release_before_growth). The caller holds the
// allocator's mutex.
#include <algorithm>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/caching_allocator_impl.h"
#include "memory/check.h"

namespace memfit {

using alloc_detail::BlockNode;
using alloc_detail::i64;
using alloc_detail::NodeState;
using alloc_detail::Segment;
using alloc_detail::stat_decrease;

void CachingAllocator::Impl::release_segment(BlockNode* b) {
  MEMFIT_CHECK(b->state == NodeState::kFree && !b->is_split());
  Segment* seg = b->segment;
  pool_remove(b);
  provider.deallocate(reinterpret_cast<void*>(seg->base), seg->size);
  reserved -= seg->size;
  const int type = b->stat_type();
  stat_decrease(stats.segment, type, 1);
  stat_decrease(stats.reserved_bytes, type, i64(seg->size));
  ++stats.num_device_free;
  segments.erase(seg->base);
  const std::uintptr_t base = seg->base;
  const std::size_t size = seg->size;
  const StreamId stream = seg->stream;
  delete seg;
  node_to_spare(b);
  emit(EventKind::kSegmentFree, base, size, stream, Category::kUnknown, nullptr);
}

std::vector<BlockNode*> CachingAllocator::Impl::whole_free_segments() const {
  std::vector<BlockNode*> whole;
  for (const PoolSet& pool : pools) {
    for (const auto& e : pool)
      if (!e.block->is_split() && !e.block->segment->expandable) whole.push_back(e.block);
  }
  return whole;
}

void CachingAllocator::Impl::release_free_segments() {
  for (BlockNode* b : whole_free_segments()) release_segment(b);
  if (page != 0) unmap_free_pages();
}

// release_before_growth: a new segment of `seg_size` for a transient block of `size` would
// lift reserved memory above its high-water mark. Wholly free transient segments smaller than
// `size` could not have served this request, so returning them (idle longest first) until the
// new segment fits under the mark keeps the peak down. Once the mark covers a step's pattern no
// request grows it and nothing is released, so the steady state makes no provider calls.
// Persistent requests neither trigger this nor lose segments to it: their growth is new
// long-lived data, not fragmentation, and trading a transient segment for it only moves the
// growth to the next step (measured: caching_allocator.h).
void CachingAllocator::Impl::release_unfit_segments(std::size_t size, std::size_t seg_size) {
  std::vector<BlockNode*> unfit = whole_free_segments();
  std::erase_if(unfit,
                [size](const BlockNode* b) { return b->size >= size || b->segment->persistent; });
  std::sort(unfit.begin(), unfit.end(),
            [](const BlockNode* a, const BlockNode* b) { return a->free_seq < b->free_seq; });
  for (BlockNode* b : unfit) {
    if (reserved + seg_size <= reserved_high) break;
    release_segment(b);
  }
}

void CachingAllocator::Impl::empty_cache() {
  flush_free_cache();
  synchronize_events();
  release_free_segments();
}

// When reserved memory is above threshold * budget, return wholly free segments, the ones
// idle longest first, until it is not. PyTorch ages every cached block on each lookup (O(n)
// per allocation while GC is on) and frees those older than the mean; a free-time stamp
// gives the same order with no per-allocation cost.
void CachingAllocator::Impl::garbage_collect() {
  const auto limit = static_cast<std::size_t>(config.garbage_collection_threshold *
                                              static_cast<double>(config.budget));
  if (reserved <= limit) return;
  if (page != 0) {
    // Expandable segments: the free pages of the blocks idle longest are unmapped first.
    std::vector<BlockNode*> idle;
    for (const PoolSet& pool : pools) {
      for (const auto& e : pool) idle.push_back(e.block);
    }
    std::sort(idle.begin(), idle.end(),
              [](const BlockNode* a, const BlockNode* b) { return a->free_seq < b->free_seq; });
    for (BlockNode* b : idle) {
      if (reserved <= limit) break;
      unmap_block(b);
    }
    return;
  }
  std::vector<BlockNode*> whole = whole_free_segments();
  std::sort(whole.begin(), whole.end(),
            [](const BlockNode* a, const BlockNode* b) { return a->free_seq < b->free_seq; });
  for (BlockNode* b : whole) {
    if (reserved <= limit) break;
    release_segment(b);
  }
}

}  // namespace memfit
