// The allocation and free paths of CachingAllocator. Inspection (stats, snapshot, the
// whole-structure check) and the out-of-memory report live in caching_allocator_inspect.cpp.
#include "memory/caching_allocator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "memory/caching_allocator_impl.h"
#include "memory/check.h"
#include "memory/error.h"
#include "memory/size.h"

namespace memfit {

using alloc_detail::BlockNode;
using alloc_detail::NodeState;
using alloc_detail::Segment;

namespace {

void stat_increase(StatArray& a, int type, std::int64_t n) {
  a[kStatAll].increase(n);
  a[type].increase(n);
}
void stat_decrease(StatArray& a, int type, std::int64_t n) {
  a[kStatAll].decrease(n);
  a[type].decrease(n);
}
std::int64_t i64(std::size_t n) { return static_cast<std::int64_t>(n); }

std::string hex_address(std::uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

// Segment size for a rounded request, as PyTorch's get_allocation_size: small requests share
// 2 MiB segments, 1-10 MiB requests share 20 MiB ones, bigger ones get their own.
std::size_t allocation_size(std::size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

}  // namespace

// ---- Impl: construction ---------------------------------------------------------------------

CachingAllocator::Impl::Impl(MemoryProvider& p, AllocatorConfig c, StreamSync* s)
    : provider(p), config(c), sync(s != nullptr ? s : &immediate) {
#ifdef MEMFIT_DEBUG_CHECKS
  debug_checks = true;
#else
  debug_checks = config.debug_checks;
#endif
  if (config.roundup_power2_divisions < 0 || config.roundup_power2_divisions > 64 ||
      (config.roundup_power2_divisions & (config.roundup_power2_divisions - 1)) != 0) {
    throw InvalidArgument("AllocatorConfig.roundup_power2_divisions = " +
                          std::to_string(config.roundup_power2_divisions) +
                          ": valid values are 0 (off) or a power of two in [1, 64]");
  }
  if (!(config.garbage_collection_threshold >= 0 && config.garbage_collection_threshold < 1)) {
    throw InvalidArgument("AllocatorConfig.garbage_collection_threshold = " +
                          std::to_string(config.garbage_collection_threshold) +
                          ": valid values are 0 (off) or 0 < F < 1");
  }
  MEMFIT_CHECK(provider.alignment() >= kMinBlockSize && provider.alignment() % kMinBlockSize == 0)
      << "provider '" << provider.name() << "' aligns to " << provider.alignment()
      << " bytes; the allocator needs a multiple of " << kMinBlockSize;
}

CachingAllocator::Impl::~Impl() {
  // Wait for outstanding stream work first: it may still touch the memory returned below.
  for (const Pending& p : pending) {
    sync->synchronize(p.event);
    sync->release(p.event);
  }
  pending.clear();
  std::size_t live_count = 0, live_bytes = 0;
  for (const auto& [addr, seg] : segments) {
    for (BlockNode* b = seg->head; b != nullptr; b = b->next) {
      if (b->state == NodeState::kAllocated) {
        ++live_count;
        live_bytes += b->size;
      }
    }
  }
  if (live_count != 0) {
    std::fprintf(stderr,
                 "memfit: CachingAllocator destroyed with %zu live block(s) holding %s; their "
                 "memory is returned to provider '%s' now (free every Block before its "
                 "allocator)\n",
                 live_count, format_bytes(live_bytes).c_str(), provider.name());
  }
  small.clear();
  large.clear();
  for (const auto& [addr, seg] : segments) {
    provider.deallocate(reinterpret_cast<void*>(seg->base), seg->size);
    for (BlockNode* b = seg->head; b != nullptr;) {
      BlockNode* next = b->next;
      delete b;
      b = next;
    }
    delete seg;
  }
  for (BlockNode* b : spare) delete b;
}

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

BlockNode* CachingAllocator::Impl::node_from_spare() {
  if (spare.empty()) return new BlockNode();
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

void CachingAllocator::Impl::emit_slow(EventKind kind, std::uintptr_t addr, std::size_t size,
                                       StreamId stream, Category category,
                                       const std::string* tag) {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  const AllocatorEvent e{kind,
                         addr,
                         size,
                         stream,
                         category,
                         tag != nullptr ? std::string_view(*tag) : std::string_view(),
                         std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()};
  for (const auto& [id, fn] : listeners) fn(e);
}

// inactive_split counts free blocks that share a segment with others; entering and leaving a
// pool is where that changes, so both are accounted here.
void CachingAllocator::Impl::pool_insert(BlockNode* b) {
  if (b->is_split()) {
    stats.inactive_split[kStatAll].increase(1);
    stats.inactive_split[b->stat_type()].increase(1);
    stat_increase(stats.inactive_split_bytes, b->stat_type(), i64(b->size));
  }
  PoolSet& pool = pool_for(b->segment->is_large);
  if (b->handle.empty()) {
    const bool inserted = pool.insert(b).second;
    MEMFIT_CHECK(inserted) << "block " << hex_address(b->addr) << " already in its pool";
  } else {
    b->handle.value() = b;
    auto r = pool.insert(std::move(b->handle));
    MEMFIT_CHECK(r.inserted) << "block " << hex_address(b->addr) << " already in its pool";
  }
}

void CachingAllocator::Impl::pool_remove(BlockNode* b) {
  if (b->is_split()) {
    stat_decrease(stats.inactive_split, b->stat_type(), 1);
    stat_decrease(stats.inactive_split_bytes, b->stat_type(), i64(b->size));
  }
  b->handle = pool_for(b->segment->is_large).extract(b);
  MEMFIT_CHECK(!b->handle.empty()) << "free block " << hex_address(b->addr) << " not in its pool";
}

bool CachingAllocator::Impl::should_split(const BlockNode* b, std::size_t size) const {
  const std::size_t remaining = b->size - size;
  if (!b->segment->is_large) return remaining >= kMinBlockSize;
  // Large blocks split only when the rest is itself a large-pool block (> 1 MiB), and never
  // for requests above max_split_size (PyTorch's should_split).
  return (config.max_split_size == 0 || size < config.max_split_size) && remaining > kSmallSize;
}

BlockNode* CachingAllocator::Impl::take_free_block(PoolSet& pool, StreamId stream,
                                                   std::size_t size) {
  auto it = pool.lower_bound(alloc_detail::SearchKey{stream, size});
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  BlockNode* b = *it;
  if (config.max_split_size != 0) {
    // Oversize blocks (>= max_split_size) are kept for oversize requests, and serve only those
    // within kLargeBuffer of their size, so they are neither split nor wasted (PyTorch's rule).
    if (size < config.max_split_size && b->size >= config.max_split_size) return nullptr;
    if (size >= config.max_split_size && b->size >= size + kLargeBuffer) return nullptr;
  }
  if (b->is_split()) {
    stat_decrease(stats.inactive_split, b->stat_type(), 1);
    stat_decrease(stats.inactive_split_bytes, b->stat_type(), i64(b->size));
  }
  b->handle = pool.extract(it);
  return b;
}

// ---- Impl: allocation -----------------------------------------------------------------------

BlockNode* CachingAllocator::Impl::alloc_segment(std::size_t seg_size, bool is_large,
                                                 StreamId stream, Category category,
                                                 const std::string* tag) {
  if (config.budget != 0 && (seg_size > config.budget || reserved > config.budget - seg_size)) {
    last_failure = Failure::kBudget;
    return nullptr;
  }
  // Book-keeping objects first, so that a bad_alloc here cannot strand provider memory.
  BlockNode* b = node_from_spare();
  auto* seg = new Segment();
  void* p = provider.allocate(seg_size);
  if (p == nullptr) {
    delete seg;
    node_to_spare(b);
    last_failure = Failure::kProvider;
    return nullptr;
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  MEMFIT_CHECK(addr % kMinBlockSize == 0) << "provider '" << provider.name()
                                          << "' returned unaligned " << hex_address(addr);
  seg->base = addr;
  seg->size = seg_size;
  seg->stream = stream;
  seg->is_large = is_large;
  seg->head = b;
  b->addr = addr;
  b->size = seg_size;
  b->stream = stream;
  b->segment = seg;
  segments.emplace(addr, seg);
  reserved += seg_size;
  stat_increase(stats.segment, b->stat_type(), 1);
  stat_increase(stats.reserved_bytes, b->stat_type(), i64(seg_size));
  ++stats.num_device_alloc;
  emit(EventKind::kSegmentAlloc, addr, seg_size, stream, category, tag);
  return b;
}

BlockNode* CachingAllocator::Impl::new_segment_block(std::size_t size, StreamId stream,
                                                     Category category,
                                                     const std::string* tag) {
  const bool is_large = size > kSmallSize;
  const std::size_t seg_size = allocation_size(size);
  BlockNode* b = alloc_segment(seg_size, is_large, stream, category, tag);
  // memfit addition: when a shared 20 MiB segment does not fit (budget or provider), a
  // segment of just the request (rounded to 2 MiB) may; PyTorch reports OOM here instead.
  const std::size_t tight = (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
  if (b == nullptr && is_large && tight < seg_size) {
    b = alloc_segment(tight, is_large, stream, category, tag);
  }
  return b;
}

BlockNode* CachingAllocator::Impl::malloc(std::size_t bytes, Category category, StreamId stream,
                                          std::string_view tag_text) {
  validate_request(bytes, "allocate");
  if (!pending.empty()) process_events();
  const std::string* tag = intern(tag_text);
  const std::size_t size = round_size(bytes);
  const bool is_large = size > kSmallSize;
  PoolSet& pool = pool_for(is_large);

  BlockNode* b = take_free_block(pool, stream, size);
  if (__builtin_expect(b == nullptr, 0)) {
    if (config.garbage_collection_threshold > 0 && config.budget != 0) garbage_collect();
    b = new_segment_block(size, stream, category, tag);
    if (b == nullptr) {
      // Retry once with the cache emptied: pending frees completed (they may now fit), then
      // every wholly free segment returned to the provider.
      ++stats.num_alloc_retries;
      synchronize_events();
      b = take_free_block(pool, stream, size);
      if (b == nullptr) {
        release_free_segments();
        b = new_segment_block(size, stream, category, tag);
      }
      if (b == nullptr) out_of_memory(bytes, stream, category, tag);
    }
  }

  if (should_split(b, size)) {
    BlockNode* rest = node_from_spare();
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
    pool_insert(rest);
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
  emit(EventKind::kAlloc, b->addr, b->size, stream, category, tag);
  return b;
}

// ---- Impl: free -----------------------------------------------------------------------------

void CachingAllocator::Impl::free_requested(BlockNode* b) {
  MEMFIT_CHECK(b->state == NodeState::kAllocated)
      << "Block handle points at block " << hex_address(b->addr) << " that is not allocated";
  BlockNode* found = live.erase(b->addr);
  MEMFIT_CHECK(found == b) << "live map disagrees about " << hex_address(b->addr);

  const int type = b->stat_type();
  const auto n = i64(b->size);
  stat_decrease(stats.allocation, type, 1);
  stat_decrease(stats.allocated_bytes, type, n);
  stat_decrease(stats.requested_bytes, type, i64(b->requested));
  stats.category_bytes[category_index(b->category)].decrease(n);
  emit(EventKind::kFreeRequested, b->addr, b->size, b->stream, b->category, b->tag);

  if (__builtin_expect(b->stream_uses.empty(), 1)) {
    free_completed(b);
    return;
  }
  // Used on other streams: reusable once the work queued there so far has finished.
  b->state = NodeState::kPendingFree;
  for (StreamId s : b->stream_uses) {
    pending.push_back({sync->record(s), b});
    ++b->event_count;
  }
  b->stream_uses.clear();
}

void CachingAllocator::Impl::free_completed(BlockNode* b) {
  const std::uintptr_t orig_addr = b->addr;
  const std::size_t orig_size = b->size;
  const Category category = b->category;
  const std::string* tag = b->tag;
  const int type = b->stat_type();
  stat_decrease(stats.active, type, 1);
  stat_decrease(stats.active_bytes, type, i64(orig_size));

  b->state = NodeState::kFree;
  b->requested = 0;
  b->category = Category::kUnknown;
  b->tag = nullptr;
  if (BlockNode* p = b->prev; p != nullptr && p->state == NodeState::kFree) {
    pool_remove(p);
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
  if (BlockNode* q = b->next; q != nullptr && q->state == NodeState::kFree) {
    pool_remove(q);
    b->size += q->size;
    b->next = q->next;
    if (b->next != nullptr) b->next->prev = b;
    node_to_spare(q);
  }
  b->free_seq = ++free_seq;
  pool_insert(b);
  emit(EventKind::kFreeCompleted, orig_addr, orig_size, b->stream, category, tag);
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
  emit(EventKind::kSegmentFree, seg->base, seg->size, seg->stream, Category::kUnknown, nullptr);
  delete seg;
  node_to_spare(b);
}

void CachingAllocator::Impl::release_free_segments() {
  std::vector<BlockNode*> whole;
  for (PoolSet* pool : {&small, &large}) {
    for (BlockNode* b : *pool)
      if (!b->is_split()) whole.push_back(b);
  }
  for (BlockNode* b : whole) release_segment(b);
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
  std::vector<BlockNode*> whole;
  for (PoolSet* pool : {&small, &large}) {
    for (BlockNode* b : *pool)
      if (!b->is_split()) whole.push_back(b);
  }
  std::sort(whole.begin(), whole.end(),
            [](const BlockNode* a, const BlockNode* b) { return a->free_seq < b->free_seq; });
  for (BlockNode* b : whole) {
    if (reserved <= limit) break;
    release_segment(b);
  }
}

// ---- public API -----------------------------------------------------------------------------

CachingAllocator::CachingAllocator(MemoryProvider& provider, AllocatorConfig config,
                                   StreamSync* sync)
    : impl_(std::make_unique<Impl>(provider, config, sync)) {}

CachingAllocator::~CachingAllocator() = default;

Block CachingAllocator::allocate(std::size_t bytes, Category category, StreamId stream,
                                 std::string_view tag) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  BlockNode* b = impl_->malloc(bytes, category, stream, tag);
  impl_->after_op();
  return Block(this, reinterpret_cast<void*>(b->addr), bytes, b);
}

void* CachingAllocator::allocate_raw(std::size_t bytes, Category category, StreamId stream,
                                     std::string_view tag) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  BlockNode* b = impl_->malloc(bytes, category, stream, tag);
  impl_->after_op();
  return reinterpret_cast<void*>(b->addr);
}

void CachingAllocator::free(void* ptr) {
  if (ptr == nullptr) return;  // as std::free and cudaFree
  std::lock_guard<std::mutex> lock(impl_->mu);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  BlockNode* b = impl_->live.find(addr);
  if (b == nullptr) impl_->bad_pointer("free", addr);
  impl_->free_requested(b);
  impl_->after_op();
}

void CachingAllocator::free_block(void* node) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->free_requested(static_cast<BlockNode*>(node));
  impl_->after_op();
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  BlockNode* b = impl_->live.find(addr);
  if (b == nullptr) impl_->bad_pointer("record_stream", addr);
  impl_->record_stream(b, stream);
  impl_->after_op();
}

void CachingAllocator::record_stream_block(void* node, StreamId stream) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto* b = static_cast<BlockNode*>(node);
  MEMFIT_CHECK(b->state == NodeState::kAllocated)
      << "Block handle points at block " << hex_address(b->addr) << " that is not allocated";
  impl_->record_stream(b, stream);
  impl_->after_op();
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->empty_cache();
  impl_->after_op();
}

void CachingAllocator::set_budget(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->config.budget = bytes;
}

std::size_t CachingAllocator::budget() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->config.budget;
}

std::size_t CachingAllocator::round_size(std::size_t bytes) const {
  Impl::validate_request(bytes, "round_size");
  return impl_->round_size(bytes);
}

ListenerId CachingAllocator::add_listener(AllocatorListener listener) {
  if (!listener) throw InvalidArgument("add_listener: the listener is empty (no callable)");
  std::lock_guard<std::mutex> lock(impl_->mu);
  const ListenerId id = impl_->next_listener++;
  impl_->listeners.emplace_back(id, std::move(listener));
  impl_->has_listeners = true;
  return id;
}

void CachingAllocator::remove_listener(ListenerId id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& ls = impl_->listeners;
  auto it = std::find_if(ls.begin(), ls.end(), [id](const auto& l) { return l.first == id; });
  if (it == ls.end()) {
    throw InvalidArgument("remove_listener: no listener with id " + std::to_string(id) +
                          " (already removed, or returned by another allocator)");
  }
  ls.erase(it);
  impl_->has_listeners = !ls.empty();
}

void CachingAllocator::check_invariants() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->check();
}

const AllocatorConfig& CachingAllocator::config() const { return impl_->config; }
MemoryProvider& CachingAllocator::provider() const { return impl_->provider; }

// ---- Block ----------------------------------------------------------------------------------

void Block::reset() {
  if (alloc_ == nullptr) return;
  CachingAllocator* a = alloc_;
  void* node = node_;
  alloc_ = nullptr;
  ptr_ = nullptr;
  size_ = 0;
  node_ = nullptr;
  a->free_block(node);
}

void Block::record_stream(StreamId stream) {
  if (alloc_ == nullptr) {
    throw InvalidArgument("Block::record_stream(" + std::to_string(stream) +
                          ") on an empty Block (moved from, released or reset)");
  }
  alloc_->record_stream_block(node_, stream);
}

}  // namespace memfit
