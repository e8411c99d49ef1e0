// The allocator's event stream, for observers such as the profiler's Recorder.
//
//   auto id = allocator.add_listener([](const AllocatorEvent& e) { ... });
//   allocator.remove_listener(id);
//
// Kinds and meanings follow memory_viz's trace entries:
//   kAlloc            a block was handed to a caller (size = rounded block size)
//   kFreeRequested    the caller freed it; it may still wait on stream events
//   kFreeCompleted    it is back in the cache (right after kFreeRequested when no events wait)
//   kSegmentAlloc     a segment was obtained from the provider
//   kSegmentFree      a segment was returned to the provider
//   kSegmentMap       expandable segments: pages were mapped at [addr, addr + size)
//   kSegmentUnmap     expandable segments: pages were unmapped there
//   kOom              an allocation failed (size = requested bytes); OutOfMemory follows
// Listeners run synchronously under the allocator's lock, in registration order: they must
// be quick, must not call back into the allocator, and must not throw: an exception leaving a
// listener calls std::terminate (the event reports a change already made; the allocator cannot
// both hand out a block and report a failure). A listener that can fail (one that allocates
// host memory, say) catches inside and records the failure itself. With no listener
// registered, emitting an event costs one branch. All events of one public call carry the
// same time_ns, read once at the first of them from an EventClock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include "memory/category.h"
#include "memory/stream.h"

namespace memfit {

enum class EventKind : std::uint8_t {
  kAlloc,
  kFreeRequested,
  kFreeCompleted,
  kSegmentAlloc,
  kSegmentFree,
  kOom,
  kSegmentMap,
  kSegmentUnmap,
};

// "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "segment_map",
// "segment_unmap".
const char* event_kind_name(EventKind k);

struct AllocatorEvent {
  EventKind kind;
  std::uintptr_t addr;
  std::size_t size;
  StreamId stream;
  Category category;
  std::string_view tag;  // valid only during the callback
  std::int64_t time_ns;  // steady_clock's scale, nanoseconds (EventClock)
};

using AllocatorListener = std::function<void(const AllocatorEvent&)>;
using ListenerId = std::uint64_t;

// steady_clock time in nanoseconds, read cheaply: on x86-64 with an invariant TSC it reads the
// time-stamp counter (~13 ns against ~33 ns for steady_clock::now() on the development VM) and
// scales it by a rate measured against steady_clock, which it reads itself until 1 ms has
// passed and then every 2^23 ticks (a few ms) to refine the rate; elsewhere it is
// steady_clock. Readings never go backwards. Not thread-safe: one per user (the allocator reads
// its own under its lock). The idea is PyTorch's c10/util/ApproximateClock.h (rdtsc on x86,
// converted against a real clock).
class EventClock {
 public:
  EventClock();
  std::int64_t now_ns();
  bool uses_tsc() const { return use_tsc_; }

 private:
  bool use_tsc_ = false;
  std::uint64_t tsc0_ = 0, tsc_checked_ = 0;
  std::int64_t ns0_ = 0, last_ = 0;
  double ns_per_tick_ = 0;  // 0 until measured over at least 1 ms
};

}  // namespace memfit
