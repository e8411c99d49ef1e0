#include "core/cpu/inline_streams.h"

namespace memfit::cpu {

StreamId InlineStreams::create() {
  std::lock_guard<std::mutex> lock(mu_);
  StreamId id = next_stream_++;
  streams_.insert(id);
  return id;
}

void InlineStreams::destroy(StreamId stream) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(stream);
}

bool InlineStreams::has(StreamId stream) const {
  if (stream == kDefaultStream) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return streams_.count(stream) != 0;
}

EventHandle InlineStreams::record(StreamId) {
  std::lock_guard<std::mutex> lock(mu_);
  EventHandle e = next_event_++;
  events_.insert(e);
  return e;
}

bool InlineStreams::has_event(EventHandle event) const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.count(event) != 0;
}

void InlineStreams::release(EventHandle event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.erase(event);
}

std::size_t InlineStreams::live_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

}  // namespace memfit::cpu
