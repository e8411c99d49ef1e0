// InlineStreams: stream and event bookkeeping for backends whose work runs inline on the
// calling thread (the CPU and meta backends). Nothing is ever pending, so events are complete
// when recorded and synchronizing returns at once; what remains is telling live handles from
// dead ones, so a stream or event used after its destroy/release is caught as on CUDA.
//
//   InlineStreams s;
//   StreamId id = s.create();          // 1, 2, ... (kDefaultStream, 0, always exists)
//   EventHandle e = s.record(id);      // complete already
//   s.release(e);
//
// Thread-safe (one mutex): the caching allocator records and polls events from its own lock.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_set>

#include "memory/stream.h"

namespace memfit::cpu {

class InlineStreams {
 public:
  StreamId create();
  void destroy(StreamId stream);  // the caller has checked that it exists
  bool has(StreamId stream) const;
  EventHandle record(StreamId stream);
  bool has_event(EventHandle event) const;
  void release(EventHandle event);
  std::size_t live_events() const;

 private:
  mutable std::mutex mu_;
  StreamId next_stream_ = 1;
  EventHandle next_event_ = 1;
  std::unordered_set<StreamId> streams_;
  std::unordered_set<EventHandle> events_;
};

}  // namespace memfit::cpu
