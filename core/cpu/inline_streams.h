// InlineStreams: stream and event bookkeeping for backends whose work runs inline on the
// calling thread (the meta backend; the CPU backend uses cpu/worker_streams.h, which adds
// optional worker threads). Nothing is ever pending, so events are complete
// when recorded and synchronizing returns at once; what remains is telling live handles from
// dead ones, so a stream or event used after its destroy/release is caught as on CUDA.
//
//   InlineStreams s;
//   StreamId id = s.create();          // 1, 2, ... (kDefaultStream, 0, always exists)
//   EventHandle e = s.record(id);      // complete already
//   s.release(e);
//
// Thread-safe (one mutex): the caching allocator records and polls events from its own lock.
//
// InlineBackend (below) is the stream and event half of such a backend, so the meta backend
// implements only its ops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_set>

#include "core/backend.h"
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

// A Backend whose ops run inline on the calling thread: streams are always idle, events are
// complete when recorded, and handles are still checked (InlineStreams) as on CUDA.
class InlineBackend : public Backend {
 public:
  std::size_t live_events() const { return streams_.live_events(); }  // for leak tests

 protected:
  StreamId do_create_stream() final { return streams_.create(); }
  void do_destroy_stream(StreamId stream) final { streams_.destroy(stream); }
  bool do_has_stream(StreamId stream) const final { return streams_.has(stream); }
  void do_synchronize(StreamId) final {}
  EventHandle do_record_event(StreamId stream) final { return streams_.record(stream); }
  bool do_has_event(EventHandle event) const final { return streams_.has_event(event); }
  bool do_query_event(EventHandle) final { return true; }
  void do_synchronize_event(EventHandle) final {}
  void do_wait_event(StreamId, EventHandle) final {}
  void do_release_event(EventHandle event) final { streams_.release(event); }

 private:
  InlineStreams streams_;
};

}  // namespace memfit::cpu
