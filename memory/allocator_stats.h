// Allocator statistics with torch.cuda.memory_stats() names and semantics, plus bytes per
// Category.
//
//   AllocatorStats s = allocator.stats();
//   s.allocated_bytes[kStatAll].peak      // "allocated_bytes.all.peak"
//   s.as_map()["reserved_bytes.large_pool.current"]
//
// Each Stat counts current / peak / allocated (cumulative increments) / freed (cumulative
// decrements). Meanings, as in PyTorch:
//   allocation, allocated_bytes      live blocks handed to callers (rounded sizes for bytes)
//   requested_bytes                  the same, with the sizes callers asked for. It drops when
//                                    the caller frees (PyTorch: when the free completes, i.e.
//                                    after the stream events of record_stream)
//   segment, reserved_bytes          segments held from the provider
//   active, active_bytes             live blocks plus blocks freed but waiting on stream events
//   inactive_split, inactive_split_bytes  free blocks that are part of a split segment
// small_pool: blocks <= 1 MiB (from 2 MiB segments); large_pool: the rest.
// category_bytes[c]: allocated (rounded) bytes of live blocks of Category c, current and peak.
// at_reserved_peak: the moment reserved_bytes.all reached its peak (of those moments, the one
// with the most allocated bytes): what was reserved, allocated, and allocated per Category
// then, so a breakdown of the peak adds up (categories + cached = reserved). Each
// category_bytes[c].peak is that category's own peak, usually at another moment.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "memory/category.h"

namespace memfit {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void increase(std::int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void decrease(std::int64_t n) {
    current -= n;
    freed += n;
  }
  void reset_peak() { peak = current; }
  void reset_accumulated() { allocated = freed = 0; }
};

enum StatType : int { kStatAll = 0, kStatSmallPool = 1, kStatLargePool = 2 };
inline constexpr int kStatTypeCount = 3;
using StatArray = std::array<Stat, kStatTypeCount>;

struct PeakMoment {
  std::int64_t reserved = 0;
  std::int64_t allocated = 0;
  std::array<std::int64_t, kCategoryCount> category{};
};

struct AllocatorStats {
  StatArray allocation, segment, active, inactive_split;
  StatArray allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_device_alloc = 0;  // provider allocate calls that succeeded
  std::int64_t num_device_free = 0;   // provider deallocate calls
  std::array<Stat, kCategoryCount> category_bytes;
  PeakMoment at_reserved_peak;

  // After an allocation: moves at_reserved_peak here when reserved is at its peak and this
  // moment holds more (a reserved peak reached again with more allocated). Cheap: two
  // compares unless it moves.
  void note_peak_moment() {
    const Stat& r = reserved_bytes[kStatAll];
    const std::int64_t a = allocated_bytes[kStatAll].current;
    if (r.current != r.peak) return;
    if (r.current == at_reserved_peak.reserved && a <= at_reserved_peak.allocated) return;
    note_peak_moment_now();
  }
  // Takes the present as the moment (after the peaks are reset to the current values).
  void note_peak_moment_now() {
    at_reserved_peak.reserved = reserved_bytes[kStatAll].current;
    at_reserved_peak.allocated = allocated_bytes[kStatAll].current;
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      at_reserved_peak.category[c] = category_bytes[c].current;
    }
  }

  // Flat map with PyTorch's keys ("allocated_bytes.all.current", "num_ooms", ...) and
  // "category_bytes.<name>.current|peak".
  std::map<std::string, std::int64_t> as_map() const;
};

}  // namespace memfit
