// CachingAllocator's read side: stats, snapshot, the whole-structure invariant check, and the
// reports for out-of-memory and bad pointers. None of it is on the allocation fast path.
#include <algorithm>
#include <cstdio>
#include <string>

#include "memory/caching_allocator.h"
#include "memory/caching_allocator_impl.h"
#include "memory/check.h"
#include "memory/error.h"
#include "memory/size.h"

namespace memfit {

using alloc_detail::BlockNode;
using alloc_detail::NodeState;
using alloc_detail::Segment;

std::string alloc_detail::hex_address(std::uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

using alloc_detail::hex_address;

namespace {

BlockState state_of(const BlockNode* b) {
  switch (b->state) {
    case NodeState::kAllocated:
      return BlockState::kActiveAllocated;
    case NodeState::kPendingFree:
      return BlockState::kActivePendingFree;
    case NodeState::kFree:
    case NodeState::kCached:    // free, merged or not
    case NodeState::kUnmapped:  // never listed (snapshot() reports mapped runs)
      break;
  }
  return BlockState::kInactive;
}

}  // namespace

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  AllocatorStats& s = impl_->stats;
  for (StatArray* a :
       {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
        &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
    for (Stat& st : *a) st.reset_peak();
  }
  for (Stat& st : s.category_bytes) st.reset_peak();
  s.note_peak_moment_now();
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  AllocatorStats& s = impl_->stats;
  for (StatArray* a :
       {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
        &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
    for (Stat& st : *a) st.reset_accumulated();
  }
  for (Stat& st : s.category_bytes) st.reset_accumulated();
  s.num_alloc_retries = s.num_ooms = s.num_device_alloc = s.num_device_free = 0;
}

Snapshot CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Snapshot snap;
  snap.config = impl_->config;
  snap.segments.reserve(impl_->segments.size());
  for (const auto& [addr, seg] : impl_->segments) {
    // An expandable range shows as one segment per mapped run, as PyTorch reports it.
    SegmentInfo* run = nullptr;
    for (const BlockNode* b = seg->head; b != nullptr; b = b->next) {
      if (b->state == NodeState::kUnmapped) {
        run = nullptr;
        continue;
      }
      if (run == nullptr) {
        run = &snap.segments.emplace_back();
        run->address = b->addr;
        run->stream = seg->stream;
        run->is_large = seg->is_large;
        run->is_expandable = seg->expandable;
        run->persistent = seg->persistent;
      }
      SegmentInfo& si = *run;
      si.total_size += b->size;
      BlockInfo& bi = si.blocks.emplace_back();
      bi.address = b->addr;
      bi.size = b->size;
      bi.requested_size = b->requested;
      bi.state = state_of(b);
      bi.category = b->category;
      if (b->tag != nullptr) bi.tag = *b->tag;
      if (bi.state == BlockState::kActiveAllocated) si.allocated_size += b->size;
      if (bi.state != BlockState::kInactive) {
        si.active_size += b->size;
        si.requested_size += b->requested;
      }
    }
  }
  return snap;
}

void CachingAllocator::Impl::bad_pointer(const char* op, std::uintptr_t addr) const {
  // Say which mistake it is: the address is inside one of our segments or not.
  std::string why = "it was not allocated by this allocator";
  auto it = segments.upper_bound(addr);
  if (it != segments.begin()) {
    const Segment* seg = std::prev(it)->second;
    if (addr < seg->base + seg->size) {
      why = "it points inside a segment of this allocator but not at a live block";
      for (const BlockNode* b = seg->head; b != nullptr; b = b->next) {
        if (b->addr == addr && b->state != NodeState::kAllocated) {
          why = "it was already freed (double free)";
        } else if (b->addr < addr && addr < b->addr + b->size) {
          why = "it points into the middle of a block starting at " + hex_address(b->addr);
        }
      }
    }
  }
  throw InvalidArgument(std::string(op) + "(" + hex_address(addr) + "): " + why +
                        "; pass a pointer returned by allocate_raw() or Block::release() that " +
                        "has not been freed yet");
}

void CachingAllocator::Impl::out_of_memory(std::size_t bytes, StreamId stream, Category category,
                                           const std::string* tag) {
  ++stats.num_ooms;
  OomInfo info;
  info.requested_bytes = bytes;
  info.allocated_bytes = static_cast<std::size_t>(stats.allocated_bytes[kStatAll].current);
  info.reserved_bytes = reserved;
  info.budget_bytes = config.budget;
  for (const PoolSet& pool : pools) {
    for (const auto& e : pool) info.largest_free_block = std::max(info.largest_free_block, e.size);
  }
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    const std::int64_t cur = stats.category_bytes[c].current;
    if (cur > 0) info.top_categories.emplace_back(static_cast<Category>(c), cur);
  }
  std::stable_sort(info.top_categories.begin(), info.top_categories.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  if (info.top_categories.size() > 3) info.top_categories.resize(3);

  std::string msg = "out of memory: tried to allocate " + format_bytes(round_size(bytes)) + " (" +
                    std::to_string(bytes) + " bytes requested; category " + category_name(category);
  if (tag != nullptr) msg += ", tag '" + *tag + "'";
  msg += ", stream " + std::to_string(stream) + ") from provider '" + provider.name() + "'";
  msg += last_failure == Failure::kBudget     ? ", which would exceed the budget"
         : last_failure == Failure::kInjected ? ", failed on purpose (fail_allocation, a test's)"
                                              : ", which returned no memory";
  msg += "; allocated " + format_bytes(info.allocated_bytes) + ", reserved " +
         format_bytes(info.reserved_bytes) + ", budget " +
         (info.budget_bytes != 0 ? format_bytes(info.budget_bytes) : std::string("unlimited")) +
         ", largest free block " + format_bytes(info.largest_free_block) +
         "; top categories in use: ";
  if (info.top_categories.empty()) msg += "none";
  for (std::size_t i = 0; i < info.top_categories.size(); ++i) {
    msg += (i ? ", " : "");
    msg += std::string(category_name(info.top_categories[i].first)) + " " +
           format_bytes(info.top_categories[i].second);
  }
  msg += ". Free or shrink live allocations, or raise the budget.";
  emit(EventKind::kOom, 0, bytes, stream, category, tag);
  after_op();
  throw OutOfMemory(msg, std::move(info));
}

// The whole-structure check (config.debug_checks / MEMFIT_DEBUG_CHECKS): O(blocks log blocks).
void CachingAllocator::Impl::check() const {
  AllocatorStats want;  // current values recomputed from the blocks
  std::size_t free_in_pool[alloc_detail::kPoolCount] = {}, allocated = 0;
  std::size_t unmapped_in_set[alloc_detail::kPoolCount] = {};
  int cached = 0;
  std::size_t pending_events = 0;
  std::uintptr_t prev_end = 0;
  for (const auto& [addr, seg] : segments) {
    MEMFIT_CHECK(addr == seg->base);
    MEMFIT_CHECK(seg->base >= prev_end)
        << "segment " << hex_address(seg->base) << " overlaps the previous one";
    prev_end = seg->base + seg->size;
    const int type = seg->is_large ? kStatLargePool : kStatSmallPool;
    MEMFIT_CHECK(seg->pool == alloc_detail::pool_index(seg->is_large, seg->persistent));
    MEMFIT_CHECK(!seg->persistent || config.separate_persistent_pools)
        << "persistent segment " << hex_address(seg->base) << " with the policy off";
    for (int t : {int{kStatAll}, type}) {
      if (!seg->expandable) want.segment[t].current += 1;  // expandable: per mapped run
      want.reserved_bytes[t].current += static_cast<std::int64_t>(seg->reserved_bytes());
    }
    MEMFIT_CHECK(seg->expandable == (page != 0))
        << "segment " << hex_address(seg->base) << " of the other mode";
    MEMFIT_CHECK(seg->head != nullptr && seg->head->prev == nullptr);
    std::uintptr_t expect = seg->base;
    std::size_t mapped = 0;
    const BlockNode* prev = nullptr;
    for (const BlockNode* b = seg->head; b != nullptr; prev = b, b = b->next) {
      if (seg->expandable && b->state != NodeState::kUnmapped) {
        // Mapped runs start and end on page boundaries.
        mapped += b->size;
        if (prev == nullptr || prev->state == NodeState::kUnmapped) {
          MEMFIT_CHECK((b->addr - seg->base) % page == 0)
              << "mapped run at " << hex_address(b->addr) << " does not start on a page";
          for (int t : {int{kStatAll}, type}) want.segment[t].current += 1;
        }
        if (b->next == nullptr || b->next->state == NodeState::kUnmapped) {
          MEMFIT_CHECK((b->addr + b->size - seg->base) % page == 0)
              << "mapped run ending at " << hex_address(b->addr + b->size)
              << " does not end on a page";
        }
      }
      MEMFIT_CHECK(b->segment == seg);
      MEMFIT_CHECK(b->prev == prev) << "broken prev link at " << hex_address(b->addr);
      MEMFIT_CHECK(b->addr == expect) << "gap or overlap at " << hex_address(expect);
      MEMFIT_CHECK(b->size > 0 && b->size % kMinBlockSize == 0);
      MEMFIT_CHECK(b->stream == seg->stream);
      MEMFIT_CHECK(b->addr + b->size <= seg->base + seg->size) << "block past its segment";
      expect += b->size;
      const auto n = static_cast<std::int64_t>(b->size);
      switch (b->state) {
        case NodeState::kFree: {
          MEMFIT_CHECK(prev == nullptr || prev->state != NodeState::kFree)
              << "unmerged free neighbours at " << hex_address(b->addr);
          MEMFIT_CHECK(b->event_count == 0 && b->requested == 0);
          const PoolSet& pool = pools[seg->pool];
          auto it = pool.find(b->entry());
          MEMFIT_CHECK(it != pool.end() && it->block == b && b->pool_it == it)
              << "free block " << hex_address(b->addr) << " missing from its pool";
          free_in_pool[seg->pool] += 1;
          if (b->is_split()) {
            for (int t : {int{kStatAll}, type}) {
              want.inactive_split[t].current += 1;
              want.inactive_split_bytes[t].current += n;
            }
          }
          break;
        }
        case NodeState::kCached: {
          // Free but unmerged: in the free cache once, under its own key, out of the pool.
          MEMFIT_CHECK(!seg->is_large && b->is_split()) << "cached block " << hex_address(b->addr);
          MEMFIT_CHECK(b->event_count == 0 && b->requested == 0 && !b->handle.empty());
          MEMFIT_CHECK(b->category == Category::kUnknown && b->tag == nullptr);
          int found = 0;
          for (int i = 0; i < free_cache_len; ++i) {
            const CachedFree& c = free_cache[i];
            if (c.block != b) continue;
            ++found;
            MEMFIT_CHECK(c.size == b->size && c.stream == b->stream && c.pool == seg->pool);
          }
          MEMFIT_CHECK(found == 1) << "cached block " << hex_address(b->addr) << " listed " << found
                                   << " times in the free cache";
          ++cached;
          for (int t : {int{kStatAll}, type}) {
            want.inactive_split[t].current += 1;
            want.inactive_split_bytes[t].current += n;
          }
          break;
        }
        case NodeState::kAllocated:
          MEMFIT_CHECK(live.find(b->addr) == b) << hex_address(b->addr) << " not in the live map";
          MEMFIT_CHECK(b->event_count == 0);
          MEMFIT_CHECK(b->requested > 0 && b->requested <= b->size);
          MEMFIT_CHECK(persistent_pool_for(b->category) == seg->persistent)
              << category_name(b->category) << " block " << hex_address(b->addr)
              << " in a segment of the other lifetime pool";
          ++allocated;
          for (int t : {int{kStatAll}, type}) {
            want.allocation[t].current += 1;
            want.allocated_bytes[t].current += n;
            want.requested_bytes[t].current += static_cast<std::int64_t>(b->requested);
            want.active[t].current += 1;
            want.active_bytes[t].current += n;
          }
          want.category_bytes[category_index(b->category)].current += n;
          break;
        case NodeState::kUnmapped: {
          MEMFIT_CHECK(seg->expandable) << "unmapped block in a fixed segment";
          MEMFIT_CHECK(prev == nullptr || prev->state != NodeState::kUnmapped)
              << "unmerged unmapped neighbours at " << hex_address(b->addr);
          MEMFIT_CHECK((b->addr - seg->base) % page == 0 && b->size % page == 0)
              << "unmapped block " << hex_address(b->addr) << " is not whole pages";
          MEMFIT_CHECK(b->event_count == 0 && b->requested == 0);
          const PoolSet& set = unmapped[seg->pool];
          auto it = set.find(b->entry());
          MEMFIT_CHECK(it != set.end() && it->block == b && b->pool_it == it)
              << "unmapped block " << hex_address(b->addr) << " missing from its set";
          unmapped_in_set[seg->pool] += 1;
          break;
        }
        case NodeState::kPendingFree:
          MEMFIT_CHECK(b->event_count > 0) << "pending block without events";
          MEMFIT_CHECK(b->stream_uses.empty());
          pending_events += static_cast<std::size_t>(b->event_count);
          for (int t : {int{kStatAll}, type}) {
            want.active[t].current += 1;
            want.active_bytes[t].current += n;
          }
          break;
      }
    }
    MEMFIT_CHECK(expect == seg->base + seg->size)
        << "blocks of segment " << hex_address(seg->base) << " do not cover it";
    MEMFIT_CHECK(!seg->expandable || mapped == seg->mapped)
        << "range " << hex_address(seg->base) << " says " << seg->mapped << " bytes mapped, "
        << "its blocks " << mapped;
  }
  for (int i = 0; i < alloc_detail::kPoolCount; ++i) {
    MEMFIT_CHECK(unmapped[i].size() == unmapped_in_set[i])
        << "unmapped set " << i << ": " << unmapped[i].size() << " entries, "
        << unmapped_in_set[i] << " unmapped blocks";
  }
  // Sets hold no duplicates, so equal counts plus membership above mean "exactly the free".
  for (int i = 0; i < alloc_detail::kPoolCount; ++i) {
    MEMFIT_CHECK(pools[i].size() == free_in_pool[i])
        << "pool " << i << ": " << pools[i].size() << " entries, " << free_in_pool[i] << " free";
  }
  MEMFIT_CHECK(reserved <= reserved_high);
  MEMFIT_CHECK(cached == free_cache_len)
      << cached << " cached blocks, " << free_cache_len << " in the free cache";
  MEMFIT_CHECK(live.size() == allocated) << live.size() << " vs " << allocated;
  MEMFIT_CHECK(pending.size() == pending_events) << pending.size() << " vs " << pending_events;
  for (const Pending& p : pending) MEMFIT_CHECK(p.block->state == NodeState::kPendingFree);
  MEMFIT_CHECK(static_cast<std::int64_t>(reserved) == stats.reserved_bytes[kStatAll].current);

  struct Named {
    const char* name;
    const StatArray& have;
    const StatArray& want;
  };
  const Named arrays[] = {
      {"allocation", stats.allocation, want.allocation},
      {"segment", stats.segment, want.segment},
      {"active", stats.active, want.active},
      {"inactive_split", stats.inactive_split, want.inactive_split},
      {"allocated_bytes", stats.allocated_bytes, want.allocated_bytes},
      {"reserved_bytes", stats.reserved_bytes, want.reserved_bytes},
      {"active_bytes", stats.active_bytes, want.active_bytes},
      {"inactive_split_bytes", stats.inactive_split_bytes, want.inactive_split_bytes},
      {"requested_bytes", stats.requested_bytes, want.requested_bytes},
  };
  for (const Named& a : arrays) {
    for (int t = 0; t < kStatTypeCount; ++t) {
      MEMFIT_CHECK(a.have[t].current == a.want[t].current)
          << a.name << "[" << t << "].current = " << a.have[t].current << ", blocks say "
          << a.want[t].current;
      MEMFIT_CHECK(a.have[t].peak >= a.have[t].current) << a.name << " peak below current";
    }
  }
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    MEMFIT_CHECK(stats.category_bytes[c].current == want.category_bytes[c].current)
        << "category_bytes." << category_name(static_cast<Category>(c));
  }
}

}  // namespace memfit
