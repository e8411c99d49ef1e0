// The caching allocator's expandable segments (alloc_conf.h: expandable_segments:True), after
// PyTorch's ExpandableSegment (c10/cuda/CUDACachingAllocator.cpp): per pool and stream, one
// reserved address range whose pages are mapped when a request needs them and unmapped by
// empty_cache, the retry after a failure and garbage collection. A request that no mapped
// free block fits takes the lowest place where free blocks and unmapped pages side by side
// add up to it, and maps just the pages it lacks, so growing work reuses one contiguous range
// instead of stranding fixed-size segments. caching_allocator.h says where memfit differs.
// The caller holds the allocator's mutex.
#include <algorithm>
#include <memory>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/caching_allocator_impl.h"
#include "memory/check.h"
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

// Page rounding; throws InvalidArgument rather than wrap (an absurd budget's range).
std::size_t round_up(std::size_t n, std::size_t page) {
  return checked_align_up(n, page, "expandable segment range");
}

bool allocatable(const BlockNode* b) {
  return b != nullptr && (b->state == NodeState::kFree || b->state == NodeState::kUnmapped);
}

// Bytes of free and unmapped blocks from `b` on, counted until `want` is reached.
std::size_t available_from(const BlockNode* b, std::size_t want) {
  std::size_t have = 0;
  for (; have < want && allocatable(b); b = b->next) have += b->size;
  return have;
}

}  // namespace

void CachingAllocator::Impl::unmapped_insert(BlockNode* b) {
  PoolSet& set = unmapped[b->segment->pool];
  b->handle.value() = b->entry();
  auto r = set.insert(std::move(b->handle));
  MEMFIT_CHECK(r.inserted) << "unmapped block " << hex_address(b->addr) << " listed twice";
  b->pool_it = r.position;
}

void CachingAllocator::Impl::unmapped_remove(BlockNode* b) {
  b->handle = unmapped[b->segment->pool].extract(b->pool_it);
}

// The place to grow from: for each unmapped block of the stream, itself or the free block just
// before it, when the free and unmapped blocks from there on add up to `size`. The lowest
// such place (segment, then offset) wins, as PyTorch takes the lowest address.
BlockNode* CachingAllocator::Impl::find_expandable(int pool_id, std::size_t size,
                                                   StreamId stream) const {
  const PoolSet& set = unmapped[pool_id];
  BlockNode* best = nullptr;
  for (auto it = set.lower_bound(alloc_detail::SearchKey{stream, 0});
       it != set.end() && it->stream == stream; ++it) {
    BlockNode* c = it->block;
    if (c->prev != nullptr && c->prev->state == NodeState::kFree) c = c->prev;
    if (available_from(c, size) < size) continue;
    if (best == nullptr || c->segment->seq < best->segment->seq ||
        (c->segment == best->segment && c->addr < best->addr)) {
      best = c;
    }
  }
  return best;
}

// A new range for the pool and stream: budget + 1/8 when there is a budget (PyTorch reserves
// device memory + 1/8: room to grow past pages stranded below), else kExpandableRange; never
// less than the request. Reserving costs address space, not memory or budget.
BlockNode* CachingAllocator::Impl::new_expandable_segment(int pool_id, std::size_t size,
                                                          StreamId stream) {
  std::size_t range = config.budget != 0 ? config.budget + config.budget / 8 : kExpandableRange;
  range = round_up(std::max(range, size), page);
  BlockNode* b = node_from_spare();
  auto seg = std::make_unique<Segment>();
  void* p = provider.reserve(range);
  if (p == nullptr) {
    node_to_spare(b);
    last_failure = Failure::kProvider;
    return nullptr;
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  try {
    segments.emplace(addr, seg.get());
  } catch (...) {
    provider.release(p, range);
    node_to_spare(b);
    throw;
  }
  seg->seq = ++segment_seq;
  seg->base = addr;
  seg->size = range;
  seg->expandable = true;
  seg->stream = stream;
  seg->is_large = (pool_id & 1) != 0;
  seg->persistent = (pool_id & 2) != 0;
  seg->pool = pool_id;
  seg->head = b;
  b->addr = addr;
  b->size = range;
  b->stream = stream;
  b->segment = seg.release();
  b->state = NodeState::kUnmapped;
  unmapped_insert(b);
  return b;
}

// Maps the first `bytes` (rounded up to pages) of unmapped block `u`; the rest of it stays
// unmapped. The mapped part merges with free neighbours; returns that free block (in its
// pool), or nullptr when the budget or the provider refuses (then nothing changed).
BlockNode* CachingAllocator::Impl::map_block(BlockNode* u, std::size_t bytes) {
  MEMFIT_CHECK(u->state == NodeState::kUnmapped);
  bytes = std::min(round_up(bytes, page), u->size);
  if (config.budget != 0 && (bytes > config.budget || reserved > config.budget - bytes)) {
    last_failure = Failure::kBudget;
    return nullptr;
  }
  BlockNode* rest = bytes < u->size ? node_from_spare() : nullptr;  // before anything changes
  bool mapped = false;
  try {
    mapped = provider.map(reinterpret_cast<void*>(u->addr), bytes);
  } catch (...) {
    if (rest != nullptr) node_to_spare(rest);
    throw;
  }
  if (!mapped) {
    if (rest != nullptr) node_to_spare(rest);
    last_failure = Failure::kProvider;
    return nullptr;
  }
  Segment* seg = u->segment;
  // stats.segment counts mapped runs (what snapshot() reports): this one may start a run,
  // extend one, or join two.
  const bool joins_prev = u->prev != nullptr;  // never unmapped: unmapped blocks merge
  const bool joins_next = bytes == u->size && u->next != nullptr;
  const int runs = 1 - int{joins_prev} - int{joins_next};
  unmapped_remove(u);
  if (rest != nullptr) {
    rest->addr = u->addr + bytes;
    rest->size = u->size - bytes;
    rest->stream = u->stream;
    rest->segment = seg;
    rest->state = NodeState::kUnmapped;
    rest->prev = u;
    rest->next = u->next;
    if (u->next != nullptr) u->next->prev = rest;
    u->next = rest;
    u->size = bytes;
    unmapped_insert(rest);
  }
  const std::uintptr_t addr = u->addr;
  // A free neighbour's inactive_split status may change now that u is mapped: it is counted
  // again (count_in_pool reads the links and states of the moment).
  BlockNode* free_side[2] = {u->prev, u->next};
  for (BlockNode*& n : free_side) {
    if (n != nullptr && n->state != NodeState::kFree) n = nullptr;
    if (n != nullptr) count_in_pool(n, -1);
  }
  u->state = NodeState::kFree;
  for (BlockNode* n : free_side) {
    if (n != nullptr) count_in_pool(n, +1);
  }
  seg->mapped += bytes;
  reserved += bytes;
  reserved_high = std::max(reserved_high, reserved);
  stat_increase(stats.reserved_bytes, u->stat_type(), i64(bytes));
  if (runs > 0) stat_increase(stats.segment, u->stat_type(), runs);
  if (runs < 0) stat_decrease(stats.segment, u->stat_type(), -runs);
  ++stats.num_device_alloc;
  merge_free(u);  // u stays the node of the merged block
  emit(EventKind::kSegmentMap, addr, bytes, seg->stream, Category::kUnknown, nullptr);
  return u;
}

// No mapped free block fits: grow at the place find_expandable picks (in a new range if none
// has room), mapping what is missing, page run by page run. A failure part way leaves what was
// mapped so far as free mapped memory, merged and cached like any other. The block returned
// is out of its pool; nullptr when the budget or provider refused.
BlockNode* CachingAllocator::Impl::expandable_block(int pool_id, std::size_t size,
                                                    StreamId stream) {
  BlockNode* c = find_expandable(pool_id, size, stream);
  if (config.release_before_growth && (pool_id & 2) == 0) {
    // release_before_growth, expandable form: growing past the high-water mark first unmaps
    // the whole free pages of transient blocks, largest first (not those this grow takes),
    // so that mapped memory follows what is live instead of what is scattered. Then the place
    // is looked for again: unmapped holes may now serve it. Largest first settles sooner than
    // idle-longest first (GPT-2 trace, B=4: provider calls in steps 1 / 2+ were 1 / 2, now
    // 1 / 0; reserved/live 1.005 either way; PyTorch's rule, no release: 1.062, 0 / 0).
    const std::size_t need = c == nullptr ? round_up(size, page) : pages_to_map(c, size);
    if (reserved + need > reserved_high && unmap_idle_pages(c, size, need)) {
      c = find_expandable(pool_id, size, stream);
    }
  }
  if (c == nullptr) c = new_expandable_segment(pool_id, size, stream);
  if (c == nullptr) return nullptr;
  if (c->state == NodeState::kUnmapped) {
    c = map_block(c, std::min(c->size, size));
    if (c == nullptr) return nullptr;
  }
  while (c->size < size) {
    // Free neighbours are merged, so what follows a free block here is unmapped.
    BlockNode* next = c->next;
    MEMFIT_CHECK(next != nullptr && next->state == NodeState::kUnmapped)
        << "expandable block " << hex_address(c->addr) << " cannot grow";
    c = map_block(next, std::min(size - c->size, next->size));
    if (c == nullptr) return nullptr;
  }
  pool_remove(c);
  return c;
}

// Bytes of pages a grow from `c` maps to serve `size` (as expandable_block would).
std::size_t CachingAllocator::Impl::pages_to_map(const BlockNode* c, std::size_t size) const {
  std::size_t have = 0, need = 0;
  for (const BlockNode* b = c; have < size && b != nullptr; b = b->next) {
    if (b->state == NodeState::kUnmapped) {
      const std::size_t m = std::min(round_up(size - have, page), b->size);
      need += m;
      have += m;
    } else {
      have += b->size;
    }
  }
  return need;
}

// Unmaps whole free pages of transient pools, largest blocks first, until a grow of `need`
// stays under the high-water mark; the free blocks of the chain from `keep` (the grow's own)
// are left alone. Returns whether anything was unmapped.
bool CachingAllocator::Impl::unmap_idle_pages(const BlockNode* keep, std::size_t size,
                                              std::size_t need) {
  std::vector<BlockNode*> idle;
  for (int p = 0; p < alloc_detail::kPoolCount; ++p) {
    if ((p & 2) != 0) continue;  // persistent pools keep theirs
    for (const auto& e : pools[p]) idle.push_back(e.block);
  }
  if (keep != nullptr) {
    std::size_t have = 0;
    for (const BlockNode* b = keep; have < size && b != nullptr; b = b->next) {
      have += b->size;
      if (b->state == NodeState::kFree) std::erase(idle, b);
    }
  }
  std::sort(idle.begin(), idle.end(),
            [](const BlockNode* a, const BlockNode* b) { return a->size > b->size; });
  bool any = false;
  for (BlockNode* b : idle) {
    if (reserved + need <= reserved_high) break;
    any = unmap_block(b) || any;
  }
  return any;
}

// Unmaps the whole pages inside free block `b` (in its pool); the parts of pages it shares
// with neighbours stay mapped as free blocks of their own. Returns false when b holds no whole
// page.
bool CachingAllocator::Impl::unmap_block(BlockNode* b) {
  Segment* seg = b->segment;
  MEMFIT_CHECK(seg->expandable && b->state == NodeState::kFree);
  const std::uintptr_t start = seg->base + round_up(b->addr - seg->base, page);
  const std::uintptr_t end = seg->base + (b->addr + b->size - seg->base) / page * page;
  if (end <= start) return false;
  BlockNode* before = start > b->addr ? node_from_spare() : nullptr;
  BlockNode* after = nullptr;
  try {
    if (end < b->addr + b->size) after = node_from_spare();
    provider.unmap(reinterpret_cast<void*>(start), end - start);
  } catch (...) {
    if (before != nullptr) node_to_spare(before);
    if (after != nullptr) node_to_spare(after);
    throw;
  }
  // Mapped runs (stats.segment): this one goes, shrinks, or splits in two.
  const auto mapped_block = [](const BlockNode* n) {
    return n != nullptr && n->state != NodeState::kUnmapped;
  };
  const bool left = before != nullptr || mapped_block(b->prev);
  const bool right = after != nullptr || mapped_block(b->next);
  const int runs = int{left} + int{right} - 1;
  pool_remove(b);
  if (before != nullptr) {
    before->addr = b->addr;
    before->size = start - b->addr;
    before->prev = b->prev;
    before->next = b;
    if (b->prev != nullptr) {
      b->prev->next = before;
    } else {
      seg->head = before;
    }
    b->prev = before;
  }
  if (after != nullptr) {
    after->addr = end;
    after->size = b->addr + b->size - end;
    after->prev = b;
    after->next = b->next;
    if (b->next != nullptr) b->next->prev = after;
    b->next = after;
  }
  b->addr = start;
  b->size = end - start;
  b->state = NodeState::kUnmapped;  // first: the parts' inactive_split sees it unmapped
  for (BlockNode* part : {before, after}) {
    if (part == nullptr) continue;
    part->stream = b->stream;
    part->segment = seg;
    part->state = NodeState::kFree;
    part->free_seq = b->free_seq;
    pool_insert(part);
  }
  merge_unmapped(b);
  seg->mapped -= end - start;
  reserved -= end - start;
  const int type = seg->is_large ? kStatLargePool : kStatSmallPool;
  stat_decrease(stats.reserved_bytes, type, i64(end - start));
  if (runs > 0) stat_increase(stats.segment, type, runs);
  if (runs < 0) stat_decrease(stats.segment, type, -runs);
  ++stats.num_device_free;
  emit(EventKind::kSegmentUnmap, start, end - start, seg->stream, Category::kUnknown, nullptr);
  return true;
}

// b is unmapped and in no set: merges it with unmapped neighbours and lists the result.
void CachingAllocator::Impl::merge_unmapped(BlockNode* b) {
  BlockNode* p = b->prev != nullptr && b->prev->state == NodeState::kUnmapped ? b->prev : nullptr;
  BlockNode* q = b->next != nullptr && b->next->state == NodeState::kUnmapped ? b->next : nullptr;
  if (p != nullptr) {
    unmapped_remove(p);
    b->addr = p->addr;
    b->size += p->size;
    b->prev = p->prev;
    if (b->prev != nullptr) {
      b->prev->next = b;
    } else {
      b->segment->head = b;
    }
    node_to_spare(p);
  }
  if (q != nullptr) {
    unmapped_remove(q);
    b->size += q->size;
    b->next = q->next;
    if (b->next != nullptr) b->next->prev = b;
    node_to_spare(q);
  }
  unmapped_insert(b);
}

// empty_cache and the retry after a failure: every free page of every range unmapped, and
// ranges left with nothing mapped given back.
void CachingAllocator::Impl::unmap_free_pages() {
  std::vector<BlockNode*> free_blocks;
  for (const PoolSet& pool : pools) {
    for (const auto& e : pool) {
      if (e.block->segment->expandable) free_blocks.push_back(e.block);
    }
  }
  for (BlockNode* b : free_blocks) unmap_block(b);
  std::vector<Segment*> empty;
  for (const auto& [addr, seg] : segments) {
    if (seg->expandable && seg->mapped == 0) empty.push_back(seg);
  }
  for (Segment* seg : empty) release_expandable_segment(seg);
}

void CachingAllocator::Impl::release_expandable_segment(Segment* seg) {
  BlockNode* b = seg->head;
  MEMFIT_CHECK(seg->expandable && seg->mapped == 0 && b->state == NodeState::kUnmapped &&
               b->next == nullptr)
      << "releasing range " << hex_address(seg->base) << " with pages mapped";
  unmapped_remove(b);
  provider.release(reinterpret_cast<void*>(seg->base), seg->size);
  segments.erase(seg->base);
  delete seg;
  node_to_spare(b);
}

}  // namespace memfit
