// A picture of the allocator's segments and their blocks, in the layout PyTorch's
// memory_viz reads (torch.cuda.memory._snapshot()["segments"]).
//
//   Snapshot snap = allocator.snapshot();
//   for (const SegmentInfo& s : snap.segments) for (const BlockInfo& b : s.blocks) ...
//
// Blocks of a segment are listed in address order and cover it exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "memory/alloc_conf.h"
#include "memory/category.h"
#include "memory/stream.h"

namespace memfit {

enum class BlockState : std::uint8_t {
  kActiveAllocated,    // "active_allocated": held by a caller
  kActivePendingFree,  // "active_pending_free": freed, waiting on stream events
  kInactive,           // "inactive": cached, free
};

const char* block_state_name(BlockState s);

struct BlockInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;            // rounded block size
  std::size_t requested_size = 0;  // what the caller asked for; 0 when inactive
  BlockState state = BlockState::kInactive;
  Category category = Category::kUnknown;
  std::string tag;
};

struct SegmentInfo {
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;  // sum of active_allocated block sizes
  std::size_t active_size = 0;     // allocated + pending free
  std::size_t requested_size = 0;
  StreamId stream = kDefaultStream;
  bool is_large = false;           // memory_viz "segment_type": "large" / "small"
  // Expandable segments: one contiguous mapped run of an expandable range (as PyTorch reports
  // them; memory_viz "is_expandable").
  bool is_expandable = false;
  // Served only to gradients and optimizer state (separate_persistent_pools): memory_viz's
  // segment_pool_id (0, 1) in the export.
  bool persistent = false;
  std::vector<BlockInfo> blocks;
};

struct Snapshot {
  std::vector<SegmentInfo> segments;  // in address order
  AllocatorConfig config;
};

}  // namespace memfit
