// Recorder: listens to a caching allocator and to ScopedRanges and keeps what happened, for the
// exporters (profiler/report.h).
//
//   CachingAllocator alloc(provider, conf, &be.stream_sync());
//   Recorder rec(alloc, {.capacity = 1 << 20});
//   ... train: the runtime opens ScopedRanges (step, forward, block "h3", ...) ...
//   Recording r = rec.recording();            // a copy; recording goes on
//   r.peak.by_category[size_t(Category::kActivation)], interned_name(r.peak.block), ...
//
// What it keeps:
// - Allocator events (memory/allocator_event.h) with the phase and block open on the thread
//   that caused them (profiler/scoped_range.h) and the allocator's totals right after them, in
//   a ring buffer of `capacity` events: when full, the oldest is dropped and counted
//   (dropped_events), and its effect is folded into `base` so the kept events still replay to
//   the right totals (by_category at events[i] = base + the deltas of events[0..i]).
// - Range begins/ends, paired into RangeRecords, in a ring of `range_capacity` (dropped_ranges).
// - Exact figures over the whole recording whatever was dropped, computed as events arrive:
//   peak allocated and reserved, and at the moment of the peak of allocated bytes: bytes by
//   category, the phase and block, and live bytes per block (the block open when each live
//   allocation was made; 0 = outside any block).
// - The same figures for the steps alone (step_peak, step_peak_reserved): from when the
//   Recorder hears the first step range (RangeKind::kStep) begin, the state then included, to
//   the end (or, when a step range is already open at the Recorder's start or clear(), from
//   then). That is what a plan's dry run predicts; the whole-run peak also covers setup
//   (building the model and optimizer: RangeKind::kSetup), which can briefly hold more. "When
//   it hears" is the order events and range begins take the Recorder's lock: an allocation
//   on a worker thread stamped just after the step's begin but heard before it counts as
//   setup's (the state it leaves is still the steps' first candidate).
//
// Totals: allocated = sum of live block sizes (kAlloc adds, kFreeRequested subtracts),
// reserved = sum of segment sizes (kSegmentAlloc / kSegmentFree), as the allocator's own
// allocated_bytes / reserved_bytes; figures start from the allocator's stats at construction
// (blocks live before the Recorder existed count, in category and block 0, as "before").
//
// - Pinned host memory by category (profiler/host_region.h): each region's coming and going, in
//   a ring of `range_capacity` (regions are a handful per run), its peak and its state now;
//   regions live when the Recorder started are its host base.
//
// Cost: one ring-buffer write and two hash-map operations per event under the recorder's own
// mutex, plus a copy of the per-block totals when an event sets a new peak
// (bench/recorder_overhead_bench measures it against a training step: target <= 5%).
// Thread-safe. The allocator must outlive the Recorder (or stop() must have been called).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "memory/allocator_event.h"
#include "memory/caching_allocator.h"
#include "memory/category.h"
#include "profiler/host_region.h"
#include "profiler/scoped_range.h"

namespace memfit {

struct RecorderOptions {
  std::size_t capacity = std::size_t{1} << 20;        // allocator events kept (>= 1)
  std::size_t range_capacity = std::size_t{1} << 16;  // closed ranges kept (>= 1)
};

struct TimelineEvent {
  std::int64_t time_ns = 0;
  EventKind kind = EventKind::kAlloc;
  Category category = Category::kUnknown;
  StreamId stream = kDefaultStream;
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::uint32_t tag = 0;    // interned allocation tag
  std::uint32_t phase = 0;  // interned phase name (PhaseContext::phase)
  RangeKind phase_kind = RangeKind::kOther;
  std::uint32_t block = 0;    // interned block name
  std::size_t allocated = 0;  // totals after this event
  std::size_t reserved = 0;
};

struct RangeRecord {
  RangeKind kind = RangeKind::kOther;
  std::uint32_t name = 0;
  std::int64_t begin_ns = 0;
  std::int64_t end_ns = 0;  // == begin_ns when still open at recording() time
  std::uint64_t thread = 0;
  int depth = 0;
  // Step ranges: 1 for the first the Recorder heard begin, 2 for the next, ... whatever the ring
  // dropped, counted from its start (clear() does not restart the count; the Trainer names every
  // step "step"); 0 for other ranges and for a step open before the Recorder started.
  std::uint32_t ordinal = 0;
};

struct BlockBytes {
  std::uint32_t block = 0;  // interned; 0: outside any block
  std::size_t bytes = 0;
};

struct PeakInfo {
  std::size_t allocated = 0;  // the peak of allocated bytes
  std::int64_t time_ns = 0;   // when it was first reached
  CategoryBytes by_category{};
  std::uint32_t phase = 0;
  std::uint32_t block = 0;
  std::vector<BlockBytes> blocks;  // live bytes per block at the peak, largest first
};

// How an event changes bytes by category (allocated moves with it; reserved does not): an
// alloc adds its size to its category, a free request takes it away (never below 0).
void apply_event(CategoryBytes& by_category, const TimelineEvent& e);

struct Recording {
  std::int64_t start_ns = 0;  // the Recorder's construction (steady_clock ns, as every time here)
  // Unix-epoch ns at start_ns (system_clock), so exporters can write wall-clock times:
  // epoch_ns(t) = start_epoch_ns + (t - start_ns).
  std::int64_t start_epoch_ns = 0;
  std::int64_t epoch_ns(std::int64_t t) const { return start_epoch_ns + (t - start_ns); }
  std::int64_t end_ns = 0;            // recording() time (or stop())
  std::vector<TimelineEvent> events;  // oldest first
  std::uint64_t dropped_events = 0;
  CategoryBytes base_by_category{};  // state just before events.front()
  std::size_t base_allocated = 0;
  std::size_t base_reserved = 0;
  std::vector<RangeRecord> ranges;  // by begin time
  std::uint64_t dropped_ranges = 0;
  PeakInfo peak;  // the whole recording's
  std::size_t peak_reserved = 0;
  // The steps' (see above), valid when has_steps(); steps_peak() and steps_peak_reserved() are
  // these, else the whole recording's: what exporters report as the step peak.
  std::int64_t steps_begin_ns = -1;
  PeakInfo step_peak;
  std::size_t step_peak_reserved = 0;
  bool has_steps() const { return steps_begin_ns >= 0; }
  const PeakInfo& steps_peak() const { return has_steps() ? step_peak : peak; }
  std::size_t steps_peak_reserved() const {
    return has_steps() ? step_peak_reserved : peak_reserved;
  }
  CategoryBytes current_by_category{};
  std::size_t current_allocated = 0;
  std::size_t current_reserved = 0;
  // Events or ranges a listener failed to store (out of host memory): the totals and the peak
  // stay exact, the replay from base and the per-block figures may not. 0 in practice.
  std::uint64_t listener_failures = 0;

  // Pinned host memory, by category: host_events[i].after is the state after event i, from
  // host_base (the state before host_events.front(); dropped events fold into it).
  std::vector<HostRegionEvent> host_events;
  std::uint64_t dropped_host_events = 0;
  CategoryBytes host_base{};
  std::size_t host_peak = 0;      // the most pinned at once
  std::int64_t host_peak_ns = 0;  // when it was first reached
  CategoryBytes host_at_peak{};   // by category then
  CategoryBytes host_current{};
  bool has_host() const { return host_peak > 0 || !host_events.empty(); }  // offload pinned any

  // by_category after events[i], replayed from base (O(i)); exporters walk events in order
  // instead and keep a running sum.
  CategoryBytes by_category_at(std::size_t i) const;
};

class Recorder {
 public:
  explicit Recorder(CachingAllocator& alloc, RecorderOptions options = {});
  ~Recorder();  // stop()
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  void stop();  // stops listening; what was recorded stays readable
  Recording recording() const;
  void clear();  // drops everything recorded so far (totals and live blocks stay known)

 private:
  struct State;
  CachingAllocator* alloc_;
  std::unique_ptr<State> state_;
};

}  // namespace memfit
