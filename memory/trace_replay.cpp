#include "memory/trace_replay.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <unordered_set>

#include "memory/check.h"
#include "memory/error.h"

namespace memfit {

namespace {

// Peaks are read per step and folded here, because per-step peaks need reset_peak_stats()
// at every step marker.
struct Peaks {
  std::size_t reserved = 0, allocated = 0, requested = 0;

  std::size_t fold(const AllocatorStats& s) {
    const auto r = static_cast<std::size_t>(s.reserved_bytes[kStatAll].peak);
    reserved = std::max(reserved, r);
    allocated = std::max(allocated, static_cast<std::size_t>(s.allocated_bytes[kStatAll].peak));
    requested = std::max(requested, static_cast<std::size_t>(s.requested_bytes[kStatAll].peak));
    return r;
  }
};

void free_all(CachingAllocator& allocator, std::unordered_map<std::uint64_t, void*>& live) {
  for (const auto& [id, ptr] : live) allocator.free(ptr);
  live.clear();
}

}  // namespace

ReplayResult replay(const AllocTrace& trace, CachingAllocator& allocator,
                    const ReplayOptions& options) {
  const TraceSummary summary = trace.validate();  // throws before anything is allocated

  ReplayResult r;
  r.num_ops = trace.ops.size();
  r.num_steps = summary.num_steps;
  std::unordered_map<std::uint64_t, void*> live;
  live.reserve(summary.num_persistent + 1024);
  std::unordered_set<std::uint64_t> failed;  // ids whose allocation threw OutOfMemory

  allocator.reset_peak_stats();
  const AllocatorStats start = allocator.stats();
  Peaks peaks;
  std::size_t steps_seen = 0;
  std::int64_t allocs_at_second_step = 0, frees_at_second_step = 0;
  std::int64_t allocs_at_step = start.num_device_alloc;

  using Clock = std::chrono::steady_clock;
  Clock::duration busy{};
  Clock::time_point t0 = Clock::now();
  std::size_t index = 0;
  try {
    for (; index < trace.ops.size(); ++index) {
      const TraceOp& op = trace.ops[index];
      switch (op.kind) {
        case TraceOpKind::kAlloc: {
          ++r.num_allocs;
          try {
            live.emplace(op.id, allocator.allocate_raw(op.size, op.category, op.stream, op.tag));
            failed.erase(op.id);
          } catch (const OutOfMemory&) {
            ++r.num_ooms;
            failed.insert(op.id);
          }
          break;
        }
        case TraceOpKind::kFree: {
          auto it = live.find(op.id);
          if (it == live.end()) {
            MEMFIT_CHECK(failed.erase(op.id) == 1) << "validated trace frees unknown id " << op.id;
            break;
          }
          allocator.free(it->second);
          live.erase(it);
          break;
        }
        case TraceOpKind::kRecordStream: {
          auto it = live.find(op.id);
          if (it != live.end()) allocator.record_stream(it->second, op.stream);
          break;
        }
        case TraceOpKind::kEmptyCache:
          allocator.empty_cache();
          break;
        case TraceOpKind::kStep: {
          // Bookkeeping between steps is not replay time.
          busy += Clock::now() - t0;
          const AllocatorStats s = allocator.stats();
          const std::size_t step_peak = peaks.fold(s);
          if (steps_seen > 0) {
            r.step_peak_reserved_bytes.push_back(step_peak);
            r.step_provider_allocs.push_back(s.num_device_alloc - allocs_at_step);
          }
          allocs_at_step = s.num_device_alloc;
          if (steps_seen == 1) {
            allocs_at_second_step = s.num_device_alloc;
            frees_at_second_step = s.num_device_free;
            r.has_steady_state = true;
          }
          if (options.check_invariants) allocator.check_invariants();
          allocator.reset_peak_stats();
          ++steps_seen;
          t0 = Clock::now();
          break;
        }
        case TraceOpKind::kPhase:
          break;
      }
    }
  } catch (const InvalidArgument& e) {
    // The allocator refused an op the trace format allows (a size beyond any provider).
    if (options.free_remaining) free_all(allocator, live);
    throw InvalidArgument("allocation trace op " + std::to_string(index) + " (" +
                          trace_op_kind_name(trace.ops[index].kind) + " id " +
                          std::to_string(trace.ops[index].id) + "): " + e.what());
  } catch (...) {
    if (options.free_remaining) free_all(allocator, live);
    throw;
  }
  busy += Clock::now() - t0;

  const AllocatorStats end = allocator.stats();
  const std::size_t last_peak = peaks.fold(end);
  if (steps_seen > 0) {
    r.step_peak_reserved_bytes.push_back(last_peak);
    r.step_provider_allocs.push_back(end.num_device_alloc - allocs_at_step);
  }
  if (options.check_invariants) allocator.check_invariants();

  r.peak_reserved_bytes = peaks.reserved;
  r.peak_allocated_bytes = peaks.allocated;
  r.peak_live_bytes = peaks.requested;
  r.reserved_over_live =
      r.peak_live_bytes ? double(r.peak_reserved_bytes) / double(r.peak_live_bytes) : 0.0;
  r.end_reserved_bytes = static_cast<std::size_t>(end.reserved_bytes[kStatAll].current);
  r.provider_allocs = end.num_device_alloc - start.num_device_alloc;
  r.provider_frees = end.num_device_free - start.num_device_free;
  if (r.has_steady_state) {
    r.provider_allocs_after_first_step = end.num_device_alloc - allocs_at_second_step;
    r.provider_frees_after_first_step = end.num_device_free - frees_at_second_step;
  }
  r.seconds = std::chrono::duration<double>(busy).count();
  r.ns_per_op = r.num_ops ? r.seconds * 1e9 / double(r.num_ops) : 0.0;

  if (options.free_remaining) free_all(allocator, live);
  return r;
}

}  // namespace memfit
