// StageOverlap: a backward stage's collectives run beside the next stage's compute (the
// gradient reduction a data-parallel step overlaps with its backward, as PyTorch DDP's buckets
// and DeepSpeed ZeRO's reduce buckets do). Depth one: the collectives started after stage s are
// finished after stage s + 1, and after the last stage everything is.
//
//   StageOverlap ov(comm, /*on=*/true);
//   // after backward stage s: start its sums, then say what waits for them
//   Communicator::Ticket t = comm.start_reduce_scatter_sum(stream, grad, shard);
//   ov.stage_done(stream, t, [&] { grad.reset(); }, /*last_stage=*/s + 1 == stages);
//
// stage_done(stream, ticket, then, last): queues `then` to run once the collectives started up
// to `ticket` are finished (Communicator::finish), then finishes and runs every queued entry
// but this one, or all of them after the last stage. With `on` false each entry finishes and
// runs at once. `then` is what must wait for the sums: hand back a lent gradient, add a
// received sum into a shard, send a reduced chunk to the host.
// Where an entry finishes depends only on the stage and `on`, never on the communicator or
// the timing, so a dry run (whose simulated collectives finish at once) frees and allocates
// in the order the real run does: the memory held one stage longer is predicted exactly.
// abandon(stream): a step that failed part-way: finishes every collective the communicator
// started (their memory is in use until then), ignoring their errors, and drops the queued
// `then`s. The destructor abandons what is still queued.
// Not thread-safe; an entry's `then` may throw (the entry is gone; later ones stay queued).
#pragma once

#include <deque>
#include <functional>

#include "core/comm/communicator.h"

namespace memfit {

class StageOverlap {
 public:
  StageOverlap(Communicator& comm, bool on) : comm_(comm), on_(on) {}
  ~StageOverlap();
  StageOverlap(const StageOverlap&) = delete;
  StageOverlap& operator=(const StageOverlap&) = delete;

  void stage_done(StreamId stream, Communicator::Ticket ticket, std::function<void()> then,
                  bool last_stage);
  void finish_all(StreamId stream);  // every queued entry, oldest first
  void abandon(StreamId stream);
  bool idle() const { return queue_.empty(); }
  bool on() const { return on_; }
  void set_on(bool on);  // while idle (CheckFailure otherwise)

 private:
  struct Entry {
    Communicator::Ticket ticket;
    std::function<void()> then;
  };
  void finish_front(StreamId stream);

  Communicator& comm_;
  bool on_;
  std::deque<Entry> queue_;
};

}  // namespace memfit
