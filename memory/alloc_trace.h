// AllocTrace: a recorded (or synthesized) sequence of allocator operations. Traces drive
// `memfit replay`, the allocator benchmarks and the allocator's fragmentation tests (on
// synthetic GPT-2 training traces built with the builder methods below) without running any
// model.
//
//   std::ifstream in("step.trace");
//   AllocTrace trace = read_trace(in, "step.trace");  // or build one: trace.alloc(...), ...
//   NullProvider null;
//   CachingAllocator alloc(null);
//   ReplayResult r = replay(trace, alloc);   // memory/trace_replay.h
//
// An operation names an allocation by an id chosen by the trace (not by an address), so a
// trace is replayable on any allocator and any provider:
//   alloc id size category stream tag   a new live allocation; id must not be live already
//   free id                             id must be live; after this it may be allocated again
//   record_stream id stream             the live block id is also used on `stream`
//   empty_cache                         return cached segments to the provider
//   step n                              training step n begins (n strictly increasing)
//   phase name                          a named phase begins ("forward", "backward", ...)
// Allocations still live at the end are "persistent" (parameters, gradients, optimizer
// state); validate() reports them, replay() frees them after measuring.
//
// Text form (write_trace / read_trace), one operation per line, '#' starts a comment:
//   alloc 7 1048576 activation 0 h0.attn.qkv
//   record_stream 7 1
//   free 7
//   empty_cache
//   step 1
//   phase backward
// The tag is the rest of the line (may be empty). read_trace errors name the line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "memory/category.h"
#include "memory/stream.h"

namespace memfit {

enum class TraceOpKind : std::uint8_t {
  kAlloc,
  kFree,
  kRecordStream,
  kEmptyCache,
  kStep,
  kPhase,
};

// "alloc", "free", "record_stream", "empty_cache", "step", "phase".
const char* trace_op_kind_name(TraceOpKind k);

struct TraceOp {
  TraceOpKind kind = TraceOpKind::kAlloc;
  std::uint64_t id = 0;                    // alloc, free, record_stream; step: the step number
  std::size_t size = 0;                    // alloc: requested bytes
  Category category = Category::kUnknown;  // alloc
  StreamId stream = kDefaultStream;        // alloc: owning stream; record_stream: user stream
  std::string tag;                         // alloc: tensor name; phase: phase name
};

// What a well-formed trace adds up to, in requested (unrounded) bytes.
struct TraceSummary {
  std::size_t num_allocs = 0;
  std::size_t num_frees = 0;
  std::size_t num_steps = 0;
  std::size_t peak_live_bytes = 0;   // max over time of the sum of live sizes
  std::size_t persistent_bytes = 0;  // live at the end
  std::size_t num_persistent = 0;
  std::size_t bytes_by_category[kCategoryCount] = {};       // allocated, cumulative
  std::size_t persistent_by_category[kCategoryCount] = {};  // live at the end
  std::vector<std::size_t> step_peak_live_bytes;            // per step marker, in order
};

// A trace under construction or loaded. The builder methods hand out fresh ids.
class AllocTrace {
 public:
  std::vector<TraceOp> ops;

  std::uint64_t alloc(std::size_t bytes, Category category, StreamId stream, std::string_view tag);
  void free(std::uint64_t id);
  void record_stream(std::uint64_t id, StreamId stream);
  void empty_cache();
  void step(std::uint64_t n);
  void phase(std::string_view name);

  // Checks every rule above and returns the totals. Throws InvalidArgument naming the op
  // index, its kind and id, and why (free of an id never allocated or already freed, alloc of
  // a live id, zero size, record_stream of a dead id, step numbers not increasing).
  TraceSummary validate() const;

 private:
  friend AllocTrace parse_trace(std::string_view text, std::string_view source);
  std::uint64_t next_id_ = 0;  // above every id in ops, so builder ids never collide
};

void write_trace(std::ostream& out, const AllocTrace& trace);
// Parses the text form; throws InvalidArgument naming `source` and the line. The result is
// syntactically valid; call validate() for the liveness rules. Lines may end in "\n" or
// "\r\n". read_trace reads the stream to its end and parses that.
AllocTrace parse_trace(std::string_view text, std::string_view source = "trace");
AllocTrace read_trace(std::istream& in, std::string_view source = "trace");

}  // namespace memfit
