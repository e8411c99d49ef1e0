// CachingAllocator: a stream-aware caching allocator over any MemoryProvider, after
// PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp).
//
//   HostProvider host;
//   CachingAllocator alloc(host, alloc_conf_from_env());
//   Block x = alloc.allocate(n * sizeof(float), Category::kActivation, kDefaultStream, "fc1");
//   AllocatorStats s = alloc.stats();
//
// Policy, in short:
// - Sizes round up to 512 bytes (or to power-of-two divisions, see alloc_conf.h).
// - Small pool: blocks <= 1 MiB, carved from 2 MiB segments. Large pool: bigger blocks from
//   segments of the rounded size (requests < 10 MiB get 20 MiB segments, as in PyTorch). When
//   a 20 MiB segment does not fit (budget or provider), a segment of the request rounded up to
//   2 MiB is tried before the retry below (PyTorch reports OOM there).
// - Best fit by (stream, size) among cached free blocks; oversize blocks are split and the
//   remainder stays cached; on free, free neighbours in the same segment merge.
//   Blocks above max_split_size are not split and only serve requests close to their size.
// - A block freed after record_stream(other) waits for events on those streams before it is
//   reused (events come from the StreamSync given at construction; default: immediate).
// - Budget: reserved bytes never exceed config.budget. When the provider fails or the budget
//   would be exceeded, cached free segments are released and the request retried once; then
//   OutOfMemory is thrown whose message and info() give requested, allocated, reserved,
//   budget, the largest free block and the top categories in use. The allocator stays usable.
//
// Departures from PyTorch, both on by default, both switchable (alloc_conf.h):
// - separate_persistent_pools: gradient and optimizer_state blocks are served from segments of
//   their own (a second small and large pool, keyed like streams), so state created once
//   never lands in, and pins, a segment made for a big transient tensor. Parameters are not
//   in it: low-precision weight copies are made and dropped every step under that category,
//   and the parameters themselves arrive first, into segments of their own anyway.
// - release_before_growth: before a transient request lifts reserved memory above its
//   high-water mark, wholly free transient segments too small for it are returned to the
//   provider (idle longest first, only as many as keep the new segment under the mark).
//   PyTorch does this only after the provider fails. Persistent requests neither trigger it
//   nor lose segments to it. Once the mark covers a step, nothing grows and nothing is
//   released: no provider calls in the steady state.
//   Measured (build/bench/trace_replay_bench 4: GPT-2 124M trace, NullProvider; ratio =
//   reserved peak / live peak, calls = provider allocations in step 0 / 1 / 2-3):
//                                 B=4 ratio  calls       B=8 ratio  calls
//     both off (PyTorch's rules)    1.089    41 / 2 / 0    1.088    38 / 1 / 0
//     separate pools only           1.085    99 / 0 / 0    1.086    97 / 0 / 0
//     release only                  1.032    41 / 2 / 0    1.020    38 / 1 / 0
//     both (default)                1.027    99 / 0 / 0    1.018    97 / 0 / 0
//   (Step 0's extra calls are the persistent state's own segments, once.)
//   With parameters in the separate pools too, step 1 took 9 calls. The trade-off: with
//   max_split_size_mb:128 the release costs warm-up calls (B=8: 16 in step 1 and 1 in step 2,
//   against 1 / 0 without it); switch it off there.
//
// Expandable segments (expandable_segments:True; caching_allocator_expandable.cpp), after
// PyTorch's ExpandableSegment: per pool and stream one reserved address range (budget + 1/8
// with a budget, else kExpandableRange) whose pages are mapped when a request needs them. A
// request no mapped free block fits takes the lowest place where a free block and the
// unmapped pages after it (or unmapped pages alone) add up to it, and maps only the pages it
// lacks, merging with the free neighbours; blocks then split at any 512-byte boundary.
// empty_cache, the retry after a failure and garbage collection unmap the whole pages inside
// free blocks (pages shared with a live block stay) and give back ranges left with nothing
// mapped. Reserved = mapped bytes; the budget bounds them. Events: kSegmentMap /
// kSegmentUnmap per run of pages; snapshot() lists each mapped run as a segment
// (is_expandable), stats.segment counts those runs and inactive_split the free blocks that
// share one. num_device_alloc / num_device_free count maps and unmaps. Where memfit differs:
// - Pages are the device's granularity (2 MiB) in both pools; PyTorch maps its large pool in
//   20 MiB pages, which would cost up to 18 MiB per range under the small budgets memfit is
//   for.
// - release_before_growth has an expandable form: before a transient mapping lifts reserved
//   memory above its high-water mark, the whole free pages of transient blocks elsewhere are
//   unmapped (largest blocks first, never the grow's own) until it stays under, and the place
//   is looked for again. PyTorch unmaps only on empty_cache and after a failure.
// - The persistent pools (separate_persistent_pools) get ranges of their own.
// Measured (build/bench/trace_replay_bench 4; ratio = reserved peak / live peak, calls = maps
// in step 0 / 1 / 2-3):      B=4 ratio  calls        B=8 ratio  calls
//   expandable (default rules)    1.005    196 / 1 / 0    1.003    197 / 1 / 0
//   expandable, PyTorch's rules   1.067     44 / 2 / 0    1.071     40 / 1 / 0
//   segments (defaults, above)    1.027     99 / 0 / 0    1.018     97 / 0 / 0
// The dry run predicts this mode byte-exactly too: NullProvider models the pages.
//
// Fast path (caching_allocator_impl.h has the data structures): a cached size costs one lock,
// a best-fit lookup, a split or none, stats; a freed small block waits unmerged in a short
// free cache for a repeat of its size. Instructions per allocate + free pair (valgrind, Release
// build; before -> after the free cache and separate pools): 4 KiB 888 -> 685, 32 MiB (no split
// either way) 762 -> 783. build/bench/allocator_bench, best of 3 runs on the shared 2-core
// development VM: 4 KiB ~80 -> ~54 ns. With a listener, each public call reads the clock once
// for all its events, from an EventClock (TSC, ~13 ns, instead of steady_clock's ~33 ns here):
// a no-op listener's cost per pair fell from ~60 to ~40 ns.
//
// Errors: allocate(0) and sizes beyond any provider (> 2^50 bytes) throw InvalidArgument;
// free of a pointer not allocated here, or freed twice, throws InvalidArgument naming the
// address. Broken invariants are MEMFIT_CHECK failures; with config.debug_checks (or the
// MEMFIT_DEBUG_CHECKS build) every operation ends with a whole-structure check.
//
// Thread safety: every public method takes one internal mutex, so any thread may allocate
// and free; config() returns a copy taken under it. Listeners run under that mutex and must
// not throw (allocator_event.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "memory/alloc_conf.h"
#include "memory/allocator_event.h"
#include "memory/allocator_stats.h"
#include "memory/block.h"
#include "memory/category.h"
#include "memory/provider.h"
#include "memory/snapshot.h"
#include "memory/stream.h"

namespace memfit {

inline constexpr std::size_t kMinBlockSize = 512;                   // granule
inline constexpr std::size_t kSmallSize = std::size_t{1} << 20;     // <= this: small pool
inline constexpr std::size_t kSmallBuffer = std::size_t{2} << 20;   // small pool segment
inline constexpr std::size_t kLargeBuffer = std::size_t{20} << 20;  // segment for < 10 MiB
inline constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;
inline constexpr std::size_t kRoundLarge = std::size_t{2} << 20;  // large segments round to
inline constexpr std::size_t kMaxAllocationSize = std::size_t{1} << 50;
// Expandable segments: the address range reserved per pool and stream when there is no
// budget (with one: budget + 1/8). A pool that outgrows it gets a second range.
inline constexpr std::size_t kExpandableRange = std::size_t{256} << 30;

class CachingAllocator {
 public:
  // `provider` and `sync` must outlive the allocator; sync == nullptr means immediate events.
  explicit CachingAllocator(MemoryProvider& provider, AllocatorConfig config = {},
                            StreamSync* sync = nullptr);
  // Returns every segment to the provider. Blocks still live at this point are a caller bug:
  // it is reported on stderr (count and bytes) and their memory is returned anyway.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // `tag` (the layer's name) is copied; it shows in snapshots, events and OOM messages.
  Block allocate(std::size_t bytes, Category category, StreamId stream = kDefaultStream,
                 std::string_view tag = {});
  // Raw-pointer form for code that manages lifetimes itself; pair with free().
  void* allocate_raw(std::size_t bytes, Category category, StreamId stream = kDefaultStream,
                     std::string_view tag = {});
  void free(void* ptr);

  // The block at `ptr` is also used by work on `stream`; its reuse waits for that work.
  void record_stream(void* ptr, StreamId stream);

  // Returns all cached free segments to the provider (waiting for pending events first).
  void empty_cache();

  void set_budget(std::size_t bytes);  // 0 = unlimited; takes effect on the next allocation
  std::size_t budget() const;

  // Test hook: the nth allocate()/allocate_raw() from now (1: the next; persistent or not,
  // served from the cache or not) throws the OutOfMemory a budget failure throws (num_ooms
  // counts it, its message says it was injected), before anything of that request changes the
  // allocator; later calls succeed again. 0 disarms; negative: InvalidArgument. Counting costs
  // one predicted branch per allocation under the lock, nothing else, when off.
  // pending_fault() is what is left of the count (0: fired or off).
  //   alloc.fail_allocation(k);  try { trainer.step(b); } catch (const OutOfMemory&) { ... }
  void fail_allocation(std::int64_t nth);
  std::int64_t pending_fault() const;

  AllocatorStats stats() const;
  void reset_peak_stats();         // every peak := current
  void reset_accumulated_stats();  // allocated/freed counters and num_* := 0

  Snapshot snapshot() const;

  // Rounded size a request of `bytes` would occupy (what stats count).
  std::size_t round_size(std::size_t bytes) const;

  ListenerId add_listener(AllocatorListener listener);
  void remove_listener(ListenerId id);

  // Runs the whole-structure check now (no-op cost outside tests). Throws CheckFailure.
  void check_invariants() const;

  // A copy, taken under the lock (set_budget may change it concurrently).
  AllocatorConfig config() const;
  MemoryProvider& provider() const;

 private:
  friend class Block;
  void free_block(void* node);
  void record_stream_block(void* node, StreamId stream);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memfit
