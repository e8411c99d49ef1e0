#include "policies/stage_overlap.h"

#include <utility>

#include "memory/check.h"

namespace memfit {

StageOverlap::~StageOverlap() {
  if (!queue_.empty()) abandon(kDefaultStream);  // ignores the sums' errors; never throws
}

void StageOverlap::finish_front(StreamId stream) {
  Entry e = std::move(queue_.front());
  queue_.pop_front();
  if (e.ticket != 0) comm_.finish(stream, e.ticket);
  if (e.then) e.then();
}

void StageOverlap::stage_done(StreamId stream, Communicator::Ticket ticket,
                              std::function<void()> then, bool last_stage) {
  queue_.push_back({ticket, std::move(then)});
  const std::size_t keep = on_ && !last_stage ? 1 : 0;
  while (queue_.size() > keep) finish_front(stream);
}

void StageOverlap::set_on(bool on) {
  MEMFIT_CHECK(queue_.empty()) << "StageOverlap::set_on with sums in flight";
  on_ = on;
}

void StageOverlap::finish_all(StreamId stream) {
  while (!queue_.empty()) finish_front(stream);
}

void StageOverlap::abandon(StreamId stream) {
  // The queued entries hold what the collectives use (a received sum's temporary): they go
  // only once every collective started so far, those not yet queued here too, is finished.
  std::deque<Entry> drop;
  drop.swap(queue_);
  if (comm_.last_ticket() == 0) return;
  try {
    comm_.finish(stream, comm_.last_ticket());
  } catch (...) {  // the step's own error is the one to report
  }
}

}  // namespace memfit
