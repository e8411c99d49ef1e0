#include "core/cpu/worker_streams.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "memory/check.h"
#include "memory/error.h"

namespace memfit::cpu {

struct WorkerStreams::Stream {
  explicit Stream(StreamId i) : id(i) {}
  const StreamId id;
  std::mutex mu;
  std::condition_variable work_cv;  // the worker: an op arrived, or stop
  std::condition_variable done_cv;  // waiters: `completed` grew
  std::deque<std::function<void()>> queue;
  std::uint64_t enqueued = 0;   // ops ever queued
  std::uint64_t completed = 0;  // ops finished (a throwing op counts: it is over)
  std::exception_ptr error;     // the first uncollected op failure
  bool stopping = false;
  std::thread thread;
};

WorkerStreams::WorkerStreams(bool workers) : workers_(workers) {}

WorkerStreams::~WorkerStreams() {
  std::unordered_map<StreamId, std::shared_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    streams.swap(streams_);
  }
  for (auto& [id, s] : streams) {
    if (!s) continue;
    stop(*s);
    if (s->error) {
      std::fprintf(stderr,
                   "memfit: cpu worker stream %llu: an op failed and nobody synchronized the "
                   "stream before the backend was destroyed; the error is dropped\n",
                   static_cast<unsigned long long>(id));
    }
  }
}

void WorkerStreams::run(Stream* s) {
  for (;;) {
    std::function<void()> op;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->work_cv.wait(lock, [s] { return s->stopping || !s->queue.empty(); });
      if (s->queue.empty()) return;  // stopping, and drained
      op = std::move(s->queue.front());
      s->queue.pop_front();
    }
    std::exception_ptr failed;
    try {
      op();
    } catch (...) {
      failed = std::current_exception();
    }
    op = nullptr;  // captured views and handles go before the op counts as complete
    {
      std::lock_guard<std::mutex> lock(s->mu);
      ++s->completed;
      // Handed over (or dropped) under the lock: the thread that collects the error then owns
      // the last reference, and the worker never touches the exception again.
      if (failed && !s->error) s->error = std::move(failed);
      failed = nullptr;
    }
    s->done_cv.notify_all();
  }
}

void WorkerStreams::stop(Stream& s) {
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stopping = true;
  }
  s.work_cv.notify_one();
  if (s.thread.joinable()) s.thread.join();
}

void WorkerStreams::wait_done(Stream& s, std::uint64_t target) {
  std::unique_lock<std::mutex> lock(s.mu);
  s.done_cv.wait(lock, [&] { return s.completed >= target; });
}

void WorkerStreams::rethrow(std::exception_ptr error, StreamId stream) {
  try {
    std::rethrow_exception(std::move(error));
  } catch (const Error&) {
    throw;
  } catch (const CheckFailure&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckFailure("cpu worker stream " + std::to_string(stream) +
                       ": an op threw: " + e.what());
  } catch (...) {
    throw CheckFailure("cpu worker stream " + std::to_string(stream) +
                       ": an op threw a non-standard exception");
  }
}

void WorkerStreams::take_error(Stream& s, StreamId stream) {
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    e = std::exchange(s.error, nullptr);
  }
  if (e) rethrow(std::move(e), stream);
}

std::shared_ptr<WorkerStreams::Stream> WorkerStreams::find(StreamId stream) const {
  if (runs_inline(stream)) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(stream);
  MEMFIT_CHECK(it != streams_.end()) << "stream " << stream << " is not live";
  return it->second;
}

StreamId WorkerStreams::create() {
  std::shared_ptr<Stream> s;
  StreamId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_stream_++;
    if (workers_) s = std::make_shared<Stream>(id);
    streams_.emplace(id, s);
  }
  if (s) {
    try {
      s->thread = std::thread(&WorkerStreams::run, s.get());
    } catch (...) {  // std::system_error: no thread to be had; the id never escapes
      std::lock_guard<std::mutex> lock(mu_);
      streams_.erase(id);
      throw;
    }
  }
  return id;
}

void WorkerStreams::destroy(StreamId stream) {
  std::shared_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = streams_.find(stream);
    if (it == streams_.end()) return;
    s = std::move(it->second);
    streams_.erase(it);
  }
  if (!s) return;
  stop(*s);  // runs what is queued, then joins
  take_error(*s, stream);
}

bool WorkerStreams::has(StreamId stream) const {
  if (stream == kDefaultStream) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return streams_.count(stream) != 0;
}

void WorkerStreams::enqueue(StreamId stream, std::function<void()> op) {
  std::shared_ptr<Stream> s = find(stream);
  MEMFIT_CHECK(s != nullptr) << "enqueue on inline stream " << stream;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->queue.push_back(std::move(op));
    ++s->enqueued;
  }
  s->work_cv.notify_one();
}

void WorkerStreams::synchronize(StreamId stream) {
  std::shared_ptr<Stream> s = find(stream);
  if (!s) return;
  std::uint64_t target;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    target = s->enqueued;
  }
  wait_done(*s, target);
  take_error(*s, stream);
}

void WorkerStreams::drain_all() {
  std::vector<std::shared_ptr<Stream>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, s] : streams_) {
      if (s) all.push_back(s);
    }
  }
  for (auto& s : all) {
    std::uint64_t target;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      target = s->enqueued;
    }
    wait_done(*s, target);
  }
}

EventHandle WorkerStreams::record(StreamId stream) {
  Event ev;
  ev.stream = find(stream);
  if (ev.stream) {
    std::lock_guard<std::mutex> lock(ev.stream->mu);
    ev.target = ev.stream->enqueued;
  }
  std::lock_guard<std::mutex> lock(mu_);
  EventHandle e = next_event_++;
  events_.emplace(e, std::move(ev));
  return e;
}

bool WorkerStreams::has_event(EventHandle event) const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.count(event) != 0;
}

bool WorkerStreams::query(EventHandle event) {
  Event ev;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = events_.find(event);
    MEMFIT_CHECK(it != events_.end()) << "event " << event << " is not live";
    ev = it->second;
  }
  if (!ev.stream) return true;
  std::lock_guard<std::mutex> lock(ev.stream->mu);
  return ev.stream->completed >= ev.target;
}

void WorkerStreams::synchronize_event(EventHandle event) {
  Event ev;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = events_.find(event);
    MEMFIT_CHECK(it != events_.end()) << "event " << event << " is not live";
    ev = it->second;
  }
  if (!ev.stream) return;
  wait_done(*ev.stream, ev.target);
  take_error(*ev.stream, ev.stream->id);
}

void WorkerStreams::wait(StreamId stream, EventHandle event) {
  Event ev;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = events_.find(event);
    MEMFIT_CHECK(it != events_.end()) << "event " << event << " is not live";
    ev = it->second;
  }
  if (!ev.stream || ev.stream->id == stream) return;  // complete, or ordered already
  if (runs_inline(stream)) {
    wait_done(*ev.stream, ev.target);
    return;
  }
  // The waiting op holds the event's stream alive, so a destroy of that stream cannot leave it
  // waiting on freed state; the event handle itself may be released at once, as on CUDA.
  std::shared_ptr<Stream> src = std::move(ev.stream);
  const std::uint64_t target = ev.target;
  enqueue(stream, [src, target] { wait_done(*src, target); });
}

void WorkerStreams::release(EventHandle event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.erase(event);
}

std::size_t WorkerStreams::live_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

}  // namespace memfit::cpu
