// replay(): runs an AllocTrace through a CachingAllocator and reports what it cost: how much
// the allocator reserved against what was live, how often it went to the provider (in
// steady state it should not), OOMs, and time.
//
//   AllocTrace trace = read_trace(in);                   // memory/alloc_trace.h
//   NullProvider null;                                   // addresses only: any size replays
//   CachingAllocator alloc(null, parse_alloc_conf("max_split_size_mb:128"));
//   ReplayResult r = replay(trace, alloc);
//   std::printf("%.3f\n", r.reserved_over_live);         // 1.00 is the physical limit
//
// The trace is validated first (AllocTrace::validate), so a malformed trace throws
// InvalidArgument naming the op index before the allocator is touched. Replay uses the raw
// pointer API (allocate_raw / free), resets the allocator's peak stats at the start so the
// peaks are this replay's, and by default frees the allocations still live at the end
// (persistent state) after taking the figures. An allocation that throws OutOfMemory is
// counted and skipped: its later free and record_stream ops are skipped too, so a replay
// under a budget runs to the end and reports how many requests failed.
//
// Streams: record_stream events complete according to the allocator's StreamSync; with the
// default (immediate) events a block freed after record_stream is reusable at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "memory/alloc_trace.h"
#include "memory/caching_allocator.h"

namespace memfit {

struct ReplayOptions {
  bool free_remaining = true;     // free still-live allocations after measuring
  bool check_invariants = false;  // allocator.check_invariants() at every step marker
};

struct ReplayResult {
  std::size_t num_ops = 0;
  std::size_t num_allocs = 0;  // attempted
  std::size_t num_steps = 0;
  std::int64_t num_ooms = 0;  // allocations that threw OutOfMemory

  std::size_t peak_reserved_bytes = 0;   // reserved_bytes.all.peak
  std::size_t peak_allocated_bytes = 0;  // allocated_bytes.all.peak (rounded sizes)
  std::size_t peak_live_bytes = 0;       // requested_bytes.all.peak (what callers asked for)
  double reserved_over_live = 0;         // peak_reserved / peak_live; 0 when nothing was live
  std::size_t end_reserved_bytes = 0;    // reserved when the last op had run

  // Provider calls (num_device_alloc / num_device_free) during the replay, and the part of
  // them made after the first step: from the second step marker on. Zero there is the
  // steady state a caching allocator is for. Without two step markers the "after" counts
  // are 0 and has_steady_state is false.
  std::int64_t provider_allocs = 0;
  std::int64_t provider_frees = 0;
  std::int64_t provider_allocs_after_first_step = 0;
  std::int64_t provider_frees_after_first_step = 0;
  bool has_steady_state = false;
  // Per step (from its marker to the next, or the end): peak reserved bytes and provider
  // allocate calls. Note a trace whose later step has a higher live peak than any step
  // before it (the GPT trace's step 1: optimizer state appears at the end of step 0) needs
  // provider calls in that step however good the allocator; from then on it should need none.
  std::vector<std::size_t> step_peak_reserved_bytes;
  std::vector<std::int64_t> step_provider_allocs;

  double seconds = 0;  // wall time of the ops themselves
  double ns_per_op = 0;
};

ReplayResult replay(const AllocTrace& trace, CachingAllocator& allocator,
                    const ReplayOptions& options = {});

}  // namespace memfit
