// Streams and events as the caching allocator sees them.
//
// A StreamId names an ordered queue of work (a CUDA stream, or a CPU backend stream). Blocks
// are cached per stream: a block freed on stream S is reused for S at once (work on S is
// ordered), and for another stream only after the events recorded by record_stream() have
// completed, exactly as in PyTorch's caching allocator.
//
// StreamSync is how the allocator records and polls those events; the backend supplies it.
// ImmediateStreamSync is for code whose streams run inline (the CPU backend without worker
// threads, dry runs): its events are complete as soon as they are recorded.
//
//   ImmediateStreamSync sync;
//   CachingAllocator alloc(provider, config, &sync);
#pragma once

#include <cstdint>

namespace memfit {

using StreamId = std::uint64_t;
inline constexpr StreamId kDefaultStream = 0;

using EventHandle = std::uintptr_t;

class StreamSync {
 public:
  virtual ~StreamSync() = default;
  // Records an event on `stream` that completes when the work queued so far on it is done.
  virtual EventHandle record(StreamId stream) = 0;
  // True once the event has completed. Must not block.
  virtual bool query(EventHandle event) = 0;
  // Blocks until the event has completed.
  virtual void synchronize(EventHandle event) = 0;
  // Releases the event; the handle is not used afterwards.
  virtual void release(EventHandle event) = 0;
};

class ImmediateStreamSync final : public StreamSync {
 public:
  EventHandle record(StreamId) override { return 1; }
  bool query(EventHandle) override { return true; }
  void synchronize(EventHandle) override {}
  void release(EventHandle) override {}
};

}  // namespace memfit
