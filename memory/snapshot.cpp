#include "memory/snapshot.h"

namespace memfit {

const char* block_state_name(BlockState s) {
  switch (s) {
    case BlockState::kActiveAllocated:
      return "active_allocated";
    case BlockState::kActivePendingFree:
      return "active_pending_free";
    case BlockState::kInactive:
      return "inactive";
  }
  return "invalid";
}

}  // namespace memfit
