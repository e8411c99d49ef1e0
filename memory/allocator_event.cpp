#include "memory/allocator_event.h"

namespace memfit {

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
  }
  return "invalid";
}

}  // namespace memfit
