// HostRegion: names pinned host memory by category for the profiler, as ScopedRange names
// phases. Host memory that offload pins (the offloading optimizer's slab, the activation stash's
// room) does not go through a caching allocator, so nothing else would see it; its owner holds
// one HostRegion per part of it, for as long as the part is pinned:
//
//   HostRegion masters(Category::kOptimizerState, bytes, "fp32_masters");  // heard: + bytes
//   ...                                                                     // heard: - bytes
//   CategoryBytes now = host_region_bytes();   // every live region's bytes, by category
//
// Listeners (the Recorder adds one) hear each region's bytes come and go, on the thread that
// created or destroyed it; they must be quick and must not throw. Regions are process-wide, as
// ranges are: a Recorder hears every run's regions in the process. Owners create regions only
// for memory that exists (never for a dry run's NullProvider addresses), so a report shows
// what was pinned. A default-constructed (or moved-from) region, or one of 0 bytes, is none.
// Times are steady_clock nanoseconds, the scale of AllocatorEvent::time_ns.
// Thread-safe: the live totals and the listener table take a mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include "memory/category.h"

namespace memfit {

struct HostRegionEvent {
  std::int64_t time_ns = 0;
  bool pinned = true;  // true: the region appeared; false: it went
  Category category = Category::kUnknown;
  std::size_t bytes = 0;
  std::uint32_t tag = 0;  // interned (profiler/scoped_range.h)
  CategoryBytes after{};  // every live region's bytes by category, this one's change included
};
using HostRegionListener = std::function<void(const HostRegionEvent&)>;
// *live (when given): the live regions' bytes at the moment the listener was added, so that
// what it then hears adds up from there.
std::uint64_t add_host_region_listener(HostRegionListener listener, CategoryBytes* live = nullptr);
// Returns once no thread is inside the removed listener.
void remove_host_region_listener(std::uint64_t id);

// The live regions' bytes by category, now.
CategoryBytes host_region_bytes();

class HostRegion {
 public:
  HostRegion() = default;
  HostRegion(Category category, std::size_t bytes, std::string_view tag);
  ~HostRegion();
  HostRegion(HostRegion&& o) noexcept;
  HostRegion& operator=(HostRegion&& o) noexcept;
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;

  Category category() const { return category_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void release() noexcept;
  Category category_ = Category::kUnknown;
  std::size_t bytes_ = 0;
  std::uint32_t tag_ = 0;
};

}  // namespace memfit
