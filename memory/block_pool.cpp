// The caching allocator's pools: best fit, splitting, merging, stream events, segments from
// and back to the provider, the retry on failure, garbage collection. The caller holds the
// allocator's mutex throughout. The public API is in caching_allocator.cpp; stats, snapshot,
// the invariant check and the out-of-memory report in caching_allocator_inspect.cpp.
#include <algorithm>
#include <chrono>
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
  nursery.insert(alloc_detail::PoolEntry{0, 0, 0, b.get()});
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
  if (event_time == kNoTime) {
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    event_time = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
  }
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
  if (!b->segment->is_large) return remaining >= kMinBlockSize;
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
  BlockNode* b = new_segment_block(size, stream, persistent);
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
  b = new_segment_block(size, stream, persistent);
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
  const int pool_id = alloc_detail::pool_index(size > kSmallSize, persistent_pool_for(category));
  PoolSet& pool = pools[pool_id];
  // What a split and the live map may need, obtained before anything changes.
  if (__builtin_expect(spare.empty(), 0)) grow_spare();
  live.reserve_one();

  BlockNode* b = find_free_block(pool, stream, size);
  const bool from_pool = b != nullptr;
  if (__builtin_expect(!from_pool, 0))
    b = new_block_slow(pool_id, bytes, size, stream, category, tag);

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
  if (__builtin_expect(!from_pool, 0) && fresh_segment != nullptr) {
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
  merge_into_pool(b);
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

// The block stops being active, merges with free neighbours and enters its pool.
void CachingAllocator::Impl::merge_into_pool(BlockNode* b) {
  const int type = b->stat_type();
  stat_decrease(stats.active, type, 1);
  stat_decrease(stats.active_bytes, type, i64(b->size));

  b->state = NodeState::kFree;
  b->requested = 0;
  b->category = Category::kUnknown;
  b->tag = nullptr;
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

// ---- Impl: giving memory back ---------------------------------------------------------------

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
      if (!e.block->is_split()) whole.push_back(e.block);
  }
  return whole;
}

void CachingAllocator::Impl::release_free_segments() {
  for (BlockNode* b : whole_free_segments()) release_segment(b);
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
  std::vector<BlockNode*> whole = whole_free_segments();
  std::sort(whole.begin(), whole.end(),
            [](const BlockNode* a, const BlockNode* b) { return a->free_seq < b->free_seq; });
  for (BlockNode* b : whole) {
    if (reserved <= limit) break;
    release_segment(b);
  }
}

}  // namespace memfit
