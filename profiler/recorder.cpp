#include "profiler/recorder.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "memory/error.h"

namespace memfit {

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A bounded FIFO: grows like a vector up to `cap` (a recorder with a big capacity that sees few
// events costs only what it holds), then overwrites the oldest.
template <typename T>
class Ring {
 public:
  explicit Ring(std::size_t cap) : cap_(cap) {}
  // Returns true and the overwritten element in *dropped when the ring was full.
  bool push(const T& v, T* dropped) {
    if (items_.size() < cap_) {
      items_.push_back(v);
      return false;
    }
    *dropped = std::move(items_[head_]);
    items_[head_] = v;
    head_ = (head_ + 1) % cap_;
    return true;
  }
  std::vector<T> in_order() const {
    std::vector<T> out;
    out.reserve(items_.size());
    out.insert(out.end(), items_.begin() + static_cast<std::ptrdiff_t>(head_), items_.end());
    out.insert(out.end(), items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(head_));
    return out;
  }
  bool empty() const { return items_.empty(); }
  void clear() {
    items_.clear();
    head_ = 0;
  }

 private:
  std::size_t cap_;
  std::vector<T> items_;
  std::size_t head_ = 0;  // the oldest element once full
};

// The last tags seen and their ids, so most events skip intern_name's process-wide lock and
// hash: a direct-mapped cache on the tag's address, confirmed by comparing the text (the
// address is only a hint: the event's tag is valid during the callback alone).
class TagCache {
 public:
  std::uint32_t id(std::string_view tag) {
    if (tag.empty()) return 0;
    Entry& e = entries_[(reinterpret_cast<std::uintptr_t>(tag.data()) >> 3) % kEntries];
    if (e.id != 0 && e.text == tag) return e.id;
    e.id = intern_name(tag);
    e.text.assign(tag);
    return e.id;
  }

 private:
  static constexpr std::size_t kEntries = 64;
  struct Entry {
    std::uint32_t id = 0;
    std::string text;
  };
  Entry entries_[kEntries];
};

struct OpenRange {
  RangeKind kind;
  std::uint32_t name;
  std::int64_t begin_ns;
  int depth;
  std::uint32_t ordinal;  // step ranges' (RangeRecord::ordinal)
};

}  // namespace

struct Recorder::State {
  explicit State(const RecorderOptions& o)
      : events(o.capacity), ranges(o.range_capacity), host_events(o.range_capacity) {}

  mutable std::mutex mu;
  ListenerId alloc_listener = 0;
  std::uint64_t range_listener = 0;
  std::uint64_t host_listener = 0;
  bool stopped = false;

  std::int64_t start_ns = 0;
  std::int64_t start_epoch_ns = 0;
  std::int64_t stop_ns = 0;
  Ring<TimelineEvent> events;
  std::uint64_t dropped_events = 0;
  CategoryBytes base_by_category{};
  std::size_t base_allocated = 0, base_reserved = 0;

  Ring<RangeRecord> ranges;
  std::uint64_t dropped_ranges = 0;
  std::unordered_map<std::uint64_t, std::vector<OpenRange>> open;  // by thread number

  // The state now, kept whatever the rings dropped.
  CategoryBytes by_category{};
  std::size_t allocated = 0, reserved = 0;
  std::unordered_map<std::uintptr_t, std::uint32_t> live;     // block by address
  std::unordered_map<std::uint32_t, std::size_t> block_live;  // bytes by block

  Ring<HostRegionEvent> host_events;
  std::uint64_t dropped_host_events = 0;
  CategoryBytes host_base{}, host{}, host_at_peak{};
  std::size_t host_peak = 0;
  std::int64_t host_peak_ns = 0;

  PeakInfo peak;  // blocks unsorted until recording()
  std::size_t peak_reserved = 0;
  std::int64_t steps_begin_ns = -1;  // the first step range's begin; -1: none yet
  std::uint32_t steps_begun = 0;     // step ranges heard begin since the start (clear() keeps it)
  PeakInfo step_peak;
  std::size_t step_peak_reserved = 0;
  std::uint64_t listener_failures = 0;
  TagCache tags;

  // The state now as `p`.
  void take(PeakInfo& p, std::int64_t t, std::uint32_t phase, std::uint32_t block) const {
    p.allocated = allocated;
    p.time_ns = t;
    p.by_category = by_category;
    p.phase = phase;
    p.block = block;
    p.blocks.clear();
    for (const auto& [b, bytes] : block_live) {
      if (bytes > 0) p.blocks.push_back(BlockBytes{b, bytes});
    }
  }
  void take_peak(std::int64_t t, std::uint32_t phase, std::uint32_t block) {
    take(peak, t, phase, block);
  }
  // The steps begin at t: the state now is their first peak candidate.
  void arm_steps(std::int64_t t, std::uint32_t phase) {
    steps_begin_ns = t;
    take(step_peak, t, phase, 0);
    step_peak_reserved = reserved;
  }

  // The peak and the rings restart from the state now (construction and clear()).
  void restart(std::int64_t t) {
    start_ns = t;
    start_epoch_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    events.clear();
    ranges.clear();
    dropped_events = dropped_ranges = 0;
    base_by_category = by_category;
    base_allocated = allocated;
    base_reserved = reserved;
    const PhaseContext ctx = current_phase();  // the calling thread's, the best guess we have
    take_peak(t, ctx.phase, ctx.block);
    peak_reserved = reserved;
    // The steps' peak restarts too: from now if a step is under way (a range heard open, or
    // one open on the calling thread, which a Recorder made inside a step has not heard),
    // else from the next step range's begin.
    steps_begin_ns = -1;
    step_peak = PeakInfo{};
    step_peak_reserved = 0;
    bool in_step = false;
    for (const auto& [thread, stack] : open) {
      for (const OpenRange& o : stack) in_step = in_step || o.kind == RangeKind::kStep;
    }
    for (const RangeFrame& f : current_ranges()) in_step = in_step || f.kind == RangeKind::kStep;
    if (in_step) arm_steps(t, ctx.phase);
    host_events.clear();
    dropped_host_events = 0;
    host_base = host_at_peak = host;
    host_peak = total_bytes(host);
    host_peak_ns = t;
  }

  void on_event(const AllocatorEvent& e);
  void on_range(const RangeEvent& e);
  void on_host(const HostRegionEvent& e);
};

void Recorder::State::on_host(const HostRegionEvent& e) {
  std::lock_guard lock(mu);
  if (stopped) return;
  host = e.after;
  if (total_bytes(host) > host_peak) {
    host_peak = total_bytes(host);
    host_peak_ns = e.time_ns;
    host_at_peak = host;
  }
  HostRegionEvent old;
  if (host_events.push(e, &old)) {
    ++dropped_host_events;
    host_base = old.after;
  }
}

void Recorder::State::on_event(const AllocatorEvent& e) {
  const PhaseContext ctx = current_phase();  // the thread that caused the event
  std::lock_guard lock(mu);
  if (stopped) return;
  TimelineEvent ev;
  ev.time_ns = e.time_ns;
  ev.kind = e.kind;
  ev.category = e.category;
  ev.stream = e.stream;
  ev.addr = e.addr;
  ev.size = e.size;
  ev.phase = ctx.phase;
  ev.phase_kind = ctx.phase_kind;
  ev.block = ctx.block;
  // Totals first: they allocate nothing, so they stay exact even if a map insert below fails.
  switch (e.kind) {
    case EventKind::kAlloc:
      allocated += e.size;
      break;
    case EventKind::kFreeRequested:
      allocated -= std::min(allocated, e.size);
      break;
    case EventKind::kSegmentAlloc:
    case EventKind::kSegmentMap:
      reserved += e.size;
      break;
    case EventKind::kSegmentFree:
    case EventKind::kSegmentUnmap:
      reserved -= std::min(reserved, e.size);
      break;
    case EventKind::kFreeCompleted:
    case EventKind::kOom:
      break;
  }
  apply_event(by_category, ev);
  ev.allocated = allocated;
  ev.reserved = reserved;
  if (reserved > peak_reserved) peak_reserved = reserved;
  const bool steps = steps_begin_ns >= 0;
  if (steps && reserved > step_peak_reserved) step_peak_reserved = reserved;
  ev.tag = tags.id(e.tag);  // may allocate: after the totals

  if (e.kind == EventKind::kAlloc) {
    block_live[ctx.block] += e.size;
    if (allocated > peak.allocated) take_peak(e.time_ns, ctx.phase, ctx.block);
    if (steps && allocated > step_peak.allocated) take(step_peak, e.time_ns, ctx.phase, ctx.block);
    live[e.addr] = ctx.block;
  } else if (e.kind == EventKind::kFreeRequested) {
    // A block made before the Recorder existed is not in `live`: it counted in block 0.
    std::uint32_t block = 0;
    if (auto it = live.find(e.addr); it != live.end()) {
      block = it->second;
      live.erase(it);
    }
    std::size_t& b = block_live[block];
    b -= std::min(b, e.size);
  }

  TimelineEvent old;
  if (events.push(ev, &old)) {
    ++dropped_events;
    apply_event(base_by_category, old);
    base_allocated = old.allocated;
    base_reserved = old.reserved;
  }
}

void Recorder::State::on_range(const RangeEvent& e) {
  std::lock_guard lock(mu);
  if (stopped) return;
  std::vector<OpenRange>& stack = open[e.thread];
  if (e.begin) {
    std::uint32_t ordinal = 0;
    if (e.kind == RangeKind::kStep) {
      ordinal = ++steps_begun;
      if (steps_begin_ns < 0) arm_steps(e.time_ns, e.name);
    }
    stack.push_back(OpenRange{e.kind, e.name, e.time_ns, e.depth, ordinal});
    return;
  }
  RangeRecord r;
  r.kind = e.kind;
  r.name = e.name;
  r.end_ns = e.time_ns;
  r.thread = e.thread;
  r.depth = e.depth;
  if (!stack.empty() && stack.back().depth == e.depth) {
    r.begin_ns = stack.back().begin_ns;
    r.ordinal = stack.back().ordinal;
    stack.pop_back();
  } else {
    // Opened before the Recorder started (or before clear()): it began no later than that.
    r.begin_ns = std::min(start_ns, e.time_ns);
  }
  RangeRecord old;
  if (ranges.push(r, &old)) ++dropped_ranges;
}

void apply_event(CategoryBytes& by_category, const TimelineEvent& e) {
  std::size_t& c = by_category[category_index(e.category)];
  if (e.kind == EventKind::kAlloc) {
    c += e.size;
  } else if (e.kind == EventKind::kFreeRequested) {
    c -= std::min(c, e.size);
  }
}

CategoryBytes Recording::by_category_at(std::size_t i) const {
  if (i >= events.size()) {
    throw InvalidArgument("Recording::by_category_at(" + std::to_string(i) + "): valid: below " +
                          std::to_string(events.size()) + " (the events kept)");
  }
  CategoryBytes b = base_by_category;
  for (std::size_t j = 0; j <= i; ++j) apply_event(b, events[j]);
  return b;
}

Recorder::Recorder(CachingAllocator& alloc, RecorderOptions options) : alloc_(&alloc) {
  if (options.capacity == 0 || options.range_capacity == 0) {
    throw InvalidArgument("Recorder: capacity " + std::to_string(options.capacity) +
                          ", range_capacity " + std::to_string(options.range_capacity) +
                          "; valid: both >= 1");
  }
  state_ = std::make_unique<State>(options);
  State& s = *state_;
  // The allocator's figures now are the starting state. An event from another thread between
  // this read and add_listener below would be missed: construct the Recorder while nothing else
  // allocates from this allocator (the usual case: before training starts).
  const AllocatorStats st = alloc.stats();
  s.allocated = static_cast<std::size_t>(st.allocated_bytes[kStatAll].current);
  s.reserved = static_cast<std::size_t>(st.reserved_bytes[kStatAll].current);
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    s.by_category[c] = static_cast<std::size_t>(st.category_bytes[c].current);
  }
  if (s.allocated > 0) s.block_live[0] = s.allocated;  // "before": outside any block
  s.restart(now_ns());

  State* sp = state_.get();
  s.alloc_listener = alloc.add_listener([sp](const AllocatorEvent& e) {
    try {
      sp->on_event(e);
    } catch (...) {  // bad_alloc from a map or the ring; the totals are already updated
      std::lock_guard lock(sp->mu);
      ++sp->listener_failures;
    }
  });
  try {
    s.range_listener = add_range_listener([sp](const RangeEvent& e) {
      try {
        sp->on_range(e);
      } catch (...) {
        std::lock_guard lock(sp->mu);
        ++sp->listener_failures;
      }
    });
  } catch (...) {
    alloc.remove_listener(s.alloc_listener);
    throw;
  }
  try {
    CategoryBytes live{};
    s.host_listener = add_host_region_listener(
        [sp](const HostRegionEvent& e) {
          try {
            sp->on_host(e);
          } catch (...) {
            std::lock_guard lock(sp->mu);
            ++sp->listener_failures;
          }
        },
        &live);
    // Regions the listener heard already count from here on: on_host keeps the newest state.
    std::lock_guard lock(s.mu);
    s.host_base = live;
    if (s.host_events.empty()) s.host = live;
    if (total_bytes(live) >= s.host_peak) {  // the state at the start is a peak candidate too
      s.host_peak = total_bytes(live);
      s.host_at_peak = live;
      s.host_peak_ns = s.start_ns;
    }
  } catch (...) {
    alloc.remove_listener(s.alloc_listener);
    remove_range_listener(s.range_listener);
    if (s.host_listener != 0) remove_host_region_listener(s.host_listener);
    throw;
  }
}

Recorder::~Recorder() { stop(); }

void Recorder::stop() {
  {
    std::lock_guard lock(state_->mu);
    if (state_->stopped) return;
    state_->stopped = true;
    state_->stop_ns = now_ns();
  }
  // Both removals wait for calls in flight, so nothing touches the state after they return.
  alloc_->remove_listener(state_->alloc_listener);
  remove_range_listener(state_->range_listener);
  remove_host_region_listener(state_->host_listener);
}

Recording Recorder::recording() const {
  const State& s = *state_;
  std::lock_guard lock(s.mu);
  Recording r;
  r.start_ns = s.start_ns;
  r.start_epoch_ns = s.start_epoch_ns;
  r.end_ns = s.stopped ? s.stop_ns : now_ns();
  r.events = s.events.in_order();
  r.dropped_events = s.dropped_events;
  r.base_by_category = s.base_by_category;
  r.base_allocated = s.base_allocated;
  r.base_reserved = s.base_reserved;
  r.ranges = s.ranges.in_order();
  for (const auto& [thread, stack] : s.open) {
    for (const OpenRange& o : stack) {
      r.ranges.push_back(
          RangeRecord{o.kind, o.name, o.begin_ns, o.begin_ns, thread, o.depth, o.ordinal});
    }
  }
  // By begin time; an enclosing range before the ranges it encloses that began in the same ns.
  std::stable_sort(r.ranges.begin(), r.ranges.end(),
                   [](const RangeRecord& a, const RangeRecord& b) {
                     if (a.begin_ns != b.begin_ns) return a.begin_ns < b.begin_ns;
                     if (a.thread != b.thread) return a.thread < b.thread;
                     return a.depth < b.depth;
                   });
  r.dropped_ranges = s.dropped_ranges;
  // Each peak's blocks, largest first (ties by id, so the order is the same every time).
  const auto sorted = [](PeakInfo p) {
    std::sort(p.blocks.begin(), p.blocks.end(), [](const BlockBytes& a, const BlockBytes& b) {
      return a.bytes != b.bytes ? a.bytes > b.bytes : a.block < b.block;
    });
    return p;
  };
  r.peak = sorted(s.peak);
  r.peak_reserved = s.peak_reserved;
  r.steps_begin_ns = s.steps_begin_ns;
  r.step_peak = sorted(s.step_peak);
  r.step_peak_reserved = s.step_peak_reserved;
  r.current_by_category = s.by_category;
  r.current_allocated = s.allocated;
  r.current_reserved = s.reserved;
  r.listener_failures = s.listener_failures;
  r.host_events = s.host_events.in_order();
  r.dropped_host_events = s.dropped_host_events;
  r.host_base = s.host_base;
  r.host_peak = s.host_peak;
  r.host_peak_ns = s.host_peak_ns;
  r.host_at_peak = s.host_at_peak;
  r.host_current = s.host;
  return r;
}

void Recorder::clear() {
  State& s = *state_;
  std::lock_guard lock(s.mu);
  // Ranges open now stay open: their ends still pair with the begins already seen.
  s.restart(now_ns());
  s.listener_failures = 0;
}

}  // namespace memfit
