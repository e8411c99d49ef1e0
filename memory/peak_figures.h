// PeakFigures: the peak memory of a stretch of work (a training step, a dry run of one, a
// whole run), as one value that the Trainer, the dry run, a Plan's prediction and the CLI all
// carry, so none of them copies per-category loops of its own.
//
//   alloc.reset_peak_stats();  ...work...
//   PeakFigures p = PeakFigures::of(alloc.stats());
//   p.reserved, p.allocated;                 // the allocator's peaks
//   p.at_peak[c] ... + p.cached() == p.reserved   // the breakdown of the reserved peak
//   p.category_peaks[c];                     // each category's own peak (another moment)
//   run.take_max(p);                         // over several steps
//
// at_peak is the allocator's bytes by Category at the moment reserved bytes peaked (of those
// moments, the one with the most allocated; memory/allocator_stats.h), so the categories and
// the cached bytes (reserved but not allocated then) add up to `reserved` exactly. The
// per-category peaks are labelled as such wherever they are shown: their sum is usually above
// any moment's total. host_pinned: pinned host bytes the work held at most (offload), which a
// device budget does not cover; host_at_peak: those bytes by category (they add up to
// host_pinned). All bytes; 0 where nothing was measured.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>

#include "memory/allocator_stats.h"
#include "memory/category.h"

namespace memfit {

struct PeakFigures {
  std::size_t reserved = 0;
  std::size_t allocated = 0;
  std::size_t allocated_at_peak = 0;  // allocated at the reserved peak (sum of at_peak)
  std::array<std::size_t, kCategoryCount> at_peak{};
  std::array<std::size_t, kCategoryCount> category_peaks{};
  std::size_t host_pinned = 0;
  CategoryBytes host_at_peak{};

  static PeakFigures of(const AllocatorStats& s) {
    PeakFigures p;
    p.reserved = static_cast<std::size_t>(s.reserved_bytes[kStatAll].peak);
    p.allocated = static_cast<std::size_t>(s.allocated_bytes[kStatAll].peak);
    p.allocated_at_peak = static_cast<std::size_t>(s.at_reserved_peak.allocated);
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      p.at_peak[c] = static_cast<std::size_t>(s.at_reserved_peak.category[c]);
      p.category_peaks[c] = static_cast<std::size_t>(s.category_bytes[c].peak);
    }
    return p;
  }

  // Reserved but not allocated at the reserved peak: cached blocks and fragmentation.
  std::size_t cached() const { return reserved - std::min(reserved, allocated_at_peak); }
  std::size_t at_peak_of(Category c) const { return at_peak[category_index(c)]; }

  // The larger of each figure; the breakdown comes with the larger reserved peak (the first
  // on a tie), so it still adds up.
  void take_max(const PeakFigures& o) {
    if (o.reserved > reserved ||
        (o.reserved == reserved && o.allocated_at_peak > allocated_at_peak)) {
      at_peak = o.at_peak;
      allocated_at_peak = o.allocated_at_peak;
    }
    reserved = std::max(reserved, o.reserved);
    allocated = std::max(allocated, o.allocated);
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      category_peaks[c] = std::max(category_peaks[c], o.category_peaks[c]);
    }
    if (o.host_pinned > host_pinned) {
      host_pinned = o.host_pinned;
      host_at_peak = o.host_at_peak;
    }
  }

  bool operator==(const PeakFigures&) const = default;
};

}  // namespace memfit
