// Private to the caching allocator (memory/caching_allocator*.cpp); not API.
//
// Data structures, after PyTorch's CUDACachingAllocator (c10/cuda/CUDACachingAllocator.cpp):
// - BlockNode: one contiguous range of a segment, linked to its address neighbours
//   (prev/next) so a free can merge in O(1).
// - Pools of free blocks, each a std::set ordered by (stream, size, address): best fit is one
//   lower_bound. PyTorch has two (small, large); memfit has four: small and large, each split
//   by lifetime (transient, persistent: see caching_allocator.h), indexed by PoolIndex.
// - PtrMap: address -> live block, for free(void*) and for telling a foreign pointer from a
//   double free.
// Where memfit differs, for the fast path (no heap allocation once warm):
// - Each BlockNode owns one std::set node (a C++17 node handle) from birth, and retired
//   BlockNodes go to a free list, so split / merge / pool insert / pool erase allocate nothing
//   after warm-up. PyTorch news and deletes a Block on every split and merge.
// - Split and merge re-key the tree node in place when the order allows (pool_transfer).
// - PtrMap is an open-addressing table (no per-entry node) instead of a node-based hash map.
// - The free cache: a small-pool block freed with no stream events to wait for is not merged
//   at once but parked (state kCached) in a short list that the next request of the same
//   (pool, stream, size) takes from directly, newest first. A 4 KiB allocate + free pair then
//   neither splits nor merges its 2 MiB segment (caching_allocator.h has the figures). Cached
//   blocks are merged into their pools when the list is full (the oldest), on any request
//   the list cannot serve (all of them, before best fit), and before empty_cache, so every
//   other path sees merged pools. For stats and snapshots they are inactive blocks of a
//   split segment (two may sit side by side); the invariant check knows the state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "memory/caching_allocator.h"

namespace memfit::alloc_detail {

// kFree: merged, in its pool. kCached: free, unmerged, in the free cache (small pool only).
// kUnmapped: pages of an expandable segment with no memory behind them, in its pool's
// unmapped set; never next to another kUnmapped block (they merge).
enum class NodeState : std::uint8_t { kFree, kAllocated, kPendingFree, kCached, kUnmapped };

struct BlockNode;

// A pool entry carries its key inline so that tree searches compare without touching the
// BlockNodes (one cache miss per level saved). Pools order by (stream, size, place), where a
// block's place is (its segment's creation number, its offset in the segment): the order
// PyTorch gets from addresses, but independent of where the provider put the segments, so
// the same request sequence makes the same choices over host memory, device memory and a
// NullProvider's dry run (the planner's prediction rests on that). SearchKey finds the
// smallest fitting block of a stream.
struct PoolEntry {
  StreamId stream;
  std::size_t size;
  std::uint64_t segment_seq;
  std::size_t offset;
  BlockNode* block;
};
struct SearchKey {
  StreamId stream;
  std::size_t size;
};
struct PoolLess {
  using is_transparent = void;
  bool operator()(const PoolEntry& a, const PoolEntry& b) const {
    if (a.stream != b.stream) return a.stream < b.stream;
    if (a.size != b.size) return a.size < b.size;
    if (a.segment_seq != b.segment_seq) return a.segment_seq < b.segment_seq;
    return a.offset < b.offset;
  }
  bool operator()(const PoolEntry& a, const SearchKey& k) const {
    return a.stream != k.stream ? a.stream < k.stream : a.size < k.size;
  }
  bool operator()(const SearchKey& k, const PoolEntry& b) const {
    // A key sorts before every block of its size (as if its place were the first).
    return k.stream != b.stream ? k.stream < b.stream : k.size <= b.size;
  }
};
using PoolSet = std::set<PoolEntry, PoolLess>;

// Pool index: bit 0 = large, bit 1 = persistent.
inline constexpr int kPoolCount = 4;
inline int pool_index(bool is_large, bool persistent) {
  return (is_large ? 1 : 0) | (persistent ? 2 : 0);
}

// A segment is one provider allocation, or (expandable) one reserved address range of which
// `mapped` bytes have memory behind them, in page-aligned runs between kUnmapped blocks.
struct Segment {
  std::uint64_t seq = 0;  // creation number: 1, 2, ... (pool order; see PoolEntry)
  std::uintptr_t base = 0;
  std::size_t size = 0;
  bool expandable = false;
  std::size_t mapped = 0;  // expandable: bytes mapped (what counts as reserved)
  StreamId stream = kDefaultStream;
  bool is_large = false;
  bool persistent = false;    // serves only persistent categories (and they only it)
  int pool = 0;               // pool_index(is_large, persistent)
  BlockNode* head = nullptr;  // the block at `base`

  std::size_t reserved_bytes() const { return expandable ? mapped : size; }
};

struct BlockNode {
  std::uintptr_t addr = 0;
  std::size_t size = 0;       // rounded
  std::size_t requested = 0;  // caller's bytes while allocated or pending, else 0
  StreamId stream = kDefaultStream;
  Segment* segment = nullptr;
  BlockNode* prev = nullptr;  // address neighbours within the segment
  BlockNode* next = nullptr;
  const std::string* tag = nullptr;  // interned; nullptr = no tag
  std::uint64_t free_seq = 0;        // when it last entered a pool; garbage collection age
  int event_count = 0;               // outstanding stream events while pending
  NodeState state = NodeState::kFree;
  Category category = Category::kUnknown;
  std::vector<StreamId> stream_uses;  // other streams recorded with record_stream
  PoolSet::iterator pool_it;          // valid while the block is in its pool
  PoolSet::node_type handle;          // the set node, held while the block is out of its pool

  // Shares its (mapped run of a) segment with other blocks: an unmapped neighbour does not
  // count, so the figure matches the segments snapshot() reports.
  bool is_split() const {
    return (prev != nullptr && prev->state != NodeState::kUnmapped) ||
           (next != nullptr && next->state != NodeState::kUnmapped);
  }
  PoolEntry entry() const {
    return PoolEntry{stream, size, segment->seq, addr - segment->base,
                     const_cast<BlockNode*>(this)};
  }
  int stat_type() const { return segment->is_large ? kStatLargePool : kStatSmallPool; }
};

// Address -> live block. Linear probing with backward-shift deletion, load <= 1/2; grows
// (the only allocation) when the number of live blocks reaches a new high.
class PtrMap {
 public:
  PtrMap() { rehash(1024); }
  BlockNode* find(std::uintptr_t key) const {
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].value;
      if (slots_[i].key == 0) return nullptr;
    }
  }
  // Makes room for one more entry, so that the insert() after it cannot fail.
  void reserve_one() {
    if (__builtin_expect(2 * (size_ + 1) > slots_.size(), 0)) rehash(2 * slots_.size());
  }
  void insert(std::uintptr_t key, BlockNode* value) {
    reserve_one();
    std::size_t i = home(key);
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i] = {key, value};
    ++size_;
  }
  // Removes `key`; returns its block, or nullptr when absent.
  BlockNode* erase(std::uintptr_t key) {
    std::size_t i = home(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return nullptr;
      i = (i + 1) & mask_;
    }
    BlockNode* value = slots_[i].value;
    // Shift later members of the probe run back so that lookups never cross a hole.
    for (std::size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      const std::size_t h = home(slots_[j].key);
      const bool stays = (i <= j) ? (i < h && h <= j) : (i < h || h <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = {0, nullptr};
    --size_;
    return value;
  }
  std::size_t size() const { return size_; }

 private:
  struct Slot {
    std::uintptr_t key = 0;  // 0 = empty; providers never return address 0
    BlockNode* value = nullptr;
  };
  std::size_t home(std::uintptr_t key) const {
    // Fibonacci hashing: block addresses are multiples of 512, so low bits carry nothing.
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void rehash(std::size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    shift_ = 64 - __builtin_ctzll(capacity);
    size_ = 0;
    for (const Slot& s : old)
      if (s.key != 0) insert(s.key, s.value);
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  int shift_ = 0;
  std::size_t size_ = 0;
};

inline void stat_increase(StatArray& a, int type, std::int64_t n) {
  a[kStatAll].increase(n);
  a[type].increase(n);
}
inline void stat_decrease(StatArray& a, int type, std::int64_t n) {
  a[kStatAll].decrease(n);
  a[type].decrease(n);
}
inline std::int64_t i64(std::size_t n) { return static_cast<std::int64_t>(n); }

std::string hex_address(std::uintptr_t a);  // "0x7e0000000000", for messages

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace memfit::alloc_detail

namespace memfit {

// Hidden: calls between its members then bind directly (no PLT hop, inlinable) in the shared
// library; nothing outside libmemfit names it.
struct __attribute__((visibility("hidden"))) CachingAllocator::Impl {
  using BlockNode = alloc_detail::BlockNode;
  using Segment = alloc_detail::Segment;
  using PoolSet = alloc_detail::PoolSet;

  Impl(MemoryProvider& p, AllocatorConfig c, StreamSync* s);
  ~Impl();

  // ---- operations; the caller holds mu ------------------------------------------------------
  BlockNode* malloc(std::size_t bytes, Category category, StreamId stream, std::string_view tag);
  void free_requested(BlockNode* b);  // caller's free: pending on events, or back to the pool
  void record_stream(BlockNode* b, StreamId stream);
  void empty_cache();
  void check() const;  // the whole-structure check
  void after_op() const {
    if (__builtin_expect(debug_checks, 0)) check();
  }
  [[noreturn]] void bad_pointer(const char* op, std::uintptr_t addr) const;
  std::size_t round_size(std::size_t bytes) const;
  static void validate_request(std::size_t bytes, const char* op);

  // ---- internals (caching_allocator.cpp) ----------------------------------------------------
  PoolSet& pool_of(const BlockNode* b) { return pools[b->segment->pool]; }
  bool persistent_pool_for(Category c) const {
    // Not kParameter: low-precision weight copies are made and dropped every step under it.
    return config.separate_persistent_pools &&
           (c == Category::kGradient || c == Category::kOptimizerState);
  }
  BlockNode* find_free_block(PoolSet& pool, StreamId stream, std::size_t size);  // stays in pool
  BlockNode* new_block_slow(int pool, std::size_t bytes, std::size_t size, StreamId stream,
                            Category category, const std::string* tag);
  bool should_split(const BlockNode* b, std::size_t size) const;
  BlockNode* new_segment_block(std::size_t size, StreamId stream, bool persistent);
  BlockNode* alloc_segment(std::size_t seg_size, bool is_large, bool persistent, StreamId stream);
  void release_unfit_segments(std::size_t size, std::size_t seg_size);
  // Expandable segments (caching_allocator_expandable.cpp).
  BlockNode* expandable_block(int pool, std::size_t size, StreamId stream);  // out of the pool
  BlockNode* find_expandable(int pool, std::size_t size, StreamId stream) const;
  BlockNode* new_expandable_segment(int pool, std::size_t size, StreamId stream);
  BlockNode* map_block(BlockNode* u, std::size_t bytes);  // the free block holding it, or null
  bool unmap_block(BlockNode* b);                         // b free: unmaps its whole pages
  void merge_unmapped(BlockNode* b);                      // and into the unmapped set
  std::size_t pages_to_map(const BlockNode* c, std::size_t size) const;
  bool unmap_idle_pages(const BlockNode* keep, std::size_t size, std::size_t need);
  void unmap_free_pages();                                // every free page; empties ranges
  void release_expandable_segment(Segment* seg);          // all of it unmapped
  void unmapped_insert(BlockNode* b);
  void unmapped_remove(BlockNode* b);
  void pool_insert(BlockNode* b);
  void pool_remove(BlockNode* b);
  void pool_transfer(BlockNode* from, BlockNode* to);
  void count_in_pool(const BlockNode* b, int sign);
  void free_completed(BlockNode* b);   // a pending free whose events have all completed
  void merge_into_pool(BlockNode* b);  // deactivate, then merge_free
  void deactivate(BlockNode* b);       // no longer active: stats and the caller's fields
  void merge_free(BlockNode* b);       // merge with free neighbours, back into the pool
  BlockNode* take_cached(int pool, StreamId stream, std::size_t size);
  void cache_free(BlockNode* b);       // b deactivated; evicts (merges) the oldest when full
  void flush_free_cache();             // merges every cached block into its pool
  void process_events();               // completes frees whose events have all finished
  void synchronize_events();           // waits for every pending event, completes those frees
  void release_segment(BlockNode* b);  // b covers a whole free segment
  std::vector<BlockNode*> whole_free_segments() const;  // their blocks, any pool
  void release_free_segments();
  void garbage_collect();
  [[noreturn]] void out_of_memory(std::size_t bytes, StreamId stream, Category category,
                                  const std::string* tag);
  void grow_spare();
  BlockNode* node_from_spare();
  void node_to_spare(BlockNode* b);
  const std::string* intern(std::string_view tag);
  void emit(EventKind kind, std::uintptr_t addr, std::size_t size, StreamId stream,
            Category category, const std::string* tag) {
    if (__builtin_expect(has_listeners, 0)) emit_slow(kind, addr, size, stream, category, tag);
  }
  void emit_slow(EventKind kind, std::uintptr_t addr, std::size_t size, StreamId stream,
                 Category category, const std::string* tag) noexcept;
  // Called by every public method that may emit, under the lock: its events share one clock
  // reading, taken at the first of them.
  void begin_op() { event_time = kNoTime; }

  // ---- state --------------------------------------------------------------------------------
  MemoryProvider& provider;
  AllocatorConfig config;
  ImmediateStreamSync immediate;
  StreamSync* sync;
  bool debug_checks;
  mutable std::mutex mu;

  PoolSet pools[alloc_detail::kPoolCount];
  // Expandable segments: unmapped blocks, by the pools' order (stream, size, place).
  PoolSet unmapped[alloc_detail::kPoolCount];
  std::size_t page = 0;  // provider.page_size() when expandable_segments is on, else 0
  std::map<std::uintptr_t, Segment*> segments;  // by base address
  alloc_detail::PtrMap live;                    // active_allocated blocks
  struct Pending {
    EventHandle event;
    BlockNode* block;
  };
  std::vector<Pending> pending;  // recorded events of pending frees, oldest first
  std::vector<BlockNode*> spare;
  struct CachedFree {  // the key inline, so a lookup touches no BlockNode
    std::size_t size;
    StreamId stream;
    int pool;
    BlockNode* block;
  };
  static constexpr int kFreeCacheSlots = 8;
  CachedFree free_cache[kFreeCacheSlots];  // oldest first
  int free_cache_len = 0;
  Segment* fresh_segment = nullptr;  // obtained by this malloc; its event is still due
  std::size_t reserved = 0;          // == stats.reserved_bytes[kStatAll].current
  std::size_t reserved_high = 0;     // the most ever reserved (reset_peak_stats leaves it)
  std::uint64_t free_seq = 0;
  std::uint64_t segment_seq = 0;  // segments made so far (Segment::seq)
  enum class Failure { kNone, kBudget, kProvider, kInjected } last_failure = Failure::kNone;
  std::int64_t fail_countdown = 0;  // fail_allocation(): the malloc that takes it to 0 throws
  AllocatorStats stats;

  std::unordered_set<std::string, alloc_detail::StringHash, std::equal_to<>> tags;
  const std::string* last_tag = nullptr;  // the previous request's tag, looked up first

  static constexpr std::int64_t kNoTime = -1;
  std::int64_t event_time = kNoTime;  // this public call's event time, once read
  EventClock clock;
  bool has_listeners = false;
  ListenerId next_listener = 1;
  std::vector<std::pair<ListenerId, AllocatorListener>> listeners;
};

}  // namespace memfit
