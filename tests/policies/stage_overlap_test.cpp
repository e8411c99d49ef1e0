// StageOverlap (policies/stage_overlap.h): each stage's collectives are finished, and what
// waits for them runs, after the next stage (depth one), everything after the last stage, at
// once when off; abandon() finishes every started collective and runs nothing queued.
#include "policies/stage_overlap.h"

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "memory/check.h"
#include "memory/error.h"

namespace memfit {
namespace {

// A communicator that records which tickets were finished, in order.
class Recording final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const char* name() const override { return "recording"; }
  void all_reduce_sum(StreamId, const Tensor&) override {}
  void reduce_scatter_sum(StreamId, const Tensor&, const Tensor&) override {}
  void all_gather(StreamId, const Tensor&, const Tensor&) override {}
  void broadcast(StreamId, const Tensor&, int) override {}
  void barrier() override {}
  void finish(StreamId stream, Ticket t) override {
    Communicator::finish(stream, t);  // refuses a ticket not started
    finished.push_back(t);
  }
  Ticket start() {
    float x = 0;
    return start_all_reduce_sum(kDefaultStream, Tensor(&x, Shape{1}, DType::kF32, Device::kCpu));
  }
  std::vector<Ticket> finished;
};

TEST(StageOverlap, EachStageFinishesAfterTheNextAndAllAfterTheLast) {
  Recording comm;
  StageOverlap ov(comm, /*on=*/true);
  std::vector<std::string> ran;
  for (int s = 0; s < 4; ++s) {
    const Communicator::Ticket t = comm.start();
    ov.stage_done(
        kDefaultStream, t, [&ran, s] { ran.push_back("then " + std::to_string(s)); }, s == 3);
    ran.push_back("after stage " + std::to_string(s));
  }
  const std::vector<std::string> want = {"after stage 0", "then 0",        "after stage 1",
                                         "then 1",        "after stage 2", "then 2",
                                         "then 3",        "after stage 3"};
  EXPECT_EQ(ran, want);
  EXPECT_EQ(comm.finished, (std::vector<Communicator::Ticket>{1, 2, 3, 4}));
  EXPECT_TRUE(ov.idle());
}

TEST(StageOverlap, OffFinishesEachStageAtOnceAndTicketZeroWaitsForNothing) {
  Recording comm;
  StageOverlap ov(comm, /*on=*/false);
  int ran = 0;
  ov.stage_done(
      kDefaultStream, comm.start(), [&] { ++ran; }, false);
  EXPECT_EQ(ran, 1);
  ov.stage_done(
      kDefaultStream, 0, [&] { ++ran; }, false);  // a stage with nothing to sum
  EXPECT_EQ(ran, 2);
  EXPECT_EQ(comm.finished, (std::vector<Communicator::Ticket>{1}));
  ov.set_on(true);
  ov.stage_done(
      kDefaultStream, comm.start(), [&] { ++ran; }, false);
  EXPECT_EQ(ran, 2);                             // queued now
  EXPECT_THROW(ov.set_on(false), CheckFailure);  // sums in flight
  ov.finish_all(kDefaultStream);
  EXPECT_EQ(ran, 3);
}

// What a queued entry holds (a received sum's temporary) goes only after the collectives that
// write it are finished.
TEST(StageOverlap, AbandonFreesWhatTheEntriesHoldOnlyAfterFinishing) {
  struct Held {
    Recording* comm;
    std::size_t* finished_when_freed;
    ~Held() { *finished_when_freed = comm->finished.size(); }
  };
  Recording comm;
  std::size_t finished_when_freed = 99;
  StageOverlap ov(comm, /*on=*/true);
  auto held = std::make_shared<Held>(Held{&comm, &finished_when_freed});
  ov.stage_done(
      kDefaultStream, comm.start(), [held] {}, false);
  held.reset();  // the entry's `then` holds the only reference now
  ov.abandon(kDefaultStream);
  EXPECT_EQ(finished_when_freed, 1u);  // freed after finish(1), not before
}

TEST(StageOverlap, AbandonFinishesEveryStartedCollectiveAndRunsNothingQueued) {
  Recording comm;
  int ran = 0;
  {
    StageOverlap ov(comm, /*on=*/true);
    ov.stage_done(
        kDefaultStream, comm.start(), [&] { ++ran; }, false);
    comm.start();  // started, not yet handed to stage_done (the step failed in between)
    ov.abandon(kDefaultStream);
    EXPECT_TRUE(ov.idle());
    EXPECT_EQ(comm.finished, (std::vector<Communicator::Ticket>{2}));  // covers 1
    ov.stage_done(
        kDefaultStream, comm.start(), [&] { ++ran; }, false);
  }  // the destructor abandons what is queued
  EXPECT_EQ(ran, 0);
  EXPECT_EQ(comm.finished, (std::vector<Communicator::Ticket>{2, 3}));
}

TEST(StageOverlap, AThenThatThrowsLeavesTheLaterEntriesQueued) {
  Recording comm;
  StageOverlap ov(comm, /*on=*/true);
  int ran = 0;
  ov.stage_done(
      kDefaultStream, comm.start(), [] { throw std::runtime_error("oom"); }, false);
  EXPECT_THROW(ov.stage_done(
                   kDefaultStream, comm.start(), [&] { ++ran; }, false),
               std::runtime_error);
  EXPECT_FALSE(ov.idle());
  ov.finish_all(kDefaultStream);
  EXPECT_EQ(ran, 1);
}

TEST(StageOverlap, AFinishOfATicketNotStartedIsRefused) {
  Recording comm;
  StageOverlap ov(comm, /*on=*/false);
  EXPECT_THROW(ov.stage_done(
                   kDefaultStream, 7, [] {}, false),
               InvalidArgument);
}

}  // namespace
}  // namespace memfit
