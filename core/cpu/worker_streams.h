// WorkerStreams: the CPU backend's streams and events, with an optional worker thread per
// stream so that work on a stream really runs beside the caller (an offload copy beside the
// compute), as on a GPU.
//
//   WorkerStreams s(/*workers=*/true);
//   StreamId copy = s.create();                      // starts a thread with a FIFO queue
//   s.enqueue(copy, [=] { std::memcpy(dst, src, n); });   // returns at once
//   EventHandle e = s.record(copy);                  // completes when the worker passes it
//   s.wait(kDefaultStream, e);                       // the inline caller blocks until then
//   s.synchronize(copy);                             // drains; rethrows an op's exception
//   s.release(e);
//
// Semantics (core/backend.h's contract, CUDA's rules):
// - kDefaultStream always runs inline on the calling thread; so does every stream when
//   `workers` is false (then this is InlineStreams with the same checks). A worker stream runs
//   its ops in FIFO order on its own thread; enqueue() never blocks on the work.
// - An event marks the ops enqueued on its stream when it was recorded and completes when the
//   worker has finished them (at once for inline streams). wait(s, e): later work on worker
//   stream s waits for e (an op in s's queue blocks); on an inline stream the caller blocks.
//   Events only ever cover work enqueued before them, so waits cannot form a cycle.
// - An op that throws on a worker: the exception is kept (the first one, until reported), the
//   later ops still run, and the next synchronize(s), synchronize_event() of an event on s, or
//   destroy(s) rethrows it: a memfit::Error or CheckFailure as the same type, anything else as
//   a CheckFailure naming the stream. The stream stays usable.
// - destroy(s) drains s and joins its thread; events recorded on s stay valid (complete).
//   The destructor drains every stream and drops errors nobody collected (stderr notes them).
// Thread safety: every method may be called from any thread (the caching allocator records and
// polls events from inside its lock, worker ops may allocate); as for CUDA streams, one stream
// must not be fed by two threads at once. No lock is held while an op runs.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "memory/stream.h"

namespace memfit::cpu {

class WorkerStreams {
 public:
  explicit WorkerStreams(bool workers);
  ~WorkerStreams();
  WorkerStreams(const WorkerStreams&) = delete;
  WorkerStreams& operator=(const WorkerStreams&) = delete;

  bool workers() const { return workers_; }
  // True when ops on `stream` run on the calling thread (no queue): the default stream, or
  // every stream without workers.
  bool runs_inline(StreamId stream) const { return !workers_ || stream == kDefaultStream; }

  StreamId create();
  void destroy(StreamId stream);  // the caller has checked that it exists; see above
  bool has(StreamId stream) const;
  // Queues `op` on a worker stream (runs_inline(stream) is false and the stream exists).
  void enqueue(StreamId stream, std::function<void()> op);
  void synchronize(StreamId stream);

  EventHandle record(StreamId stream);
  bool has_event(EventHandle event) const;
  bool query(EventHandle event);
  void synchronize_event(EventHandle event);
  void wait(StreamId stream, EventHandle event);
  void release(EventHandle event);

  std::size_t live_events() const;
  // Drains every worker stream (errors stay pending for their stream's next synchronize).
  void drain_all();

 private:
  struct Stream;
  struct Event {
    std::shared_ptr<Stream> stream;  // null: complete when recorded (inline stream)
    std::uint64_t target = 0;        // complete once stream->completed >= target
  };

  std::shared_ptr<Stream> find(StreamId stream) const;  // null for inline streams
  static void run(Stream* s);
  static void wait_done(Stream& s, std::uint64_t target);
  [[noreturn]] static void rethrow(std::exception_ptr error, StreamId stream);
  static void take_error(Stream& s, StreamId stream);  // rethrows a pending error
  void stop(Stream& s);

  const bool workers_;
  mutable std::mutex mu_;  // the maps and counters below; never held while waiting on work
  StreamId next_stream_ = 1;
  EventHandle next_event_ = 1;
  std::unordered_map<StreamId, std::shared_ptr<Stream>> streams_;  // value null: inline
  std::unordered_map<EventHandle, Event> events_;
};

}  // namespace memfit::cpu
