// ScopedRange: names what the program is doing now (a phase or a block), for the profiler.
//
//   {
//     ScopedRange step(RangeKind::kStep, "step 3");
//     { ScopedRange f(RangeKind::kForward); ScopedRange b(RangeKind::kBlock, "h0"); ... }
//   }
//   PhaseContext now = current_phase();        // on this thread: phase "forward", block "h0"
//
// Each thread has its own stack of open ranges (thread_local); a ScopedRange pushes on
// construction and pops on destruction, so ranges nest by scope and are never left open by an
// exception. An allocator event is attributed to the ranges open on the thread that caused it
// (the caching allocator runs listeners on the calling thread), which is how the Recorder
// knows "phase backward, block h7" for every allocation without the allocator knowing about
// phases.
//
// Kinds: step, micro_batch, forward, backward, recompute, optimizer, offload, setup are phases;
// block names a layer block (the executor's "h0", "h1", ..., "embedding", "head"); other is a
// user's own range. The phase of a moment is the innermost open range whose kind is a phase; its
// block is the innermost open kBlock range. Both are 0 ("" when looked up) when none is open.
//
// Names are interned process-wide: intern_name() maps a string to a small id once (a mutex and
// a hash lookup), and the id is what stacks, events and recorders store; interned_name(id) is
// valid for the life of the process. Ids are dense from 1; 0 is "".
//
// Range listeners (the Recorder adds one) hear every begin and end on every thread, in order
// per thread; they run on the thread that opened or closed the range, must be quick and must
// not throw. With no listener, a range costs a thread_local push/pop, one clock read and, for
// a name given as a string, one interning lookup; pass a pre-interned id on hot paths.
//
// NVTX: in CUDA builds (MEMFIT_HAVE_CUDA) every range is also an NVTX3 push/pop range in the
// "memfit" domain, with the kind as its category and the name as its message, so Nsight
// Systems shows memfit's phases on the timeline; CPU-only builds compile that out.
//
// Times are steady_clock nanoseconds, the scale of AllocatorEvent::time_ns.
// Thread-safe: stacks are per thread; interning and listener registration take a mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace memfit {

enum class RangeKind : std::uint8_t {
  kStep,
  kMicroBatch,
  kForward,
  kBackward,
  kRecompute,
  kOptimizer,
  kOffload,
  kSetup,  // building the model and optimizer, before the first step
  kBlock,
  kOther,
};
inline constexpr int kRangeKindCount = 10;

// "step", "micro_batch", "forward", "backward", "recompute", "optimizer", "offload", "setup",
// "block", "other".
const char* range_kind_name(RangeKind k);
inline bool is_phase(RangeKind k) { return k != RangeKind::kBlock && k != RangeKind::kOther; }

std::uint32_t intern_name(std::string_view name);  // "" -> 0
std::string_view interned_name(std::uint32_t id);  // an unknown id -> ""

struct RangeFrame {
  RangeKind kind;
  std::uint32_t name;  // interned
  std::int64_t start_ns;
};

struct PhaseContext {
  std::uint32_t phase = 0;  // interned name of the innermost phase range (0: none)
  RangeKind phase_kind = RangeKind::kOther;
  std::uint32_t block = 0;  // interned name of the innermost block range (0: none)
};

// The calling thread's open ranges, outermost first.
const std::vector<RangeFrame>& current_ranges();
PhaseContext current_phase();

struct RangeEvent {
  bool begin;  // true: opened; false: closed
  RangeKind kind;
  std::uint32_t name;
  std::int64_t time_ns;
  std::uint64_t thread;  // a small per-thread number, 1 for the first thread that opened a range
  int depth;             // 0 for an outermost range
};
using RangeListener = std::function<void(const RangeEvent&)>;
std::uint64_t add_range_listener(RangeListener listener);
void remove_range_listener(std::uint64_t id);

class ScopedRange {
 public:
  // An empty name means the kind's name ("forward").
  explicit ScopedRange(RangeKind kind, std::string_view name = {});
  ScopedRange(RangeKind kind, std::uint32_t interned);
  ~ScopedRange();
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;
};

}  // namespace memfit
