#include "memory/allocator_event.h"

#include <chrono>

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

namespace memfit {

namespace {

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr std::uint64_t kRecheckTicks = std::uint64_t{1} << 23;  // ~3 ms at 3 GHz
constexpr std::uint64_t kPairTicks = std::uint64_t{1} << 16;     // ~20 us
constexpr std::int64_t kMinSpanNs = 1000000;

#if defined(__x86_64__)
// A (TSC, steady_clock) pair read close together: the clock read between two counter reads,
// kept only when they are near (a thread descheduled in between would skew the rate, or
// worse the anchor, for good).
bool read_pair(std::uint64_t& tsc, std::int64_t& ns) {
  for (int i = 0; i < 3; ++i) {
    const std::uint64_t a = __rdtsc();
    const std::int64_t n = steady_ns();
    const std::uint64_t b = __rdtsc();
    if (b - a < kPairTicks) {
      tsc = a + (b - a) / 2;
      ns = n;
      return true;
    }
  }
  return false;
}
#endif

}  // namespace

EventClock::EventClock() {
#if defined(__x86_64__)
  // Invariant TSC: CPUID 0x80000007, EDX bit 8 (constant rate in every power state, synced
  // across cores). Without it the counter may not track time.
  unsigned a = 0, b = 0, c = 0, d = 0;
  use_tsc_ = __get_cpuid(0x80000007, &a, &b, &c, &d) != 0 && (d & (1u << 8)) != 0;
#endif
}

std::int64_t EventClock::now_ns() {
  std::int64_t t = 0;
#if defined(__x86_64__)
  if (use_tsc_) {
    const std::uint64_t tsc = __rdtsc();
    std::uint64_t pair_tsc = 0;
    if (ns_per_tick_ > 0 && tsc - tsc_checked_ < kRecheckTicks) {
      t = ns0_ + static_cast<std::int64_t>(static_cast<double>(tsc - tsc0_) * ns_per_tick_);
    } else if (!read_pair(pair_tsc, t)) {
      t = steady_ns();  // calibration waits for a calmer moment
    } else {
      if (tsc_checked_ == 0) {
        tsc0_ = pair_tsc;
        ns0_ = t;
      } else if (t - ns0_ >= kMinSpanNs && pair_tsc > tsc0_) {
        ns_per_tick_ = static_cast<double>(t - ns0_) / static_cast<double>(pair_tsc - tsc0_);
      }
      tsc_checked_ = pair_tsc;
    }
  } else {
    t = steady_ns();
  }
#else
  t = steady_ns();
#endif
  if (t < last_) t = last_;
  last_ = t;
  return t;
}

const char* event_kind_name(EventKind k) {
  switch (k) {
    case EventKind::kAlloc:
      return "alloc";
    case EventKind::kFreeRequested:
      return "free_requested";
    case EventKind::kFreeCompleted:
      return "free_completed";
    case EventKind::kSegmentAlloc:
      return "segment_alloc";
    case EventKind::kSegmentFree:
      return "segment_free";
    case EventKind::kOom:
      return "oom";
    case EventKind::kSegmentMap:
      return "segment_map";
    case EventKind::kSegmentUnmap:
      return "segment_unmap";
  }
  return "invalid";
}

}  // namespace memfit
