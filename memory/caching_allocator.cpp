// CachingAllocator's public API and Block: each call takes the mutex and hands over to the
// Impl (caching_allocator_pools.cpp for allocation and free; caching_allocator_release.cpp for
// giving segments back; caching_allocator_inspect.cpp for stats, snapshots, checks).
// Construction validates the config; destruction returns everything.
#include "memory/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "memory/caching_allocator_impl.h"
#include "memory/check.h"
#include "memory/error.h"
#include "memory/size.h"

namespace memfit {

using alloc_detail::BlockNode;
using alloc_detail::hex_address;
using alloc_detail::NodeState;

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
  // Blocks sit at multiples of 512 bytes from their segment's base, so they are aligned to
  // min(provider alignment, 512): 256 for cudaMalloc's guarantee, 512 or more elsewhere.
  const std::size_t align = provider.alignment();
  MEMFIT_CHECK(align != 0 && (align & (align - 1)) == 0)
      << "provider '" << provider.name() << "' reports alignment " << align;
  if (config.expandable_segments) {
    page = provider.page_size();
    if (page == 0) {
      throw ConfigError(std::string("expandable_segments:True: provider '") + provider.name() +
                        "' has no virtual memory to map pages into (the host, null and cuda "
                        "providers have it); use expandable_segments:False for this allocator");
    }
    MEMFIT_CHECK((page & (page - 1)) == 0 && page % kMinBlockSize == 0 && page % align == 0)
        << "provider '" << provider.name() << "' reports page size " << page;
  }
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
  for (PoolSet& pool : pools) pool.clear();
  for (PoolSet& set : unmapped) set.clear();
  for (const auto& [addr, seg] : segments) {
    if (seg->expandable) {
      // Each mapped run (page-aligned, between unmapped blocks) is unmapped, then the range.
      for (BlockNode* b = seg->head; b != nullptr;) {
        if (b->state == NodeState::kUnmapped) {
          b = b->next;
          continue;
        }
        const std::uintptr_t start = b->addr;
        while (b != nullptr && b->state != NodeState::kUnmapped) b = b->next;
        const std::uintptr_t end = b != nullptr ? b->addr : seg->base + seg->size;
        provider.unmap(reinterpret_cast<void*>(start), end - start);
      }
      provider.release(reinterpret_cast<void*>(seg->base), seg->size);
    } else {
      provider.deallocate(reinterpret_cast<void*>(seg->base), seg->size);
    }
    for (BlockNode* b = seg->head; b != nullptr;) {
      BlockNode* next = b->next;
      delete b;
      b = next;
    }
    delete seg;
  }
  for (BlockNode* b : spare) delete b;
}

// ---- public API -----------------------------------------------------------------------------

CachingAllocator::CachingAllocator(MemoryProvider& provider, AllocatorConfig config,
                                   StreamSync* sync)
    : impl_(std::make_unique<Impl>(provider, config, sync)) {}

CachingAllocator::~CachingAllocator() = default;

Block CachingAllocator::allocate(std::size_t bytes, Category category, StreamId stream,
                                 std::string_view tag) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->begin_op();
  BlockNode* b = impl_->malloc(bytes, category, stream, tag);
  impl_->stats.note_peak_moment();
  impl_->after_op();
  return Block(this, reinterpret_cast<void*>(b->addr), bytes, b);
}

void* CachingAllocator::allocate_raw(std::size_t bytes, Category category, StreamId stream,
                                     std::string_view tag) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->begin_op();
  BlockNode* b = impl_->malloc(bytes, category, stream, tag);
  impl_->stats.note_peak_moment();
  impl_->after_op();
  return reinterpret_cast<void*>(b->addr);
}

void CachingAllocator::free(void* ptr) {
  if (ptr == nullptr) return;  // as std::free and cudaFree
  std::lock_guard<std::mutex> lock(impl_->mu);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  BlockNode* b = impl_->live.find(addr);
  if (b == nullptr) impl_->bad_pointer("free", addr);
  impl_->begin_op();
  impl_->free_requested(b);
  impl_->after_op();
}

void CachingAllocator::free_block(void* node) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->begin_op();
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
  impl_->begin_op();
  impl_->empty_cache();
  impl_->after_op();
}

void CachingAllocator::set_budget(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->config.budget = bytes;
}

void CachingAllocator::fail_allocation(std::int64_t nth) {
  if (nth < 0) {
    throw InvalidArgument("fail_allocation(" + std::to_string(nth) +
                          "); valid: 0 (off) or n >= 1 (the nth allocation from now fails)");
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->fail_countdown = nth;
}

std::int64_t CachingAllocator::pending_fault() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->fail_countdown;
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

AllocatorConfig CachingAllocator::config() const {
  std::lock_guard<std::mutex> lock(impl_->mu);  // set_budget may be writing it
  return impl_->config;
}
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
