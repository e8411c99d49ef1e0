// The caching allocator's pools: best fit, splitting, merging, the free cache, stream events,
// segments from the provider, the retry on failure. The caller holds the allocator's mutex
// throughout. The public API is in caching_allocator.cpp; giving segments back (empty_cache,
// garbage collection, release_before_growth) in caching_allocator_release.cpp; stats,
// snapshot, the invariant check and the out-of-memory report in caching_allocator_inspect.cpp.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/caching_allocator_impl.h"
#include "memory/check.h"
#include "memory/error.h"
#include "memory/size.h"

namespace memfit {

using alloc_detail::BlockNode;
using alloc_detail::hex_address;
using alloc_detail::i64;
using alloc_detail::NodeState;
using alloc_detail::Segment;
using alloc_detail::stat_decrease;
using alloc_detail::stat_increase;

namespace {

// Segment size for a rounded request, as PyTorch's get_allocation_size: small requests share
// 2 MiB segments, 1-10 MiB requests share 20 MiB ones, bigger ones get their own.
std::size_t allocation_size(std::size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

}  // namespace

// ---- Impl: helpers --------------------------------------------------------------------------

void CachingAllocator::Impl::validate_request(std::size_t bytes, const char* op) {
  if (bytes == 0) {
    throw InvalidArgument(std::string(op) + "(0 bytes): the size must be at least 1 byte");
  }
  if (bytes > kMaxAllocationSize) {
    throw InvalidArgument(std::string(op) + "(" + std::to_string(bytes) + " bytes): larger than " +
                          "any memory provider (at most " + std::to_string(kMaxAllocationSize) +
                          " bytes = " + format_bytes(kMaxAllocationSize) + ")");
  }
}

std::size_t CachingAllocator::Impl::round_size(std::size_t bytes) const {
  if (bytes <= kMinBlockSize) return kMinBlockSize;
  const auto div = static_cast<std::size_t>(config.roundup_power2_divisions);
  if (div > 0 && bytes > kMinBlockSize * div) {
    // The interval [2^k, 2^(k+1)) is cut into `div` equal steps; round up to the next step.
    // bytes > 512*div makes every step a power of two >= 512, so the result stays a granule
    // multiple. (div == 1 rounds to powers of two; PyTorch treats 1 as off.)
    const std::size_t floor2 = std::size_t{1} << (63 - __builtin_clzll(bytes));
    const std::size_t step = floor2 / div;
    return (bytes + step - 1) & ~(step - 1);
  }
  return (bytes + kMinBlockSize - 1) & ~(kMinBlockSize - 1);
}

// Every BlockNode is born with a tree node in its handle, so that putting it into a pool never
// allocates: then no allocation failure can strike halfway through a split or merge.
void CachingAllocator::Impl::grow_spare() {
  auto b = std::make_unique<BlockNode>();
  PoolSet nursery;
  nursery.insert(alloc_detail::PoolEntry{0, 0, 0, 0, b.get()});
  b->handle = nursery.extract(nursery.begin());
  spare.push_back(b.get());
  b.release();
}

BlockNode* CachingAllocator::Impl::node_from_spare() {
  if (spare.empty()) grow_spare();
  BlockNode* b = spare.back();
  spare.pop_back();
  return b;
}

void CachingAllocator::Impl::node_to_spare(BlockNode* b) {
  // Keep the set node and the stream_uses capacity: reusing them is what keeps the fast path
  // free of heap allocation.
  b->prev = b->next = nullptr;
  b->segment = nullptr;
  b->tag = nullptr;
  b->requested = 0;
  b->event_count = 0;
  b->state = NodeState::kFree;
  b->category = Category::kUnknown;
  b->stream_uses.clear();
  spare.push_back(b);
}

const std::string* CachingAllocator::Impl::intern(std::string_view tag) {
  if (tag.empty()) return nullptr;
  if (last_tag != nullptr && *last_tag == tag) return last_tag;
  auto it = tags.find(tag);
  if (it == tags.end()) it = tags.emplace(tag).first;
  last_tag = &*it;  // unordered_set nodes never move, so the pointer stays valid
  return last_tag;
}

// noexcept: a listener that throws ends the program (allocator_event.h says why).
void CachingAllocator::Impl::emit_slow(EventKind kind, std::uintptr_t addr, std::size_t size,
                                       StreamId stream, Category category,
                                       const std::string* tag) noexcept {
  if (event_time == kNoTime) event_time = clock.now_ns();
  const AllocatorEvent e{kind,      addr,
                         size,      stream,
                         category,  tag != nullptr ? std::string_view(*tag) : std::string_view(),
                         event_time};
  for (const auto& [id, fn] : listeners) fn(e);
}

// inactive_split counts free blocks that share a segment with others; entering and leaving a
// pool is where that changes, so it is accounted there, with the block's links of that moment.
void CachingAllocator::Impl::count_in_pool(const BlockNode* b, int sign) {
  if (!b->is_split()) return;
  const int type = b->stat_type();
  if (sign > 0) {
    stat_increase(stats.inactive_split, type, 1);
    stat_increase(stats.inactive_split_bytes, type, i64(b->size));
  } else {
    stat_decrease(stats.inactive_split, type, 1);
    stat_decrease(stats.inactive_split_bytes, type, i64(b->size));
  }
}

void CachingAllocator::Impl::pool_insert(BlockNode* b) {
  count_in_pool(b, +1);
  PoolSet& pool = pool_of(b);
  MEMFIT_CHECK(!b->handle.empty()) << "block " << hex_address(b->addr) << " has no tree node";
  b->handle.value() = b->entry();
  auto r = pool.insert(std::move(b->handle));
  MEMFIT_CHECK(r.inserted) << "block " << hex_address(b->addr) << " already in its pool";
  b->pool_it = r.position;
}

void CachingAllocator::Impl::pool_remove(BlockNode* b) {
  count_in_pool(b, -1);
  b->handle = pool_of(b).extract(b->pool_it);
}

// `to` (outside the pool, its key final) takes over the tree node of `from` (in the pool),
// which leaves it. Split and merge replace one free block by another of nearby size; when no
// other entry sorts between the two keys, the node is re-keyed where it stands, and the pair
// allocate + free of a cached size costs no tree rebalancing at all. The caller does the
// inactive_split accounting.
void CachingAllocator::Impl::pool_transfer(BlockNode* from, BlockNode* to) {
  PoolSet& pool = pool_of(to);
  const auto it = from->pool_it;
  const alloc_detail::PoolEntry e = to->entry();
  const alloc_detail::PoolLess less;
  std::swap(from->handle, to->handle);  // `from` was in the pool, so its handle was empty
  const bool in_place = (it == pool.begin() || less(*std::prev(it), e)) &&
                        (std::next(it) == pool.end() || less(e, *std::next(it)));
  if (in_place) {
    // Sound: the order is unchanged, and set nodes hold non-const objects (the iterator
    // only exposes them as const).
    const_cast<alloc_detail::PoolEntry&>(*it) = e;
    to->pool_it = it;
  } else {
    auto node = pool.extract(it);
    node.value() = e;
    to->pool_it = pool.insert(std::move(node)).position;
  }
}

bool CachingAllocator::Impl::should_split(const BlockNode* b, std::size_t size) const {
  const std::size_t remaining = b->size - size;
  // Expandable segments split like the small pool (PyTorch's rule too): the rest of a block
  // is never stranded, since a range's free blocks merge with pages mapped next to them.
  if (!b->segment->is_large || b->segment->expandable) return remaining >= kMinBlockSize;
  // Large blocks split only when the rest is itself a large-pool block (> 1 MiB), and never
  // for requests above max_split_size (PyTorch's should_split).
  return (config.max_split_size == 0 || size < config.max_split_size) && remaining > kSmallSize;
}

BlockNode* CachingAllocator::Impl::find_free_block(PoolSet& pool, StreamId stream,
                                                   std::size_t size) {
  auto it = pool.lower_bound(alloc_detail::SearchKey{stream, size});
  if (it == pool.end() || it->stream != stream) return nullptr;
  BlockNode* b = it->block;
  if (config.max_split_size != 0) {
    // Oversize blocks (>= max_split_size) are kept for oversize requests, and serve only those
    // within kLargeBuffer of their size, so they are neither split nor wasted (PyTorch's rule).
    if (size < config.max_split_size && b->size >= config.max_split_size) return nullptr;
    if (size >= config.max_split_size && b->size >= size + kLargeBuffer) return nullptr;
  }
  return b;
}

// ---- Impl: allocation -----------------------------------------------------------------------

BlockNode* CachingAllocator::Impl::alloc_segment(std::size_t seg_size, bool is_large,
                                                 bool persistent, StreamId stream) {
  if (config.budget != 0 && (seg_size > config.budget || reserved > config.budget - seg_size)) {
    last_failure = Failure::kBudget;
    return nullptr;
  }
  // Book-keeping objects first, so that a bad_alloc here cannot strand provider memory.
  BlockNode* b = node_from_spare();
  auto* seg = new Segment();
  void* p = nullptr;
  try {
    p = provider.allocate(seg_size);  // a device provider may throw for errors other than OOM
    if (p != nullptr) segments.emplace(reinterpret_cast<std::uintptr_t>(p), seg);
  } catch (...) {
    if (p != nullptr) provider.deallocate(p, seg_size);
    delete seg;
    node_to_spare(b);
    throw;
  }
  if (p == nullptr) {
    delete seg;
    node_to_spare(b);
    last_failure = Failure::kProvider;
    return nullptr;
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  if (addr % provider.alignment() != 0) {
    segments.erase(addr);
    provider.deallocate(p, seg_size);
    delete seg;
    node_to_spare(b);
    MEMFIT_CHECK(false) << "provider '" << provider.name() << "' returned " << hex_address(addr)
                        << ", not aligned to its own " << provider.alignment() << " bytes";
  }
  seg->seq = ++segment_seq;
  seg->base = addr;
  seg->size = seg_size;
  seg->stream = stream;
  seg->is_large = is_large;
  seg->persistent = persistent;
  seg->pool = alloc_detail::pool_index(is_large, persistent);
  seg->head = b;
  b->addr = addr;
  b->size = seg_size;
  b->stream = stream;
  b->segment = seg;
  reserved += seg_size;
  reserved_high = std::max(reserved_high, reserved);
  stat_increase(stats.segment, b->stat_type(), 1);
  stat_increase(stats.reserved_bytes, b->stat_type(), i64(seg_size));
  ++stats.num_device_alloc;
  fresh_segment = seg;  // its event is emitted by malloc once the block is handed out
  return b;
}

BlockNode* CachingAllocator::Impl::new_segment_block(std::size_t size, StreamId stream,
                                                     bool persistent) {
  const bool is_large = size > kSmallSize;
  const std::size_t seg_size = allocation_size(size);
  if (config.release_before_growth && !persistent && reserved + seg_size > reserved_high) {
    release_unfit_segments(size, seg_size);
  }
  BlockNode* b = alloc_segment(seg_size, is_large, persistent, stream);
  // memfit addition: when a shared 20 MiB segment does not fit (budget or provider), a
  // segment of just the request (rounded to 2 MiB) may; PyTorch reports OOM here instead.
  const std::size_t tight = (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
  if (b == nullptr && is_large && tight < seg_size) {
    b = alloc_segment(tight, is_large, persistent, stream);
  }
  return b;
}

// No cached block fits: a new segment, after garbage collection when configured; failing
// that, retry once with the cache emptied; failing that, OutOfMemory. The block returned is
// outside the pool.
BlockNode* CachingAllocator::Impl::new_block_slow(int pool_id, std::size_t bytes, std::size_t size,
                                                  StreamId stream, Category category,
                                                  const std::string* tag) {
  if (config.garbage_collection_threshold > 0 && config.budget != 0) garbage_collect();
  const bool persistent = (pool_id & 2) != 0;
  PoolSet& pool = pools[pool_id];
  const auto grow = [&] {
    return page != 0 ? expandable_block(pool_id, size, stream)
                     : new_segment_block(size, stream, persistent);
  };
  BlockNode* b = grow();
  if (b != nullptr) return b;
  // Pending frees completed first (merged, they may now fit), then every wholly free segment
  // returned to the provider.
  ++stats.num_alloc_retries;
  synchronize_events();
  b = find_free_block(pool, stream, size);
  if (b != nullptr) {
    pool_remove(b);
    return b;
  }
  release_free_segments();
  b = grow();
  if (b == nullptr) out_of_memory(bytes, stream, category, tag);
  return b;
}

BlockNode* CachingAllocator::Impl::malloc(std::size_t bytes, Category category, StreamId stream,
                                          std::string_view tag_text) {
  // One compare catches both 0 (wraps around) and sizes beyond kMaxAllocationSize.
  if (__builtin_expect(bytes - 1 >= kMaxAllocationSize, 0)) validate_request(bytes, "allocate");
  if (__builtin_expect(!pending.empty(), 0)) process_events();
  const std::string* tag =
      tag_text.empty()
          ? nullptr
          : (last_tag != nullptr && *last_tag == tag_text ? last_tag : intern(tag_text));
  const std::size_t size = round_size(bytes);
  // A test's injected fault (fail_allocation), before anything changes: the allocator is then
  // exactly as a budget OutOfMemory that found nothing to release leaves it.
  if (__builtin_expect(fail_countdown != 0, 0) && --fail_countdown == 0) {
    last_failure = Failure::kInjected;
    out_of_memory(bytes, stream, category, tag);
  }
  const int pool_id = alloc_detail::pool_index(size > kSmallSize, persistent_pool_for(category));
  PoolSet& pool = pools[pool_id];
  // What a split and the live map may need, obtained before anything changes.
  if (__builtin_expect(spare.empty(), 0)) grow_spare();
  live.reserve_one();

  BlockNode* b = nullptr;
  if (__builtin_expect(free_cache_len != 0, 0)) {
    b = take_cached(pool_id, stream, size);
    // A miss merges the cached blocks first, so that best fit sees the pools as if they had
    // been merged at their free.
    if (b == nullptr) flush_free_cache();
  }
  const bool from_cache = b != nullptr;
  if (!from_cache) b = find_free_block(pool, stream, size);
  const bool from_pool = !from_cache && b != nullptr;
  if (__builtin_expect(b == nullptr, 0)) {
    b = new_block_slow(pool_id, bytes, size, stream, category, tag);
  }

  if (should_split(b, size)) {
    BlockNode* rest = node_from_spare();
    if (from_pool) count_in_pool(b, -1);
    rest->addr = b->addr + size;
    rest->size = b->size - size;
    rest->stream = stream;
    rest->segment = b->segment;
    rest->prev = b;
    rest->next = b->next;
    if (b->next != nullptr) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    rest->free_seq = ++free_seq;
    if (from_pool) {
      count_in_pool(rest, +1);
      pool_transfer(b, rest);
    } else {
      pool_insert(rest);
    }
  } else if (from_pool) {
    pool_remove(b);
  }

  b->state = NodeState::kAllocated;
  b->requested = bytes;
  b->category = category;
  b->tag = tag;
  live.insert(b->addr, b);

  const int type = b->stat_type();
  const auto n = i64(b->size);
  stat_increase(stats.allocation, type, 1);
  stat_increase(stats.allocated_bytes, type, n);
  stat_increase(stats.active, type, 1);
  stat_increase(stats.active_bytes, type, n);
  stat_increase(stats.requested_bytes, type, i64(bytes));
  stats.category_bytes[category_index(category)].increase(n);
  if (__builtin_expect(fresh_segment != nullptr, 0)) {
    emit(EventKind::kSegmentAlloc, fresh_segment->base, fresh_segment->size, stream, category, tag);
    fresh_segment = nullptr;
  }
  emit(EventKind::kAlloc, b->addr, b->size, stream, category, tag);
  return b;
}

// ---- Impl: free -----------------------------------------------------------------------------

// Events are emitted once the structure is consistent again, so that a listener that throws
// leaves the allocator usable.
void CachingAllocator::Impl::free_requested(BlockNode* b) {
  MEMFIT_CHECK(b->state == NodeState::kAllocated)
      << "Block handle points at block " << hex_address(b->addr) << " that is not allocated";
  const bool waits = !b->stream_uses.empty();
  if (__builtin_expect(waits, 0)) {
    // Used on other streams: reusable once the work queued there so far has finished.
    // Recorded before anything changes, so that a failing record() leaves the block live.
    const std::size_t mark = pending.size();
    try {
      for (StreamId s : b->stream_uses) pending.push_back({sync->record(s), b});
    } catch (...) {
      for (std::size_t i = mark; i < pending.size(); ++i) sync->release(pending[i].event);
      pending.resize(mark);
      throw;
    }
    b->event_count = static_cast<int>(pending.size() - mark);
    b->stream_uses.clear();
  }
  BlockNode* found = live.erase(b->addr);
  MEMFIT_CHECK(found == b) << "live map disagrees about " << hex_address(b->addr);

  const std::uintptr_t addr = b->addr;
  const std::size_t size = b->size;
  const Category category = b->category;
  const std::string* tag = b->tag;
  const int type = b->stat_type();
  const auto n = i64(size);
  stat_decrease(stats.allocation, type, 1);
  stat_decrease(stats.allocated_bytes, type, n);
  stat_decrease(stats.requested_bytes, type, i64(b->requested));
  stats.category_bytes[category_index(category)].decrease(n);
  if (__builtin_expect(waits, 0)) {
    b->state = NodeState::kPendingFree;
    emit(EventKind::kFreeRequested, addr, size, b->stream, category, tag);
    return;
  }
  if (!b->segment->is_large) {
    deactivate(b);
    cache_free(b);
  } else {
    merge_into_pool(b);
  }
  emit(EventKind::kFreeRequested, addr, size, b->stream, category, tag);
  emit(EventKind::kFreeCompleted, addr, size, b->stream, category, tag);
}

void CachingAllocator::Impl::free_completed(BlockNode* b) {
  const std::uintptr_t addr = b->addr;
  const std::size_t size = b->size;
  const Category category = b->category;
  const std::string* tag = b->tag;
  merge_into_pool(b);
  emit(EventKind::kFreeCompleted, addr, size, b->stream, category, tag);
}

void CachingAllocator::Impl::merge_into_pool(BlockNode* b) {
  deactivate(b);
  merge_free(b);
}

void CachingAllocator::Impl::deactivate(BlockNode* b) {
  const int type = b->stat_type();
  stat_decrease(stats.active, type, 1);
  stat_decrease(stats.active_bytes, type, i64(b->size));
  b->state = NodeState::kFree;
  b->requested = 0;
  b->category = Category::kUnknown;
  b->tag = nullptr;
}

void CachingAllocator::Impl::merge_free(BlockNode* b) {
  BlockNode* p = b->prev != nullptr && b->prev->state == NodeState::kFree ? b->prev : nullptr;
  BlockNode* q = b->next != nullptr && b->next->state == NodeState::kFree ? b->next : nullptr;
  b->free_seq = ++free_seq;
  if (p == nullptr && q == nullptr) {
    pool_insert(b);
  } else {
    if (p != nullptr) count_in_pool(p, -1);
    if (q != nullptr) count_in_pool(q, -1);
    if (p != nullptr) {
      b->addr = p->addr;
      b->size += p->size;
      b->prev = p->prev;
      if (b->prev != nullptr) {
        b->prev->next = b;
      } else {
        b->segment->head = b;
      }
    }
    if (q != nullptr) {
      b->size += q->size;
      b->next = q->next;
      if (b->next != nullptr) b->next->prev = b;
    }
    count_in_pool(b, +1);
    // The merged block takes over the tree node of the larger neighbour (the nearer key).
    BlockNode* keep = (q != nullptr && (p == nullptr || q->size >= p->size)) ? q : p;
    BlockNode* drop = keep == q ? p : q;
    if (drop != nullptr) drop->handle = pool_of(b).extract(drop->pool_it);
    pool_transfer(keep, b);
    node_to_spare(p != nullptr ? p : q);
    if (p != nullptr && q != nullptr) node_to_spare(q);
  }
}

// ---- Impl: the free cache (caching_allocator_impl.h) ----------------------------------------

BlockNode* CachingAllocator::Impl::take_cached(int pool, StreamId stream, std::size_t size) {
  for (int i = free_cache_len - 1; i >= 0; --i) {  // newest first
    const CachedFree& c = free_cache[i];
    if (c.size != size || c.stream != stream || c.pool != pool) continue;
    BlockNode* b = c.block;
    std::copy(free_cache + i + 1, free_cache + free_cache_len, free_cache + i);
    --free_cache_len;
    count_in_pool(b, -1);
    return b;
  }
  return nullptr;
}

void CachingAllocator::Impl::cache_free(BlockNode* b) {
  b->state = NodeState::kCached;  // first: the evicted block must not merge with it
  if (free_cache_len == kFreeCacheSlots) {
    BlockNode* oldest = free_cache[0].block;
    std::copy(free_cache + 1, free_cache + free_cache_len, free_cache);
    --free_cache_len;
    count_in_pool(oldest, -1);
    oldest->state = NodeState::kFree;
    merge_free(oldest);
  }
  b->free_seq = ++free_seq;
  count_in_pool(b, +1);  // a small block always shares its segment: inactive_split
  free_cache[free_cache_len++] = {b->size, b->stream, b->segment->pool, b};
}

void CachingAllocator::Impl::flush_free_cache() {
  const int n = free_cache_len;
  free_cache_len = 0;
  for (int i = 0; i < n; ++i) {
    BlockNode* b = free_cache[i].block;
    count_in_pool(b, -1);
    b->state = NodeState::kFree;
    merge_free(b);
  }
}

void CachingAllocator::Impl::record_stream(BlockNode* b, StreamId stream) {
  // Work on the block's own stream is ordered with its reuse already.
  if (stream == b->stream) return;
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end()) {
    b->stream_uses.push_back(stream);
  }
}

void CachingAllocator::Impl::process_events() {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < pending.size(); ++i) {
    const Pending p = pending[i];
    if (sync->query(p.event)) {
      sync->release(p.event);
      if (--p.block->event_count == 0) free_completed(p.block);
    } else {
      pending[kept++] = p;
    }
  }
  pending.resize(kept);
}

void CachingAllocator::Impl::synchronize_events() {
  std::vector<Pending> all;
  all.swap(pending);
  for (const Pending& p : all) {
    sync->synchronize(p.event);
    sync->release(p.event);
    if (--p.block->event_count == 0) free_completed(p.block);
  }
}

}  // namespace memfit
